"""tasks/units.yml and the API key files: a changed key leaves no backup, and the backups that earlier runs left
(Ansible's backup name, <file>.<pid>.<date>@<time>~) are removed, in check mode only reported; config_files runs
with the task's own arguments on a temporary directory."""

import grp
import os
import pwd
from pathlib import Path

import yaml
from inference_refdata import ROLE
from module_runner import load_module, run_module

MODULE = load_module("config_files")
OWNER = {"owner": pwd.getpwuid(os.getuid()).pw_name, "group": grp.getgrgid(os.getgid()).gr_name}
TASKS = {task["name"]: task for task in yaml.safe_load((ROLE / "tasks" / "units.yml").read_text())}
UNITS = TASKS["units | Create the directory of the secret environment files and render the unit of each service"]
KEYS = TASKS["units | Write the API key of each service"]
# The entry of the secret files' directory, as the role gives it (its path is this test's directory).
KEY_DIR = next(d for d in UNITS["config_files"]["directories"] if d["path"] == "{{ inference_service_config_dir }}")


def write_keys(directory: Path, keys: dict[str, str], backup: bool):
    files = [
        {"dest": str(directory / f"{name}.secret.env"), "content": f"INFERHOST_API_KEY={key}\n"}
        for name, key in keys.items()
    ]
    return run_module(MODULE, {**OWNER, "files": files, "mode": "0600", "backup": backup})


def prune_backups(directory: Path, check_mode=False):
    entry = {**KEY_DIR, "path": str(directory)}
    return run_module(MODULE, {**OWNER, "directories": [entry]}, check_mode=check_mode)


def names(directory: Path):
    return sorted(p.name for p in directory.iterdir())


def test_a_changed_key_leaves_no_backup(tmp_path):
    assert KEYS["config_files"]["backup"] is False and KEYS["no_log"] is True
    write_keys(tmp_path, {"svc-a": "old"}, backup=KEYS["config_files"]["backup"])
    result = write_keys(tmp_path, {"svc-a": "new"}, backup=KEYS["config_files"]["backup"])
    assert result["changed"] is True and result["backups"] == {}
    assert names(tmp_path) == ["svc-a.secret.env"]


def test_the_backups_earlier_runs_left_are_removed_and_nothing_else(tmp_path):
    # An earlier release kept a backup of each key it replaced; a dropped service's backup outlived its key file.
    write_keys(tmp_path, {"svc-a": "first", "svc-b": "first"}, backup=True)
    kept = write_keys(tmp_path, {"svc-a": "second", "svc-b": "second"}, backup=True)["backups"]
    dropped = tmp_path / "svc-old.secret.env.4242.2025-11-02@09:15:00~"
    dropped.write_text("INFERHOST_API_KEY=older\n")
    others = ["notes~", "svc-a.secret.env.orig", "svc-a.secret.env.swp~"]
    for name in others:
        (tmp_path / name).write_text("not a backup of Ansible's\n")
    backups = sorted([*kept.values(), str(dropped)])
    assert len(backups) == 3 and all(Path(b).name.startswith("svc-") for b in backups)

    check = prune_backups(tmp_path, check_mode=True)
    assert check["changed"] is True and sorted(check["changed_paths"]) == backups
    assert all(Path(b).exists() for b in backups)

    done = prune_backups(tmp_path)
    assert sorted(done["changed_paths"]) == backups
    assert names(tmp_path) == sorted(["svc-a.secret.env", "svc-b.secret.env", *others])
    assert (tmp_path / "svc-a.secret.env").read_text() == "INFERHOST_API_KEY=second\n"
    assert prune_backups(tmp_path)["changed"] is False
