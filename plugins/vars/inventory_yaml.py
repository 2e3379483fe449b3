# SPDX-License-Identifier: Apache-2.0
"""Refuse an inventory whose YAML is broken, naming the file, the line and the column.

Ansible's own reader reports a broken group_vars or host_vars file as "YAML parsing failed" with neither the
file nor the line, and only when a play first reads that group's variables (possibly after whole plays have
run). This plugin runs first among the vars plugins (ansible.cfg, vars_plugins_enabled), when Ansible first
reads any inventory directory's variables, and parses every YAML file of that directory (the hosts files,
group_vars/ and host_vars/) itself.
"""

from __future__ import annotations

import os
import sys

from ansible.errors import AnsibleParserError
from ansible.plugins.vars import BaseVarsPlugin

# The reader lives with the controller's preflight code (plugins/plugin_utils/preflight).
_PLUGIN_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugin_utils")
if _PLUGIN_UTILS not in sys.path:
    sys.path.insert(0, _PLUGIN_UTILS)
from preflight import inventory as inventory_files  # noqa: E402

DOCUMENTATION = r"""
name: inventory_yaml
short_description: Refuse broken YAML in an inventory directory, naming the file and the line
description:
  - Parses every YAML file of an inventory directory (hosts files, group_vars/, host_vars/) once per run and
    raises an error naming each broken file with its line and column.
  - Returns no variables.
options:
  stage:
    ini:
      - key: stage
        section: vars_inventory_yaml
    env:
      - name: ANSIBLE_VARS_PLUGIN_STAGE
extends_documentation_fragment:
  - vars_plugin_staging
"""

_CHECKED = set()


class VarsModule(BaseVarsPlugin):
    REQUIRES_ENABLED = True
    is_stateless = True

    def get_vars(self, loader, path, entities, cache=True):
        super().get_vars(loader, path, entities)
        path = os.path.abspath(path)
        if path in _CHECKED:
            return {}
        _CHECKED.add(path)
        if not any(os.path.isdir(os.path.join(path, kind)) for kind in ("group_vars", "host_vars")):
            return {}
        errors = inventory_files.yaml_errors([path])
        if errors:
            raise AnsibleParserError("The inventory's YAML is broken; nothing was run:\n" + "\n".join(errors))
        return {}
