"""The controller side of apt_present: apt is called only when dpkg says that something is missing."""

import importlib.util
from pathlib import Path
from unittest.mock import MagicMock

import pytest
from ansible.errors import AnsibleActionFail

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("inferhost_action_apt_present", ROOT / "plugins/action/apt_present.py")
ACTION = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ACTION)


def install(args, reports):
    """Run the action with the modules' successive results; return (result, [(module, args)])."""
    task = MagicMock()
    task.args = args
    task.check_mode = False
    task.async_val = 0
    task.diff = False
    action = ACTION.ActionModule(task, MagicMock(), MagicMock(), MagicMock(), MagicMock(), MagicMock())
    calls = []

    def execute_module(module_name, module_args, task_vars):
        calls.append((module_name, module_args))
        return reports.pop(0)

    action._execute_module = execute_module
    return action.run(task_vars={}), calls


def test_nothing_missing_calls_no_apt():
    result, calls = install({"name": ["git", "gcc"]}, [{"changed": False, "missing": [], "installed": {"git": "1"}}])
    assert calls == [("dpkg_installed", {"name": ["git", "gcc"]})]
    assert result["changed"] is False and result["missing"] == []


def test_something_missing_calls_apt_with_the_whole_list_and_its_options():
    apt = {"changed": True, "stdout": "Setting up gcc"}
    result, calls = install(
        {"name": "git,gcc=12*", "allow_downgrade": True, "install_recommends": False},
        [{"changed": False, "missing": ["gcc=12*"], "installed": {}}, apt],
    )
    assert calls[1] == (
        "ansible.builtin.apt",
        {"name": ["git", "gcc=12*"], "state": "present", "allow_downgrade": True, "install_recommends": False},
    )
    assert result["changed"] is True and result["missing"] == ["gcc=12*"] and result["stdout"] == "Setting up gcc"


def test_apt_failing_fails_the_task():
    result, _ = install({"name": ["gcc"]}, [{"missing": ["gcc"]}, {"failed": True, "msg": "no candidate"}])
    assert result["failed"] and result["msg"] == "no candidate"


def test_dpkg_failing_fails_the_task_without_apt():
    result, calls = install({"name": ["gcc"]}, [{"failed": True, "msg": "dpkg-query failed"}])
    assert result["failed"] and len(calls) == 1


def test_an_empty_list_is_refused():
    with pytest.raises(AnsibleActionFail, match="needs name"):
        install({"name": []}, [])
