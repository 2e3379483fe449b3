#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
"""A set of directories and small files in one call.

M(ansible.builtin.template) and M(ansible.builtin.copy) cost two round trips to the host a file even when
nothing changes, M(ansible.builtin.file) one a directory. The roles render their files on the controller
(lookups) and hand them all to this module at once. Python that a role ships (a package the host imports) goes
the same way: the action in front of this module (plugins/action/config_files.py) reads it, by name, from the
controller's module_utils and adds it to the files, with what it no longer has pruned in the same call.
"""

from __future__ import annotations

import fnmatch
import grp
import os
import pwd
import re
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: config_files
short_description: Create directories and write small files, all in one task
description:
  - Creates the directories of O(directories), then writes the files of O(files), in the order given, with
    one round trip to the host for the whole set.
  - A file is changed when its bytes, mode, owner or group differ from the wanted ones. New content is written
    to a temporary file in the same directory and moved over the old file, so that no reader sees half a file.
    A file that differs only in its attributes has them set, and its content is not rewritten.
  - The content comes from the controller, usually from a lookup (C(ansible.builtin.template) for a role's
    template, C(ansible.builtin.file) with C(rstrip=false) for a role's file). It is written as given, in
    UTF-8.
  - All input is checked before anything changes. A relative path, a path given twice, an invalid mode, an
    unknown owner or group, a file whose directory neither exists nor is created by this task, or a path that
    exists as the wrong kind fails the task, naming the path, and leaves everything as it was. In check mode a
    file whose directory does not exist is reported as one the task would create, and an owner or group that
    does not exist as one the task would set, since an earlier task of the run may create them.
  - A symbolic link at a file's path is replaced by the file, as M(ansible.builtin.copy) does by default.
  - A directory with O(directories[].prune) is kept to what the task ships. After the files are written, every
    file in it or below it whose name matches the pattern and that O(files) does not list is removed (a module
    that an older release had must not stay importable), with Python's compiled copies of such a file, and
    every directory below it left empty by the pruning.
  - O(packages) installs Python from the controller's module_utils by its import name, as Ansible finds a
    module_utils import of a module (the C(module_utils) path of C(ansible.cfg), then Ansible's own). The action
    on the controller reads the files and adds them to O(files), before those the task gives, under
    O(package_dir).
options:
  directories:
    description:
      - Directories to create, with missing parents, before the files are written.
      - An existing directory gets the mode, owner and group. Missing parents are created with mode C(0755)
        and the same owner and group.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the directory.
        type: path
        required: true
      mode:
        description: Octal mode of the directory, as a string.
        type: str
        default: "0755"
      prune:
        description:
          - A file name pattern (C(*.py)). After the files are written, each file in the directory or below it
            whose name matches and that O(files) does not list is removed, without a backup (it is code the
            task ships, not configuration). Nothing is pruned when not given.
          - A compiled file in a C(__pycache__) directory (C(name.cpython-312.pyc)) goes with its source
            (C(name.py) in the directory above), removed when the pattern matches the source's name and O(files)
            does not list the source. A directory below this one (a C(__pycache__), a package an
            older release had) that the pruning leaves empty is removed too, unless O(directories) lists it.
            Nothing else is touched.
        type: str
  files:
    description: Files to write.
    type: list
    elements: dict
    default: []
    suboptions:
      dest:
        description: Absolute path of the file. Its directory must exist or be in O(directories).
        type: path
        required: true
      content:
        description: The whole content of the file.
        type: str
        required: true
      mode:
        description: Octal mode of the file, as a string; O(mode) when not given.
        type: str
      backup:
        description: Whether to keep the old content of this file (see O(backup)); O(backup) when not given.
        type: bool
  owner:
    description: Owner of every directory and file, a name or a numeric id.
    type: str
    default: root
  group:
    description: Group of every directory and file, a name or a numeric id.
    type: str
    default: root
  mode:
    description: Octal mode of the files that do not give their own, as a string.
    type: str
    default: "0644"
  backup:
    description:
      - Before a file's content is replaced, keep a copy of the old file beside it (the name
        M(ansible.builtin.template) uses for its backups). A change of attributes alone makes no backup.
    type: bool
    default: true
  packages:
    description:
      - Python to install from the controller, each by its import name under C(ansible.module_utils), found on
        Ansible's module_utils path, the first directory that has it winning, as for a module's import.
      - A package (C(gpu_switch)) brings every C(*.py) file of its tree, a module of a package
        (C(gpu_switch.holders)) that file alone, without the package's C(__init__.py), and a module of its own
        (C(pve_api)) its file.
      - Each is written at its import path under O(package_dir) (C(gpu_switch/pve.py)), with O(package_mode),
        no backup (a copy beside a module is code that could be imported), before the files of O(files).
      - The directory of each top-level package named (C(gpu_switch) for C(gpu_switch) or C(gpu_switch.holders))
        is created and pruned of C(*.py) files the task does not ship, as O(directories[].prune) does; a
        module of its own prunes nothing (O(package_dir) is shared).
      - A name that is not found, is given twice, or whose files another name ships too, is refused before
        anything changes. Read by the action on the controller; the module alone refuses it.
    type: list
    elements: str
    default: []
  package_dir:
    description:
      - The directory of the host that holds O(packages), the one its users put on Python's path. Created (with
        the packages' directories) with mode C(0755), unless O(directories) lists it. Required with O(packages).
    type: path
  package_mode:
    description: Octal mode of the files of O(packages), as a string.
    type: str
    default: "0644"
attributes:
  action:
    description: The action on the controller reads O(packages); the rest is the module's, on the host.
    support: full
  check_mode:
    description: Reports every directory and file it would change, and changes none.
    support: full
  diff_mode:
    description:
      - One entry a changed path. New or changed content is shown as text, with the path as both headers;
        changed attributes (and created directories) as before/after mappings of path, mode, owner and group;
        a pruned file as a mapping of its path and state.
      - A file whose content and attributes both change shows its content.
    support: full
author: inferhost contributors
"""

EXAMPLES = r"""
- name: install | Install the package and the command that runs it
  config_files:
    packages: [pve_api, gpu_switch]
    package_dir: /usr/local/lib/inferhost
    files:
      - dest: /usr/local/sbin/gpu-switch
        content: "{{ lookup('ansible.builtin.template', 'gpu-switch.j2') }}"
        mode: "0755"

- name: modules | Write the module configuration
  config_files:
    directories:
      - path: /etc/modprobe.d
    files:
      - dest: /etc/modprobe.d/inferhost-vfio.conf
        content: "{{ lookup('ansible.builtin.template', 'vfio-modules.conf.j2') }}"
      - dest: /usr/local/sbin/inferhost-helper
        content: "{{ lookup('ansible.builtin.file', 'inferhost-helper', rstrip=false) }}"
        mode: "0755"
  register: __pve_host_gpu_modules

- name: modules | Note a changed vfio file
  ansible.builtin.debug:
    msg: The vfio modules change at the next boot.
  when: __pve_host_gpu_modules.changed_paths is contains('/etc/modprobe.d/inferhost-vfio.conf')
"""

RETURN = r"""
changed_paths:
  description: Every directory (created parents included) and file that changed, or would change in check mode,
    in the order they were handled, the pruned files last.
  returned: always
  type: list
  elements: str
  sample: [/etc/modprobe.d, /etc/modprobe.d/inferhost-vfio.conf]
backups:
  description: Path of the backup of each file whose old content was kept, by the file's path.
  returned: always
  type: dict
  sample: {/etc/modprobe.d/inferhost-vfio.conf: /etc/modprobe.d/inferhost-vfio.conf.12345.2026-01-01@10:00:00~}
diff:
  description: One before/after entry a changed path (with C(--diff)).
  returned: when diff mode is on
  type: list
  elements: dict
"""

MODE = re.compile(r"^0?[0-7]{3,4}$")
# A prune pattern names files, not paths: a slash could reach outside the directory.
PRUNE = re.compile(r"^[^/]+$")


class Refused(ValueError):
    """Input that the module will not act on; nothing has changed when it is raised."""


def parse_mode(mode, path):
    text = str(mode).strip()
    if not MODE.match(text):
        raise Refused(f"{path}: mode {mode!r} is not an octal mode such as 0644")
    return int(text, 8)


def resolve_id(value, database, kind, check_mode=False):
    """uid or gid of a name or a numeric string. In check mode an unknown name stays a name: an earlier task of
    the run (a user or group it would create) may be the one that makes it, and every path is then reported
    as one whose owner or group would change."""
    if value.isdigit():
        return int(value)
    try:
        found = database(value)
    except KeyError:
        if check_mode:
            return value
        raise Refused(f"unknown {kind} {value!r}") from None
    return found[2]


def name_of(number, database):
    if isinstance(number, str):  # a name not known yet (check mode)
        return number
    try:
        return database(number)[0]
    except KeyError:
        return str(number)


def new_path(path, what, seen):
    """The normalised absolute path, refused when relative or given before; noted as given."""
    if not path or not os.path.isabs(path):
        raise Refused(f"{what} {path!r} is not an absolute path")
    path = os.path.normpath(path)
    if path in seen:
        raise Refused(f"{what} {path} is given twice (as a directory or a file)")
    seen.add(path)
    return path


def plan(params, check_mode=False):
    """The wanted directories and files, checked: (directories, files), each a list of dicts."""
    default_mode = parse_mode(params["mode"], "mode")
    directories, files, seen, planned = [], [], set(), set()
    for entry in params["directories"]:
        path = new_path(entry["path"], "directory", seen)
        if os.path.lexists(path) and not os.path.isdir(path):
            raise Refused(f"directory {path} exists and is not a directory")
        prune = entry.get("prune")
        if prune is not None and not PRUNE.match(prune):
            raise Refused(f"directory {path}: prune {prune!r} is not a file name pattern such as *.py")
        directories.append({"path": path, "mode": parse_mode(entry["mode"], path), "prune": prune})
        while path not in planned and path != os.path.dirname(path):  # it and the parents it creates
            planned.add(path)
            path = os.path.dirname(path)
    for entry in params["files"]:
        dest = new_path(entry["dest"], "file", seen)
        if os.path.isdir(dest) and not os.path.islink(dest):
            raise Refused(f"file {dest} exists and is a directory")
        parent = os.path.dirname(dest)
        # In check mode an earlier task of the run may be the one that creates the directory, so the file is
        # reported as one it would create, as ansible.builtin.copy reports it.
        if not os.path.isdir(parent) and parent not in planned and not check_mode:
            raise Refused(f"file {dest}: its directory {parent} does not exist and is not in directories")
        mode = default_mode if entry.get("mode") is None else parse_mode(entry["mode"], dest)
        content = entry["content"].encode("utf-8", errors="surrogateescape")
        backup = params["backup"] if entry.get("backup") is None else entry["backup"]
        files.append({"dest": dest, "mode": mode, "content": content, "backup": backup})
    return directories, files


def wanted_attributes(path, mode, uid, gid):
    return {
        "path": path,
        "mode": f"{mode:04o}",
        "owner": name_of(uid, pwd.getpwuid),
        "group": name_of(gid, grp.getgrgid),
    }


def attributes(path, info):
    return wanted_attributes(path, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)


def differs(info, mode, uid, gid):
    return (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) != (mode, uid, gid)


def set_attributes(path, mode, uid, gid):
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def missing_parents(path, created):
    """path and its ancestors that neither exist nor were created before, outermost first."""
    missing = []
    while path not in created and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    return list(reversed(missing))


def to_text(data):
    return data.decode("utf-8", errors="replace")


class Writer:
    def __init__(self, module, uid, gid):
        self.module, self.uid, self.gid = module, uid, gid
        self.check = module.check_mode
        self.changed_paths, self.backups, self.diff = [], {}, []
        self.created = {}  # directories this run creates (in check mode: would create), path -> mode

    def note(self, path, before, after, headers=False):
        if path not in self.changed_paths:
            self.changed_paths.append(path)
        entry = {"before": before, "after": after}
        if headers:
            entry.update(before_header=path, after_header=path)
        self.diff.append(entry)

    def directory(self, path, mode):
        if path in self.created:  # a parent of a directory before it in the list
            if self.created[path] != mode:
                before = {"state": "directory", **wanted_attributes(path, self.created[path], self.uid, self.gid)}
                self.note(path, before, {"state": "directory", **wanted_attributes(path, mode, self.uid, self.gid)})
                self.created[path] = mode
                if not self.check:
                    os.chmod(path, mode)
            return
        if os.path.isdir(path):
            info = os.stat(path)
            if differs(info, mode, self.uid, self.gid):
                self.note(path, attributes(path, info), wanted_attributes(path, mode, self.uid, self.gid))
                if not self.check:
                    set_attributes(path, mode, self.uid, self.gid)
            return
        for new in missing_parents(path, self.created):
            new_mode = mode if new == path else 0o755
            after = {"state": "directory", **wanted_attributes(new, new_mode, self.uid, self.gid)}
            self.note(new, {"path": new, "state": "absent"}, after)
            self.created[new] = new_mode
            if not self.check:
                os.mkdir(new, new_mode)
                set_attributes(new, new_mode, self.uid, self.gid)

    def file(self, dest, mode, content, backup):
        info = os.lstat(dest) if os.path.lexists(dest) else None
        regular = info is not None and stat.S_ISREG(info.st_mode)
        old = None
        if regular:
            with open(dest, "rb") as handle:
                old = handle.read()
        if old == content:
            if differs(info, mode, self.uid, self.gid):
                self.note(dest, attributes(dest, info), wanted_attributes(dest, mode, self.uid, self.gid))
                if not self.check:
                    set_attributes(dest, mode, self.uid, self.gid)
            return
        self.note(dest, to_text(old or b""), to_text(content), headers=True)
        if self.check:
            return
        if regular and backup:
            self.backups[dest] = self.module.backup_local(dest)
        self.replace(dest, mode, content)

    def prune(self, directory, pattern, keep, keep_dirs):
        """Remove the files under directory whose names match pattern, less those of keep, with the compiled copies
        of such files; then the directories below it that this left empty, less those of keep_dirs."""
        removed = set()
        for root, dirs, names in os.walk(directory):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(root, name)
                if path in keep or os.path.isdir(path) or not stale(root, name, pattern, keep):
                    continue
                self.remove(path, "file", removed)
        for root, _, _ in os.walk(directory, topdown=False):
            if root == directory or root in keep_dirs or not os.path.isdir(root) or os.path.islink(root):
                continue
            # Emptied by this pruning: something in it was pruned, and nothing else is left (in check mode the
            # pruned entries are still there).
            left = [os.path.join(root, name) for name in os.listdir(root)]
            if any(os.path.dirname(path) == root for path in removed) and all(path in removed for path in left):
                self.remove(root, "directory", removed)

    def remove(self, path, state, removed):
        self.note(path, {"path": path, "state": state}, {"path": path, "state": "absent"})
        removed.add(path)
        if not self.check:
            (os.rmdir if state == "directory" else os.unlink)(path)

    def replace(self, dest, mode, content):
        fd, temp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=f".{os.path.basename(dest)}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
            set_attributes(temp, mode, self.uid, self.gid)
            self.module.atomic_move(temp, dest)
        finally:
            if os.path.lexists(temp):
                os.unlink(temp)
        # atomic_move keeps the attributes of a file it replaces.
        set_attributes(dest, mode, self.uid, self.gid)


def stale(root, name, pattern, keep):
    """Whether a file in root that the task does not ship goes: its name matches pattern, or it is a compiled copy
    (in __pycache__) of a source whose name matches and that the task does not ship."""
    if fnmatch.fnmatchcase(name, pattern):
        return True
    if os.path.basename(root) != "__pycache__" or not name.endswith(".pyc"):
        return False
    source = f"{name.split('.')[0]}.py"
    return fnmatch.fnmatchcase(source, pattern) and os.path.join(os.path.dirname(root), source) not in keep


def list_of(**options):
    return {"type": "list", "elements": "dict", "default": [], "options": options}


def main():
    module = AnsibleModule(
        argument_spec={
            "directories": list_of(
                path={"type": "path", "required": True},
                mode={"type": "str", "default": "0755"},
                prune={"type": "str"},
            ),
            "files": list_of(
                dest={"type": "path", "required": True},
                content={"type": "str", "required": True},
                mode={"type": "str"},
                backup={"type": "bool"},
            ),
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "mode": {"type": "str", "default": "0644"},
            "backup": {"type": "bool", "default": True},
            "packages": {"type": "list", "elements": "str", "default": []},
            "package_dir": {"type": "path"},
            "package_mode": {"type": "str", "default": "0644"},
        },
        supports_check_mode=True,
    )
    if module.params["packages"]:
        module.fail_json(
            msg="config_files changed nothing: packages are read on the controller by the action config_files "
            "(plugins/action/config_files.py), and this task did not go through it: put plugins/action on "
            "Ansible's action plugin path (action_plugins in ansible.cfg)"
        )
    try:
        uid = resolve_id(module.params["owner"], pwd.getpwnam, "owner", module.check_mode)
        gid = resolve_id(module.params["group"], grp.getgrnam, "group", module.check_mode)
        directories, files = plan(module.params, module.check_mode)
    except Refused as err:
        module.fail_json(msg=f"config_files changed nothing: {err}")
    writer = Writer(module, uid, gid)
    try:
        for entry in directories:
            writer.directory(entry["path"], entry["mode"])
        for entry in files:
            writer.file(entry["dest"], entry["mode"], entry["content"], entry["backup"])
        shipped = {entry["dest"] for entry in files}
        wanted = {entry["path"] for entry in directories} | {os.path.dirname(dest) for dest in shipped}
        for entry in directories:
            if entry["prune"] is not None:
                writer.prune(entry["path"], entry["prune"], shipped, wanted)
    except OSError as err:
        module.fail_json(
            msg=f"config_files: {err}", changed=bool(writer.changed_paths), changed_paths=writer.changed_paths
        )
    result = {"changed": bool(writer.changed_paths), "changed_paths": writer.changed_paths, "backups": writer.backups}
    if module._diff:
        result["diff"] = writer.diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
