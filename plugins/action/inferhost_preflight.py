# SPDX-License-Identifier: Apache-2.0
"""Check the inventory of every host a run will touch, on the controller, before any change.

One call does it all (playbooks/preflight.yml): for each host, the argument specs of the roles it will run,
applied to its variables; every variable with a role's or the project's prefix that nothing declares; and the
value rules of those roles (roles/<role>/meta/rules.yml, which each role's own preflight runs too), and the
cross-checks between hosts (plugins/plugin_utils/preflight/). Nothing is sent to any host: the
variables come from the controller's own view of the inventory (hostvars, with cached facts when there are).
The refusal names, for each problem, the file, the variable, what was given, what is expected and one fix;
secret values are never shown.
"""

from __future__ import annotations

import os
import sys

from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

_PLUGINS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Controller code (plugin_utils) and the inference plan it shares with the role's module (module_utils).
for _folder in ("module_utils", "plugin_utils"):
    if os.path.join(_PLUGINS, _folder) not in sys.path:
        sys.path.insert(0, os.path.join(_PLUGINS, _folder))
from preflight import checks, inventory  # noqa: E402


def _plain(value):
    """The value with every nested template rendered now, so that a failure surfaces here, named."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def validate(options, params):
    """Ansible's own argument spec validation (what validate_argument_spec runs), as (option, message) pairs."""
    result = ArgumentSpecValidator(options).validate(params)
    out = []
    for error in result.errors:
        message = error.error_message if hasattr(error, "error_message") else str(error)
        named = [name for name in options if f"'{name}'" in message or f" {name}" in message]
        out.append((named[0] if named else sorted(params)[0], message))
    return out


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(("hosts", "roles", "provided"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        hostvars = task_vars["hostvars"]
        targets = list(args.get("hosts") or [])
        by_group = dict(args.get("roles") or {})

        dirs = inventory.inventory_dirs(task_vars.get("ansible_inventory_sources"))
        broken = inventory.yaml_errors(dirs)
        if broken:
            return {**result, "failed": True, "msg": "The inventory's YAML is broken:\n" + "\n".join(broken)}

        specs, declared, rules = {}, set(), {}
        try:
            for role in inventory.role_names():
                role_dir = os.path.join(inventory.ROLES_DIR, role)
                specs[role], names = inventory.load_role(role_dir)
                declared |= names
                rules[role] = inventory.load_rules(role_dir)
        except ValueError as exc:
            return {**result, "failed": True, "msg": f"A role's rules cannot be read: {exc}"}
        views, roles = {}, {}
        for host in task_vars["groups"].get("all", []):
            # The host's variables as its own tasks see them (hostvars included), templated on demand.
            host_vars = {**hostvars.raw_get(host), "hostvars": hostvars}
            templar = self._templar.copy_with_new_env(available_variables=host_vars)
            groups = list(host_vars.get("group_names") or [])

            def get(name, host_vars=host_vars, templar=templar):
                try:
                    return _plain(templar.template(host_vars[name]))
                except AnsibleError as exc:
                    raise inventory.TemplateFailure(getattr(exc, "message", None) or str(exc)) from None

            raw = lambda n, v=host_vars: v.get(n, "")  # noqa: E731 - the value as written
            views[host] = inventory.HostView(host, list(host_vars), get, groups, raw=raw)
            roles[host] = [r for g in ["all", *groups] for r in by_group.get(g, [])]

        checker = checks.Checker(
            views,
            targets,
            roles,
            specs,
            declared,
            provided=args.get("provided") or [],
            files=inventory.VariableFiles(dirs),
            validator=validate,
            rules=rules,
            wiring=inventory.load_wiring(),
        )
        problems = checker.run()
        result["changed"] = False
        if problems:
            result["failed"] = True
            result["msg"] = checks.report(problems)
        else:
            result["msg"] = f"The inventory of {', '.join(checker.targets)} is consistent."
        return result
