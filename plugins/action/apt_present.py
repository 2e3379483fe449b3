# SPDX-License-Identifier: Apache-2.0
"""Install Debian packages with apt only when dpkg says that something is missing.

The module dpkg_installed asks dpkg on the target which of the specifications are not installed; only then is
ansible.builtin.apt called, with the same list and options, and its result is the task's. A converge with
nothing to install so costs one quick module call instead of apt opening its whole cache (two to four seconds a
task on every run).

In check mode a package apt does not know is reported as one the run would install (changed, with a message
naming it), not as a failure: on a fresh guest the repository that provides it is added by an earlier task,
which a check run does not do. A real run still fails on it, and its message ends with source_hint (what the
caller knows about where the package comes from) when the task gives one.

With hold, the named packages are then held (dpkg's selection "hold", as apt-mark hold sets it): the same dpkg
query tells which are held already, so a converge where they are costs no further call.
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

APT_OPTIONS = ("install_recommends", "allow_change_held_packages", "allow_downgrade")
# ansible.builtin.apt's words for a name (or a pattern) that no configured source provides.
UNKNOWN = re.compile(r"^No package(?:\(s\))? matching '(?P<name>[^']*)' (?:is )?available")
# apt-get's words for a package it knows of but that no configured source provides now ("Candidate: (none)").
NO_CANDIDATE = re.compile(r"Package '(?P<name>[^']*)' has no installation candidate")


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(("name", "hold", "source_hint", *APT_OPTIONS))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        names = args.get("name")
        if isinstance(names, str):
            names = [part for part in names.split(",") if part.strip()]
        if not names:
            raise AnsibleActionFail("apt_present needs name: the packages to install")
        hold = args.get("hold") or []
        stray = sorted(set(hold) - {package(spec) for spec in names})
        if stray:
            raise AnsibleActionFail(f"apt_present's hold names packages that name does not install: {', '.join(stray)}")
        query = self._execute_module(module_name="dpkg_installed", module_args={"name": names}, task_vars=task_vars)
        if query.get("failed"):
            return {**result, **query}
        to_hold = [name for name in hold if name not in query.get("held", [])]
        missing = query.get("missing", [])
        if not missing:
            result.update(changed=False, missing=[], installed=query.get("installed", {}), msg="all installed")
            return self._hold(result, to_hold, task_vars)
        apt_args = {"name": names, "state": "present", **{k: args[k] for k in APT_OPTIONS if args.get(k) is not None}}
        installed = self._execute_module(module_name="ansible.builtin.apt", module_args=apt_args, task_vars=task_vars)
        unknown = UNKNOWN.match(str(installed.get("msg", ""))) if installed.get("failed") else None
        if unknown and self._task.check_mode:
            result.update(
                changed=True,
                missing=missing,
                unknown=[unknown.group("name")],
                msg=(
                    f"check mode: would install {', '.join(missing)}. apt knows no package matching "
                    f"'{unknown.group('name')}' yet: its repository is one that the run adds and a check run does "
                    "not (a real run fails if no configured source provides it)"
                ),
            )
            return result
        result.update(installed)
        result.update(missing=missing)
        if result.get("failed"):
            if args.get("source_hint") and (unknown or NO_CANDIDATE.search(_apt_output(installed))):
                result["msg"] = f"{str(result.get('msg', '')).rstrip('.')}. {args['source_hint']}"
            return result
        # apt may take the hold off a held package that it replaces (allow_change_held_packages): after an
        # install every one is held again, and a check run counts the ones it would replace.
        replaced = {package(spec) for spec in missing}
        if self._task.check_mode:
            return self._hold(result, [name for name in hold if name in to_hold or name in replaced], task_vars)
        return self._hold(result, hold, task_vars)

    def _hold(self, result, names, task_vars):
        """Hold the packages of names (a check run only says so); held: those whose selection this changed."""
        held = list(names) if self._task.check_mode else []
        for name in [] if self._task.check_mode else names:
            done = self._execute_module(
                module_name="ansible.builtin.dpkg_selections",
                module_args={"name": name, "selection": "hold"},
                task_vars=task_vars,
            )
            if done.get("failed"):
                return {**result, **done}
            if done.get("changed"):
                held.append(name)
        result["held"] = held
        if not held:
            return result
        result["changed"] = True
        if self._task.diff:
            result["diff"] = [
                *_as_list(result.get("diff")),
                {
                    "before_header": "dpkg selections",
                    "after_header": "dpkg selections",
                    "before": "".join(f"{name} install\n" for name in held),
                    "after": "".join(f"{name} hold\n" for name in held),
                },
            ]
        return result


def package(spec):
    """The package name of an apt specification: name[:arch][=version]."""
    return spec.split("=")[0].split(":")[0].strip()


def _apt_output(result):
    return "\n".join(str(result.get(key, "")) for key in ("msg", "stderr", "stdout"))


def _as_list(diff):
    return diff if isinstance(diff, list) else [diff] if diff else []
