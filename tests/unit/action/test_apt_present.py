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


UNKNOWN = {"failed": True, "msg": "No package matching 'cuda-toolkit-12-8' is available"}


def test_check_mode_reports_a_package_apt_does_not_know_as_one_to_install():
    """A fresh guest in check mode: the repository that provides it is not added yet."""
    result, calls = run_action(
        ACTION,
        {"name": ["cuda-toolkit-12-8", "cuda-toolkit-13-0"]},
        [{"missing": ["cuda-toolkit-12-8", "cuda-toolkit-13-0"]}, dict(UNKNOWN)],
        check_mode=True,
    )
    assert [module for module, _ in calls] == ["dpkg_installed", "ansible.builtin.apt"]
    assert not result.get("failed") and result["changed"] is True
    assert result["missing"] == ["cuda-toolkit-12-8", "cuda-toolkit-13-0"]
    assert result["unknown"] == ["cuda-toolkit-12-8"]
    assert result["msg"].startswith("check mode: would install cuda-toolkit-12-8, cuda-toolkit-13-0.")
    assert "cuda-toolkit-12-8" in result["msg"]


def test_check_mode_reports_a_pattern_apt_does_not_match_as_one_to_install():
    apt = {"failed": True, "msg": "No package(s) matching 'nvidia-open*' available"}
    result, _ = run_action(
        ACTION, {"name": ["nvidia-open=590*"]}, [{"missing": ["nvidia-open=590*"]}, apt], check_mode=True
    )
    assert result["changed"] is True and result["unknown"] == ["nvidia-open*"] and not result.get("failed")


def test_a_real_run_still_fails_on_a_package_apt_does_not_know():
    result, _ = install({"name": ["cuda-toolkit-12-8"]}, [{"missing": ["cuda-toolkit-12-8"]}, dict(UNKNOWN)])
    assert result["failed"] and result["msg"] == UNKNOWN["msg"] and "unknown" not in result


HINT = "Add NVIDIA's repository first (role nvidia_userspace)."


@pytest.mark.parametrize(
    "apt",
    [
        dict(UNKNOWN),
        {
            "failed": True,
            "msg": "'/usr/bin/apt-get -y install cuda-toolkit-12-8' failed",
            "stderr": ("E: Package 'cuda-toolkit-12-8' has no installation candidate\n"),
        },
    ],
    ids=["unknown", "no candidate"],
)
def test_a_real_run_that_no_source_serves_ends_with_the_source_hint(apt):
    result, _ = install({"name": ["cuda-toolkit-12-8"], "source_hint": HINT}, [{"missing": ["cuda-toolkit-12-8"]}, apt])
    assert result["failed"] and result["msg"].startswith(apt["msg"].rstrip(".")) and result["msg"].endswith(HINT)


def test_the_source_hint_stays_off_other_apt_failures():
    apt = {"failed": True, "msg": "E: Sub-process /usr/bin/dpkg returned an error code (1)"}
    result, _ = install({"name": ["gcc"], "source_hint": HINT}, [{"missing": ["gcc"]}, apt])
    assert result["failed"] and result["msg"] == apt["msg"]


def test_check_mode_still_fails_on_other_apt_failures():
    apt = {"failed": True, "msg": "'/usr/bin/apt-get -y install gcc' failed: E: Unable to locate"}
    result, _ = run_action(ACTION, {"name": ["gcc"]}, [{"missing": ["gcc"]}, apt], check_mode=True)
    assert result["failed"] and result["msg"] == apt["msg"]


def test_hold_holds_only_the_packages_dpkg_does_not_hold_yet():
    query = {"missing": [], "installed": {"a": "1", "b": "1"}, "held": ["a"]}
    result, calls = install({"name": ["a=1*", "b=1*", "c"], "hold": ["a", "b"]}, [query, {"changed": True}])
    assert calls[1:] == [("ansible.builtin.dpkg_selections", {"name": "b", "selection": "hold"})]
    assert result["changed"] is True and result["held"] == ["b"]


def test_hold_with_every_package_held_makes_no_call():
    query = {"missing": [], "installed": {"a": "1"}, "held": ["a"]}
    result, calls = install({"name": ["a=1*"], "hold": ["a"]}, [query])
    assert len(calls) == 1 and result["changed"] is False and result["held"] == []


def test_hold_follows_the_install_and_a_check_run_only_says_so():
    query = {"missing": ["a=1*"], "installed": {}, "held": []}
    result, calls = run_action(ACTION, {"name": ["a=1*"], "hold": ["a"]}, [query, {"changed": True}], check_mode=True)
    assert [module for module, _ in calls] == ["dpkg_installed", "ansible.builtin.apt"]
    assert result["changed"] is True and result["held"] == ["a"]


def test_a_failed_install_holds_nothing():
    query = {"missing": ["a=1*"], "installed": {}, "held": []}
    result, calls = install({"name": ["a=1*"], "hold": ["a"]}, [query, {"failed": True, "msg": "no candidate"}])
    assert len(calls) == 2 and result["failed"]


def test_hold_of_a_package_name_does_not_install_is_refused():
    with pytest.raises(AnsibleActionFail, match="hold names packages that name does not install: b"):
        install({"name": ["a"], "hold": ["b"]}, [])


def test_after_an_install_every_package_is_held_again():
    """apt takes the hold off a held package it replaces (a change of driver): dpkg's earlier answer is stale."""
    query = {"missing": ["a=2*"], "installed": {"a": "1"}, "held": ["a"]}
    selections = [{"changed": True}, {"changed": False}]
    result, calls = install({"name": ["a=2*", "b"], "hold": ["a", "b"]}, [query, {"changed": True}, *selections])
    assert [args["name"] for module, args in calls if module == "ansible.builtin.dpkg_selections"] == ["a", "b"]
    assert result["held"] == ["a"] and result["changed"] is True
