# SPDX-License-Identifier: Apache-2.0
"""Install Debian packages with apt only when dpkg says that something is missing.

The module dpkg_installed asks dpkg on the target which of the specifications are not installed; only then is
ansible.builtin.apt called, with the same list and options, and its result is the task's. A converge with
nothing to install so costs one quick module call instead of apt opening its whole cache (two to four seconds a
task on every run).
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

APT_OPTIONS = ("install_recommends", "allow_change_held_packages", "allow_downgrade")


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(("name", *APT_OPTIONS))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        names = args.get("name")
        if isinstance(names, str):
            names = [part for part in names.split(",") if part.strip()]
        if not names:
            raise AnsibleActionFail("apt_present needs name: the packages to install")
        query = self._execute_module(module_name="dpkg_installed", module_args={"name": names}, task_vars=task_vars)
        if query.get("failed"):
            return {**result, **query}
        missing = query.get("missing", [])
        if not missing:
            result.update(changed=False, missing=[], installed=query.get("installed", {}), msg="all installed")
            return result
        apt_args = {"name": names, "state": "present", **{k: args[k] for k in APT_OPTIONS if args.get(k) is not None}}
        installed = self._execute_module(module_name="ansible.builtin.apt", module_args=apt_args, task_vars=task_vars)
        result.update(installed)
        result.update(missing=missing)
        return result
