# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
"""The options of the modules that talk to an inference service (plugins/module_utils/inference/client.py)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  url:
    description: Base URL of the service, for example C(http://127.0.0.1:8000).
    type: str
    required: true
  model:
    description: The served model name, as C(/v1/models) lists it.
    type: str
    required: true
  secret_file:
    description:
      - The unit's secret environment file on the target, with C(INFERHOST_API_KEY=...); the key is read there
        and never travels.
      - Missing or empty means no key.
    type: path
"""
