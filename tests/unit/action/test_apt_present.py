"""The controller side of apt_present: apt is called only when dpkg says that something is missing."""

import pytest
from action_runner import load_action, run_action
from ansible.errors import AnsibleActionFail

ACTION = load_action("apt_present")


def install(args, results):
    """Run the action with the modules' successive results; return (result, [(module, args)])."""
    return run_action(ACTION, args, results)


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
