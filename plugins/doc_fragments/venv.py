# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
"""The option of the modules that read a virtual environment, as plugins/module_utils/python_env/records.py's
VENV_OPTIONS takes it (venv_audit, venv_abi_guard)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  path:
    description: Root of the virtual environment (the directory that holds C(bin/python)).
    type: path
    required: true
"""
