"""The controller side of source_build_wait: what the play sees of a build it follows."""

import pytest
from action_runner import load_action, run_action
from ansible.errors import AnsibleActionFail

ACTION = load_action("source_build_wait")


def follow(args, reports, check_mode=False):
    """Run the action with the module's successive reports; return (result, module calls)."""
    result, calls = run_action(ACTION, args, reports, check_mode=check_mode, task_vars={"inventory_hostname": "ct"})
    return result, [module_args for _, module_args in calls]


def report(status, done, **extra):
    return {"status": status, "done": done, "elapsed": 5.0, "elapsed_human": "0m05s", "tail": [], **extra}


def test_a_name_with_no_build_running_returns_at_once():
    result, calls = follow({"name_dir": "/c/flash-attn", "interval": 1}, [report("idle", True)])
    assert result["status"] == "idle" and not result["failed"] and not result["changed"]
    assert calls == [{"name_dir": "/c/flash-attn", "wait": 1, "lines": 15}]


def test_another_keys_failed_build_is_followed_to_its_end_without_failing_the_task():
    # Ansible fails a task whose result has a non-zero rc unless it says otherwise.
    reports = [report("running", False, key="k1"), report("failed", True, key="k1", rc=2, reason="status 2")]
    result, calls = follow({"name_dir": "/c/sgl-kernel", "interval": 1}, reports)
    assert len(calls) == 2 and result["status"] == "failed" and result["rc"] == 2
    assert result["failed"] is False and result["key"] == "k1"


def test_a_key_is_followed_by_its_job_directory():
    result, calls = follow({"job_dir": "/c/demo/k2", "interval": 1}, [report("cached", True, wheel="/c/demo/k2/x.whl")])
    assert calls[0]["job_dir"] == "/c/demo/k2" and "name_dir" not in calls[0]
    assert result["wheel"] == "/c/demo/k2/x.whl" and result["failed"] is False


def test_check_mode_looks_once_without_waiting():
    result, calls = follow({"name_dir": "/c/x"}, [report("running", False, key="k")], check_mode=True)
    assert calls[0]["wait"] == 0 and result["status"] == "running" and not result["failed"]


@pytest.mark.parametrize("args", [{}, {"job_dir": "/c/x/k", "name_dir": "/c/x"}])
def test_one_of_job_dir_and_name_dir_is_required(args):
    with pytest.raises(AnsibleActionFail, match="one of job_dir"):
        follow(args, [])


def test_a_build_just_started_gets_a_start_grace_that_shrinks_as_the_follow_goes_on(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(ACTION.time, "monotonic", lambda: now[0])

    class Reports(list):
        def pop(self, index=-1):  # each module call takes 12 s
            now[0] += 12
            return super().pop(index)

    reports = Reports([report("starting", False), report("running", False), report("cached", True)])
    result, calls = follow({"job_dir": "/c/demo/k3", "interval": 1}, reports)
    assert [c["start_grace"] for c in calls] == [30, 18, 6] and result["status"] == "cached"
    _, calls = follow({"name_dir": "/c/demo", "interval": 1}, [report("idle", True)])
    assert "start_grace" not in calls[0]
