"""The project's own defaults are safe for a real site: the licence its files name, no default inventory (a
command without -i must not reach the lab's machines), and no backup of a file that holds a secret (a backup of a
key is a key left behind)."""

import ast
import configparser
import re
from pathlib import Path

import pytest
import yaml
from ansible.playbook.handler import Handler

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.static

# A task's keywords; every other key of a task is its module (or a block).
KEYWORDS = set(Handler.fattributes) | {"local_action", "block", "rescue", "always"}
# A path that names a secret. A keyring (a repository's public signing key) is not one.
SECRET_PATH = re.compile(r"secret|passw(or)?d|token|credential|api_?key|private_?key|\.key\b", re.IGNORECASE)
# The tasks that write secrets today: the scan below must find them, or it checks nothing.
KNOWN_SECRET_WRITERS = {
    "roles/gpu_switch/tasks/config.yml: config | Write the Proxmox password",
    "roles/inference_service/tasks/units.yml: units | Write the API key of each service",
}


def test_the_licence_is_the_one_the_headers_name():
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:3] == ["Apache", "License", "Version"] and "Version 2.0, January 2004" in text
    assert "Copyright inferhost contributors" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text().splitlines()
    # The module headers (SPDX or "Apache License 2.0 (see LICENSE)") and the roles' Galaxy metadata.
    named = [
        (path.relative_to(ROOT), spdx or words)
        for path in sorted((ROOT / "plugins").rglob("*.py")) + sorted((ROOT / "roles").glob("*/meta/main.yml"))
        for spdx, words in re.findall(
            r"(?:SPDX-License-Identifier|license):\s*(\S+)|(\S+ License \S+) \(see LICENSE\)", path.read_text()
        )
    ]
    others = [f"{path}: {licence}" for path, licence in named if licence not in {"Apache-2.0", "Apache License 2.0"}]
    assert named and not others, f"files that name another licence than LICENSE's: {others}"


def test_ansible_cfg_names_no_inventory():
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "ansible.cfg")
    named = {key: config["defaults"][key] for key in ("inventory", "hostfile") if key in config["defaults"]}
    assert not named, (
        f"ansible.cfg names a default inventory ({named}): a site's command without -i would run against it. "
        "Pass -i inventory/<site>/hosts.yml (the lab's code passes inventory/lab/hosts.yml)."
    )


def _fenced_code(text):
    return re.findall(r"^\s*```[a-z]*\n(.*?)^\s*```", text, re.DOTALL | re.MULTILINE)


def test_the_commands_the_docs_show_name_their_inventory():
    missing = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in _fenced_code(path.read_text()):
            # A command continued on the next line (a trailing backslash) is read whole.
            for command in block.replace("\\\n", " ").splitlines():
                words = command.split("#", 1)[0].split()
                tool = Path(words[0]).name if words else ""
                ansible = tool in {"ansible-playbook", "ansible-inventory"} or (tool == "ansible" and "-m" in words)
                if ansible and not any(w in {"-i", "--inventory"} or w.startswith("--inventory=") for w in words):
                    missing.append(f"{path.relative_to(ROOT)}: {command.strip()}")
    assert not missing, f"commands that rely on a default inventory, which ansible.cfg does not name: {missing}"


def _tasks(entries):
    """Every task of a task list, those inside blocks included."""
    for task in entries or []:
        if not isinstance(task, dict):
            continue
        if "block" in task:
            for part in ("block", "rescue", "always"):
                yield from _tasks(task.get(part))
        else:
            yield task


def _task_files():
    """(path, tasks) for every role task and handler file and every playbook."""
    for path in sorted((ROOT / "roles").glob("*/*/*.yml")):
        if path.parent.name in {"tasks", "handlers"}:
            yield path, list(_tasks(yaml.safe_load(path.read_text())))
    for path in [ROOT / "site.yml", *sorted((ROOT / "playbooks").glob("*.yml"))]:
        plays = yaml.safe_load(path.read_text()) or []
        for play in plays:
            for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                yield path, list(_tasks(play.get(section)))


# Ansible's modules that write a file and have a backup option (off unless set).
BUILTIN_WRITERS = {"copy", "template", "lineinfile", "blockinfile", "replace", "ini_file", "get_url"}


def _own_backup_option(module):
    """Our own module's backup option as its DOCUMENTATION gives it ({} when it has none)."""
    own = ROOT / "plugins" / "modules" / f"{module.rsplit('.', 1)[-1]}.py"
    if not own.exists():
        return {}
    for node in ast.parse(own.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DOCUMENTATION" for t in node.targets):
            return yaml.safe_load(node.value.value)["options"].get("backup") or {}
    return {}


def _writes_files(module, args):
    return "backup" in args or module.rsplit(".", 1)[-1] in BUILTIN_WRITERS or bool(_own_backup_option(module))


def _written_paths(args):
    """The text of every path a module's arguments write (a templated list of files as its whole text)."""
    paths = [str(args.get(key, "")) for key in ("dest", "path")]
    files = args.get("files", [])
    if isinstance(files, str):
        paths.append(files)
    else:
        paths += [str(entry.get("dest", "")) for entry in files if isinstance(entry, dict)]
    return paths


def _keeps_backups(module, args):
    """Whether the task can keep a backup: by its own option (the module's default when not set) or any file's."""
    kept = args["backup"] is not False if "backup" in args else _own_backup_option(module).get("default", False)
    files = args.get("files", [])
    if isinstance(files, str):  # a Jinja expression: a file's own "backup" other than false
        kept = kept or re.search(r"""['"]backup['"]\s*:\s*(?!false|False)""", files) is not None
    else:
        kept = kept or any(isinstance(f, dict) and f.get("backup", False) is not False for f in files)
    return kept


def test_no_file_that_holds_a_secret_keeps_a_backup():
    secret_writers, kept = set(), []
    for path, tasks in _task_files():
        for task in tasks:
            modules = [key for key in task if key not in KEYWORDS]
            if len(modules) != 1 or not isinstance(task[modules[0]], dict):
                continue
            module, args = modules[0], {**(task.get("args") or {}), **task[modules[0]]}
            no_log = task.get("no_log", False) not in (False, "false")
            named = any(SECRET_PATH.search(written) for written in _written_paths(args))
            if not (no_log or named) or not _writes_files(module, args):
                continue
            where = f"{path.relative_to(ROOT)}: {task.get('name')}"
            secret_writers.add(where)
            if _keeps_backups(module, args):
                kept.append(where)
    assert secret_writers >= KNOWN_SECRET_WRITERS, f"the scan missed {KNOWN_SECRET_WRITERS - secret_writers}"
    assert not kept, f"tasks that write a secret and keep a backup of it (set backup: false): {kept}"
