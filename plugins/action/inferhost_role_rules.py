# SPDX-License-Identifier: Apache-2.0
"""Check the variables of the role this task belongs to against the role's value rules (meta/rules.yml).

The rules are the ones the controller's preflight (playbooks/preflight.yml) runs before any play changes a
machine; this action runs them again inside the role, so that a role run alone (from another playbook, or
taken from the project into someone else's) refuses a bad value before its first change. It reaches no host.
"""

from __future__ import annotations

import os
import sys

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

_PLUGIN_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugin_utils")
if _PLUGIN_UTILS not in sys.path:
    sys.path.insert(0, _PLUGIN_UTILS)
from preflight import inventory, rules  # noqa: E402

DOCUMENTATION = r"""
module: inferhost_role_rules
short_description: Check a role's variables against its value rules
description:
  - Reads C(meta/rules.yml) of the role the task belongs to and refuses, before any change, every value its
    rules refuse, naming the variable (with the entry's index inside a list), what was given, what is
    expected and a line to write.
  - The controller's preflight runs the same rules over the whole inventory first (C(playbooks/preflight.yml)).
options:
  role_path:
    description: The role whose rules apply; by default the role of the task.
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(("role_path",))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        role_path = self._task.args.get("role_path") or getattr(getattr(self._task, "_role", None), "_role_path", None)
        if not role_path:
            return {**result, "failed": True, "msg": "inferhost_role_rules runs inside a role (or is given role_path)"}
        try:
            role_rules = inventory.load_rules(role_path)
        except ValueError as exc:
            return {**result, "failed": True, "msg": f"The role's rules cannot be read: {exc}"}

        role = os.path.basename(os.path.normpath(role_path))

        def get(name):
            if name not in task_vars:
                return rules.UNSET
            try:
                return self._templar.template(task_vars[name])
            except AnsibleError as exc:
                if not name.startswith(f"{role}_"):
                    return rules.UNSET  # another role's data, which a rule only compares with: not known here
                raise AnsibleError(f"{name}: its template cannot be rendered: {exc}") from None

        refusals = rules.evaluate(role_rules, get)
        result["changed"] = False
        if refusals:
            lines = rules.report(refusals, inventory.show)
            count = f"{len(lines)} value{'s' if len(lines) != 1 else ''}"
            result["failed"] = True
            result["msg"] = f"Role {role} refuses {count}; nothing was changed:\n" + "\n".join(f"- {x}" for x in lines)
            result["refused"] = [r.variable for r in refusals]
        else:
            result["msg"] = f"Role {role}: every value passes its {len(role_rules)} rules."
        return result
