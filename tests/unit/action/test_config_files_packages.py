"""config_files' packages: the action reads a package by its import name from the module_utils path and the module
writes and prunes it on the host, run together in-process as a task runs them."""

import grp
import os
import pwd
import stat

import ansible.module_utils
import pytest
from action_runner import load_action, run_action
from ansible.errors import AnsibleActionFail
from module_runner import load_module, run_module

ACTION = load_action("config_files")
MODULE = load_module("config_files")
OWNER = {"owner": pwd.getpwuid(os.getuid()).pw_name, "group": grp.getgrgid(os.getgid()).gr_name}
SOURCES = {
    "pkg/__init__.py": "from .core import VALUE\n",
    "pkg/core.py": "VALUE = 1\n",
    "pkg/sub/__init__.py": "",
    "pkg/sub/deep.py": "DEEP = 2\n",
    "single.py": "SINGLE = 3\n",
}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """(a module_utils directory holding SOURCES, the library directory on the host), the action's search path
    being that directory and one before it that holds nothing."""
    utils = tmp_path / "module_utils"
    for relative, text in SOURCES.items():
        (utils / relative).parent.mkdir(parents=True, exist_ok=True)
        (utils / relative).write_text(text)
    (utils / "pkg" / "notes.txt").write_text("not Python: not shipped\n")
    (utils / "pkg" / "__pycache__").mkdir()
    (utils / "pkg" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(ACTION, "search_path", lambda: [str(tmp_path / "empty"), str(utils)])
    return utils, tmp_path / "host" / "lib"


def sync(lib, packages, check_mode=False, diff=False, **args):
    """Run the task: the action, and the module it calls run in-process. (result, the module's arguments)."""

    def module(name, module_args):
        assert name == "config_files"
        return run_module(MODULE, module_args, check_mode=check_mode, diff=diff)

    task = {**OWNER, "packages": packages, "package_dir": str(lib), **args}
    result, calls = run_action(ACTION, task, module, check_mode=check_mode, diff=diff)
    assert len(calls) == 1
    return result, calls[0][1]


def installed(lib):
    """Every file under lib, with its content."""
    return {p.relative_to(lib).as_posix(): p.read_text() for p in sorted(lib.rglob("*")) if p.is_file()}


def test_the_first_sync_copies_the_package_and_the_second_changes_nothing(host):
    _, lib = host
    result, _ = sync(lib, ["pkg", "single"])
    assert result["changed"] is True, result
    assert installed(lib) == SOURCES  # neither notes.txt nor the compiled copy travels
    assert {stat.S_IMODE(p.stat().st_mode) for p in lib.rglob("*.py")} == {0o644}
    assert {stat.S_IMODE(p.stat().st_mode) for p in (lib, lib / "pkg", lib / "pkg" / "sub")} == {0o755}
    again, _ = sync(lib, ["pkg", "single"])
    assert (again["changed"], again["changed_paths"]) == (False, [])


def test_a_changed_source_replaces_the_host_file_without_a_backup(host):
    utils, lib = host
    sync(lib, ["pkg"])
    (utils / "pkg" / "core.py").write_text("VALUE = 2\n")
    (lib / "pkg" / "sub" / "deep.py").write_text("# edited on the host\n")
    result, _ = sync(lib, ["pkg"], diff=True)
    assert result["changed_paths"] == [str(lib / "pkg/core.py"), str(lib / "pkg/sub/deep.py")]
    assert result["backups"] == {}
    assert result["diff"][0]["before"] == "VALUE = 1\n" and result["diff"][0]["after"] == "VALUE = 2\n"
    assert installed(lib)["pkg/core.py"] == "VALUE = 2\n" and installed(lib)["pkg/sub/deep.py"] == "DEEP = 2\n"
    assert sorted(p.name for p in (lib / "pkg").iterdir()) == ["__init__.py", "core.py", "sub"]


def test_stale_python_is_pruned_and_foreign_files_are_kept(host):
    utils, lib = host
    sync(lib, ["pkg", "single"])
    (lib / "pkg" / "__pycache__").mkdir()
    kept_cache = lib / "pkg" / "__pycache__" / "core.cpython-311.pyc"  # of a module still shipped
    kept_cache.write_bytes(b"\0")
    (lib / "pkg" / "__pycache__" / "retired.cpython-311.pyc").write_bytes(b"\0")
    (lib / "pkg" / "retired.py").write_text("OLD = 0\n")
    (lib / "pkg" / "old").mkdir()  # a subpackage an older release had
    (lib / "pkg" / "old" / "__init__.py").write_text("")
    (lib / "pkg" / "old" / "__pycache__").mkdir()
    (lib / "pkg" / "old" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0")
    foreign = {lib / "pkg" / "README.txt": "site notes\n", lib / "other.py": "# beside the package: not its own\n"}
    for path, text in foreign.items():
        path.write_text(text)
    result, _ = sync(lib, ["pkg", "single"], diff=True)
    gone = [
        "pkg/retired.py",
        "pkg/__pycache__/retired.cpython-311.pyc",
        "pkg/old/__init__.py",
        "pkg/old/__pycache__/__init__.cpython-311.pyc",
        "pkg/old/__pycache__",
        "pkg/old",
    ]
    assert result["changed_paths"] == [str(lib / p) for p in gone]
    assert result["diff"][-1] == {
        "before": {"path": str(lib / "pkg/old"), "state": "directory"},
        "after": {"path": str(lib / "pkg/old"), "state": "absent"},
    }
    assert not any((lib / p).exists() for p in gone)
    assert kept_cache.exists() and all(path.read_text() == text for path, text in foreign.items())
    assert sync(lib, ["pkg", "single"])[0]["changed"] is False


def test_check_mode_reports_what_would_change_and_changes_nothing(host):
    utils, lib = host
    first, _ = sync(lib, ["pkg"], check_mode=True)
    assert first["changed"] is True and not lib.exists()
    assert str(lib / "pkg/sub/deep.py") in first["changed_paths"]
    sync(lib, ["pkg"])
    (utils / "pkg" / "core.py").write_text("VALUE = 2\n")
    (lib / "pkg" / "retired.py").write_text("OLD = 0\n")
    before = installed(lib)
    result, _ = sync(lib, ["pkg"], check_mode=True, diff=True)
    assert result["changed_paths"] == [str(lib / "pkg/core.py"), str(lib / "pkg/retired.py")]
    assert result["diff"][0]["after"] == "VALUE = 2\n"
    assert installed(lib) == before


def test_a_module_of_a_package_comes_alone_and_its_package_keeps_only_it(host):
    _, lib = host
    (lib / "pkg").mkdir(parents=True)
    (lib / "pkg" / "__init__.py").write_text("# would import the whole package\n")
    result, args = sync(lib, ["pkg.core"])
    assert [f["dest"] for f in args["files"]] == [str(lib / "pkg/core.py")]
    assert [(d["path"], d.get("prune")) for d in args["directories"]] == [(str(lib), None), (str(lib / "pkg"), "*.py")]
    assert result["changed_paths"] == [str(lib / "pkg/core.py"), str(lib / "pkg/__init__.py")]
    assert installed(lib) == {"pkg/core.py": "VALUE = 1\n"}


def test_the_packages_come_before_the_tasks_own_files_and_a_task_without_packages_goes_unchanged(host):
    _, lib = host
    command = {"dest": str(lib.parent / "bin" / "tool"), "content": "#!/bin/sh\n", "mode": "0755"}
    given = {"directories": [{"path": str(lib.parent / "bin")}], "files": [command], "mode": "0755"}
    result, args = sync(lib, ["single"], **given)
    assert [f["dest"] for f in args["files"]] == [str(lib / "single.py"), command["dest"]]
    assert [d["path"] for d in args["directories"]] == [str(lib), str(lib.parent / "bin")]
    assert not {"packages", "package_dir", "package_mode"} & set(args)
    assert stat.S_IMODE((lib / "single.py").stat().st_mode) == 0o644  # package_mode, not the task's mode
    plain = {**OWNER, **given}
    assert run_action(ACTION, plain, [{"changed": False}])[1] == [("config_files", plain)]
    assert result["changed"] is True


@pytest.mark.parametrize(
    ("packages", "args", "says"),
    [
        (["pkg", "missing"], {}, "packages[1]: missing is no module or package on Ansible's module_utils path"),
        (["pkg", "pkg.core"], {}, "packages[1]: pkg.core ships pkg/core.py, which pkg ships too"),
        (["pkg", "pkg"], {}, "packages[1]: pkg is given twice"),
        (["../pkg"], {}, "packages[0]: given '../pkg'; expected an import name"),
        (["pkg"], {"package_dir": "lib"}, "package_dir: given 'lib'; expected the absolute path"),
        (["pkg"], {"package_mode": "rw"}, "package_mode: given 'rw'; expected an octal mode"),
    ],
)
def test_bad_packages_are_refused_before_the_module_runs(host, packages, args, says):
    _, lib = host
    task = {**OWNER, "packages": packages, "package_dir": str(lib), **args}
    with pytest.raises(AnsibleActionFail, match="^config_files changed nothing: " + says.replace("[", r"\[")):
        run_action(ACTION, task, [])
    assert not lib.exists()


def test_the_package_directory_is_not_the_tasks_to_give(host):
    _, lib = host
    task = {**OWNER, "packages": ["pkg"], "package_dir": str(lib), "directories": [{"path": str(lib / "pkg")}]}
    with pytest.raises(AnsibleActionFail, match="directories lists .*/pkg, the directory of a package"):
        run_action(ACTION, task, [])


def test_the_module_alone_refuses_packages(tmp_path):
    result = run_module(MODULE, {**OWNER, "packages": ["pkg"], "package_dir": str(tmp_path / "lib")})
    assert result["failed"] and "packages are read on the controller by the action config_files" in result["msg"]
    assert not (tmp_path / "lib").exists()


def test_the_search_path_is_ansibles_module_utils_path():
    # The project's module_utils (ansible.cfg) when Ansible reads this checkout's configuration, and Ansible's own.
    found = ACTION.search_path()
    assert os.path.dirname(ansible.module_utils.__file__) in found
    assert all(os.path.isdir(path) for path in found)
