# SPDX-License-Identifier: Apache-2.0
"""Python from the controller's module_utils, written to a host by the config_files module in the same call.

The module writes the files its task gives it. In front of it, this action reads the task's packages: import names
(gpu_switch, gpu_switch.holders, pve_api) found where Ansible finds a module's module_utils imports (the
module_utils path of ansible.cfg, a role's module_utils/, then Ansible's own), never a path that a role builds
from role_path. Their files become the first of the task's files, under package_dir at their import path, and the
directory of each top-level package named becomes a directory that the module prunes of the Python the task no
longer ships. The module compares, writes, prunes and reports, in check and diff mode too. A task without packages
goes to the module unchanged.
"""

from __future__ import annotations

import os
import re

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import module_utils_loader

OWN = ("packages", "package_dir", "package_mode")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
MODE = re.compile(r"^0?[0-7]{3,4}$")
DIRECTORY_MODE = "0755"
# Directories of a package tree that hold no source of it.
SKIPPED = ("__pycache__",)


class Refused(ValueError):
    """Packages the action will not hand to the module; nothing has changed when it is raised."""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        own = {name: args.pop(name, None) for name in OWN}
        if own["packages"]:
            try:
                args = with_packages(args, own, search_path())
            except Refused as err:
                raise AnsibleActionFail(f"config_files changed nothing: {err}") from None
        result.update(self._execute_module(module_name="config_files", module_args=args, task_vars=task_vars))
        return result


def search_path():
    """The directories Ansible searches for a module's module_utils imports, in its order."""
    return [path for path in module_utils_loader._get_paths(subdirs=False) if os.path.isdir(path)]


def with_packages(args, own, roots):
    """The module's arguments with the packages' directories and files first."""
    names = own["packages"]
    if isinstance(names, str):
        names = [part.strip() for part in names.split(",") if part.strip()]
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise Refused(f"packages: given {names!r}; expected a list of import names such as [gpu_switch, pve_api]")
    base = own["package_dir"]
    if not isinstance(base, str) or not os.path.isabs(base):
        raise Refused(
            f"package_dir: given {base!r}; expected the absolute path of the directory that holds packages on the "
            "host, such as /usr/local/lib/inferhost"
        )
    base = os.path.normpath(base)
    mode = "0644" if own["package_mode"] is None else str(own["package_mode"]).strip()
    if not MODE.match(mode):
        raise Refused(f"package_mode: given {own['package_mode']!r}; expected an octal mode such as 0644")
    shipped, pruned = {}, []
    for index, name in enumerate(names):
        if not NAME.match(name):
            raise Refused(f"packages[{index}]: given {name!r}; expected an import name such as gpu_switch.holders")
        if names.index(name) != index:
            raise Refused(f"packages[{index}]: {name} is given twice")
        root, relatives = find(name, roots, index)
        for relative in relatives:
            if relative in shipped:
                raise Refused(f"packages[{index}]: {name} ships {relative}, which {shipped[relative][0]} ships too")
            shipped[relative] = (name, os.path.join(root, relative))
        top = name.split(".")[0]
        if "." in name or relatives != [f"{top}.py"]:  # a package, or a module in one: its tree is the task's
            pruned.append(os.path.join(base, top))
    given = args.get("directories") or []
    if not isinstance(given, list):
        raise Refused(f"directories: given {given!r}; expected a list of mappings")
    taken = {os.path.normpath(entry["path"]) for entry in given if isinstance(entry, dict) and entry.get("path")}
    clash = sorted(taken & set(pruned))
    if clash:
        raise Refused(f"directories lists {clash[0]}, the directory of a package of packages: leave it to packages")
    folders = sorted({base} | {os.path.dirname(os.path.join(base, relative)) for relative in shipped})
    directories = [
        {"path": path, "mode": DIRECTORY_MODE, **({"prune": "*.py"} if path in pruned else {})}
        for path in folders
        if path not in taken
    ]
    files = [
        {"dest": os.path.join(base, relative), "content": read(source, name), "mode": mode, "backup": False}
        for relative, (name, source) in sorted(shipped.items())
    ]
    return {**args, "directories": directories + given, "files": files + list(args.get("files") or [])}


def find(name, roots, index):
    """(the root that has name, the paths of its files relative to that root), as Python and Ansible look: a
    package (a directory with __init__.py), then a module, then a directory without __init__.py."""
    parts = name.split(".")
    for root in roots:
        path = os.path.join(root, *parts)
        if os.path.isfile(os.path.join(path, "__init__.py")):
            return root, tree(root, path, name, index)
        if os.path.isfile(f"{path}.py"):
            return root, [os.path.relpath(f"{path}.py", root)]
        if os.path.isdir(path):
            return root, tree(root, path, name, index)
    raise Refused(
        f"packages[{index}]: {name} is no module or package on Ansible's module_utils path ({', '.join(roots)}); "
        "expected the import name of one, such as gpu_switch"
    )


def tree(root, path, name, index):
    """The *.py files of a package directory and below, relative to root."""
    found = []
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED and not d.startswith("."))
        found += [os.path.relpath(os.path.join(folder, f), root) for f in sorted(files) if f.endswith(".py")]
    if not found:
        raise Refused(f"packages[{index}]: {name} ({path}) has no .py file")
    return found


def read(source, name):
    try:
        with open(source, "rb") as handle:
            return handle.read().decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(f"packages: {source} of {name} is not UTF-8 text") from None
    except OSError as err:
        raise Refused(f"packages: {source} of {name} cannot be read: {err.strerror}") from None
