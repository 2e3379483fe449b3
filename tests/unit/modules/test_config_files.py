"""config_files: directories and files in one call, on a temporary tree owned by whoever runs the tests."""

import grp
import os
import pwd
import stat
from pathlib import Path

import pytest
from module_runner import load_module, run_module

MODULE = load_module("config_files")
OWNER = {"owner": pwd.getpwuid(os.getuid()).pw_name, "group": grp.getgrgid(os.getgid()).gr_name}


def run(tmp_path, directories=(), files=(), check_mode=False, diff=False, **args):
    """Run the module; dests and paths are relative to tmp_path."""
    args = {
        **OWNER,
        "directories": [{**d, "path": str(tmp_path / d["path"])} for d in directories],
        "files": [{**f, "dest": str(tmp_path / f["dest"])} for f in files],
        **args,
    }
    return run_module(MODULE, args, check_mode=check_mode, diff=diff)


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def tree(root):
    """Every path under root with its mode and (for files) content."""
    return {p.relative_to(root).as_posix(): (mode(p), p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


CONF = [{"dest": "etc/a.conf", "content": "a = 1\n"}, {"dest": "etc/b.sh", "content": "#!/bin/sh\n", "mode": "0755"}]


def test_creates_directories_and_files_then_changes_nothing(tmp_path):
    result = run(tmp_path, directories=[{"path": "etc"}], files=CONF)
    assert result["changed"] is True, result
    assert result["changed_paths"] == [str(tmp_path / p) for p in ("etc", "etc/a.conf", "etc/b.sh")]
    assert (tmp_path / "etc/a.conf").read_text() == "a = 1\n"
    assert (mode(tmp_path / "etc"), mode(tmp_path / "etc/a.conf"), mode(tmp_path / "etc/b.sh")) == (
        0o755,
        0o644,
        0o755,
    )
    again = run(tmp_path, directories=[{"path": "etc"}], files=CONF)
    assert (again["changed"], again["changed_paths"], again["backups"]) == (False, [], {})


def test_directories_are_created_with_their_parents(tmp_path):
    result = run(tmp_path, directories=[{"path": "a/b/c", "mode": "0700"}], files=[{"dest": "a/b/c/f", "content": ""}])
    assert result["changed_paths"] == [str(tmp_path / p) for p in ("a", "a/b", "a/b/c", "a/b/c/f")]
    assert (mode(tmp_path / "a"), mode(tmp_path / "a/b"), mode(tmp_path / "a/b/c")) == (0o755, 0o755, 0o700)
    # A file under a created parent (not itself listed) is accepted too.
    assert run(tmp_path, directories=[{"path": "x/y"}], files=[{"dest": "x/g", "content": "g"}])["changed"]


def test_changed_content_is_replaced_and_the_old_file_kept(tmp_path):
    run(tmp_path, directories=[{"path": "etc"}], files=CONF)
    edited = [{**CONF[0], "content": "a = 2\n"}, CONF[1]]
    result = run(tmp_path, files=edited)
    dest = str(tmp_path / "etc/a.conf")
    assert result["changed_paths"] == [dest]
    assert list(result["backups"]) == [dest]
    assert Path(result["backups"][dest]).read_text() == "a = 1\n"
    assert (tmp_path / "etc/a.conf").read_text() == "a = 2\n"
    assert mode(tmp_path / "etc/a.conf") == 0o644
    assert not [p for p in os.listdir(tmp_path / "etc") if p.endswith(".tmp")]
    no_backup = run(tmp_path, files=[{**CONF[0], "content": "a = 3\n"}], backup=False)
    assert no_backup["changed"] is True and no_backup["backups"] == {}


def test_a_mode_change_alone_sets_the_mode_without_a_backup(tmp_path):
    run(tmp_path, directories=[{"path": "etc"}], files=CONF)
    (tmp_path / "etc/a.conf").chmod(0o600)
    (tmp_path / "etc").chmod(0o700)
    result = run(tmp_path, directories=[{"path": "etc"}], files=CONF, diff=True)
    assert result["changed_paths"] == [str(tmp_path / "etc"), str(tmp_path / "etc/a.conf")]
    assert result["backups"] == {}
    assert (mode(tmp_path / "etc"), mode(tmp_path / "etc/a.conf")) == (0o755, 0o644)
    before, after = result["diff"][1]["before"], result["diff"][1]["after"]
    assert (before["mode"], after["mode"], after["path"], after["owner"]) == (
        "0600",
        "0644",
        str(tmp_path / "etc/a.conf"),
        OWNER["owner"],
    )
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == ["a.conf", "b.sh"]


def test_check_mode_reports_what_would_change_and_changes_nothing(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/a.conf").write_text("old\n")
    (tmp_path / "etc/a.conf").chmod(0o644)
    before = tree(tmp_path)
    files = [*CONF, {"dest": "new/c.conf", "content": "c\n"}]
    result = run(tmp_path, directories=[{"path": "new/sub"}], files=files, check_mode=True)
    assert result["changed_paths"] == [
        str(tmp_path / p) for p in ("new", "new/sub", "etc/a.conf", "etc/b.sh", "new/c.conf")
    ]
    assert result["backups"] == {}
    assert tree(tmp_path) == before
    # A real run then changes exactly these.
    assert run(tmp_path, directories=[{"path": "new/sub"}], files=files)["changed_paths"] == result["changed_paths"]


def test_diff_shows_content_as_text_and_created_directories_as_state(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/a.conf").write_text("a = 0\n")
    (tmp_path / "etc/a.conf").chmod(0o644)
    result = run(tmp_path, directories=[{"path": "d"}], files=CONF, diff=True, check_mode=True)
    created, changed, new = result["diff"]
    assert created == {
        "before": {"path": str(tmp_path / "d"), "state": "absent"},
        "after": {"path": str(tmp_path / "d"), "state": "directory", "mode": "0755", **OWNER},
    }
    path = str(tmp_path / "etc/a.conf")
    assert changed == {"before": "a = 0\n", "after": "a = 1\n", "before_header": path, "after_header": path}
    assert (new["before"], new["after"]) == ("", "#!/bin/sh\n")
    assert "diff" not in run(tmp_path, files=CONF, check_mode=True)


def test_a_missing_parent_is_refused_before_anything_changes(tmp_path):
    result = run(tmp_path, directories=[{"path": "etc"}], files=[*CONF, {"dest": "nowhere/x.conf", "content": ""}])
    assert result["failed"] is True
    assert str(tmp_path / "nowhere/x.conf") in result["msg"]
    assert list(tmp_path.iterdir()) == []


def test_check_mode_reports_a_file_in_a_missing_directory_as_created(tmp_path):
    # An earlier task of the same run (skipped in check mode) may be the one that creates the directory.
    result = run(tmp_path, files=[{"dest": "later/x.conf", "content": "x\n"}], check_mode=True)
    assert not result.get("failed") and result["changed_paths"] == [str(tmp_path / "later/x.conf")]
    assert list(tmp_path.iterdir()) == []


def test_check_mode_reports_an_owner_not_created_yet_as_a_change(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/a.conf").write_text("a = 1\n")
    args = {"owner": "inferhost-not-yet", "group": "inferhost-not-yet"}
    result = run(tmp_path, directories=[{"path": "etc"}], files=CONF, check_mode=True, diff=True, **args)
    assert not result.get("failed"), result
    assert result["changed_paths"] == [str(tmp_path / p) for p in ("etc", "etc/a.conf", "etc/b.sh")]
    assert result["diff"][0]["after"]["owner"] == "inferhost-not-yet"
    assert run(tmp_path, files=CONF, **args)["failed"] is True  # a real run refuses it, before any change
    assert (tmp_path / "etc/a.conf").read_text() == "a = 1\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"directories": [{"path": "etc"}], "files": [CONF[0], {**CONF[0], "content": "other"}]}, "given twice"),
        ({"directories": [{"path": "etc"}], "files": [{"dest": "etc", "content": ""}]}, "given twice"),
        ({"directories": [{"path": "etc"}], "files": [{**CONF[0], "mode": "rw-r--r--"}]}, "not an octal mode"),
        ({"directories": [{"path": "etc"}], "files": CONF, "owner": "inferhost-no-such-user"}, "unknown owner"),
        ({"directories": [{"path": "etc", "prune": "../*.py"}], "files": CONF}, "not a file name pattern"),
    ],
)
def test_bad_input_is_refused_before_anything_changes(tmp_path, args, says):
    result = run(tmp_path, **{"directories": [], **args})
    assert result["failed"] is True and says in result["msg"], result
    assert list(tmp_path.iterdir()) == []


def test_a_relative_path_is_refused(tmp_path):
    result = run_module(MODULE, {**OWNER, "files": [{"dest": "etc/a.conf", "content": ""}]})
    assert result["failed"] is True and "not an absolute path" in result["msg"]


def test_a_symbolic_link_is_replaced_by_the_file(tmp_path):
    (tmp_path / "target").write_text("a = 1\n")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/a.conf").symlink_to(tmp_path / "target")
    result = run(tmp_path, files=[CONF[0]])
    assert result["changed"] is True
    assert not (tmp_path / "etc/a.conf").is_symlink() and (tmp_path / "target").read_text() == "a = 1\n"


def test_a_file_may_keep_no_backup_where_the_others_do(tmp_path):
    run(tmp_path, directories=[{"path": "etc"}], files=CONF)
    edited = [{**CONF[0], "content": "a = 2\n", "backup": False}, {**CONF[1], "content": "#!/bin/bash\n"}]
    result = run(tmp_path, files=edited)
    assert list(result["backups"]) == [str(tmp_path / "etc/b.sh")]
    assert sorted(p for p in os.listdir(tmp_path / "etc") if p.startswith("a.conf")) == ["a.conf"]


PACKAGE = [{"dest": "lib/pkg/a.py", "content": "A = 1\n"}, {"dest": "lib/pkg/sub/b.py", "content": "B = 2\n"}]


def test_prune_removes_what_the_files_do_not_list_in_the_tree(tmp_path):
    shipped = run(tmp_path, directories=[{"path": "lib/pkg/sub", "prune": "*.py"}], files=PACKAGE)
    assert shipped["changed"] is True
    (tmp_path / "lib/pkg/old.py").write_text("gone\n")
    (tmp_path / "lib/pkg/sub/older.py").write_text("gone\n")
    (tmp_path / "lib/pkg/notes.txt").write_text("kept: another pattern\n")
    (tmp_path / "lib/outside.py").write_text("kept: outside the directory\n")
    check = run(tmp_path, directories=[{"path": "lib/pkg", "prune": "*.py"}], files=PACKAGE, check_mode=True)
    stale = [str(tmp_path / p) for p in ("lib/pkg/old.py", "lib/pkg/sub/older.py")]
    assert check["changed_paths"] == stale and all(Path(p).exists() for p in stale)
    result = run(tmp_path, directories=[{"path": "lib/pkg", "prune": "*.py"}], files=PACKAGE, diff=True)
    assert result["changed_paths"] == stale and result["backups"] == {}
    assert result["diff"][0] == {
        "before": {"path": stale[0], "state": "file"},
        "after": {"path": stale[0], "state": "absent"},
    }
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "lib/outside.py",
        "lib/pkg/a.py",
        "lib/pkg/notes.txt",
        "lib/pkg/sub/b.py",
    ]
    again = run(tmp_path, directories=[{"path": "lib/pkg", "prune": "*.py"}], files=PACKAGE)
    assert again["changed"] is False


def test_prune_of_a_directory_that_check_mode_would_create_finds_nothing(tmp_path):
    result = run(tmp_path, directories=[{"path": "lib/pkg", "prune": "*.py"}], files=PACKAGE[:1], check_mode=True)
    assert result["changed_paths"] == [str(tmp_path / p) for p in ("lib", "lib/pkg", "lib/pkg/a.py")]


def test_prune_takes_the_compiled_copies_and_the_directories_it_empties_in_check_mode_too(tmp_path):
    pruned = [{"path": "lib/pkg", "prune": "*.py"}, {"path": "lib/pkg/sub"}, {"path": "lib/pkg/kept"}]
    assert run(tmp_path, directories=pruned, files=PACKAGE)["changed"]
    cache = tmp_path / "lib/pkg/__pycache__"
    cache.mkdir()
    for name in ("a.cpython-311.pyc", "old.cpython-311.pyc", "old.cpython-311.opt-1.pyc", "notes.txt"):
        (cache / name).write_bytes(b"\0")
    (tmp_path / "lib/pkg/gone/__pycache__").mkdir(parents=True)
    (tmp_path / "lib/pkg/gone/__init__.py").write_text("")
    (tmp_path / "lib/pkg/gone/__pycache__/__init__.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "lib/pkg/kept/old.py").write_text("")  # its directory is listed: emptied, not removed
    (tmp_path / "lib/pkg/empty").mkdir()  # empty before: nothing was pruned from it
    before = tree(tmp_path)
    gone = [
        "lib/pkg/__pycache__/old.cpython-311.opt-1.pyc",
        "lib/pkg/__pycache__/old.cpython-311.pyc",
        "lib/pkg/gone/__init__.py",
        "lib/pkg/gone/__pycache__/__init__.cpython-311.pyc",
        "lib/pkg/kept/old.py",
        "lib/pkg/gone/__pycache__",
        "lib/pkg/gone",
    ]
    check = run(tmp_path, directories=pruned, files=PACKAGE, check_mode=True)
    assert check["changed_paths"] == [str(tmp_path / p) for p in gone]
    assert tree(tmp_path) == before
    result = run(tmp_path, directories=pruned, files=PACKAGE)
    assert result["changed_paths"] == check["changed_paths"]
    assert sorted(set(before) - set(tree(tmp_path))) == sorted(gone)
    assert run(tmp_path, directories=pruned, files=PACKAGE)["changed"] is False
