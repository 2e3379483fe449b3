"""inference_service_wait with a group: the head's wait and a rank's wait run at once (as two forks run them), the
modules they call on their own nodes answered by fakes of systemd and of the head's HTTP answers."""

import threading
from unittest.mock import MagicMock

from action_runner import load_action

ACTION = load_action("inference_service_wait")
UNIT = "inference-m.service"
GROUP = {"service": "m", "nodes": ["ct-a", "ct-b"], "rank": 0}


class Node:
    """One container: its unit (systemd) and, on the head, the API's answers after each (re)start."""

    def __init__(self, answers=None, dies_after_looks=None):
        self.active = "active"
        self.answers = answers  # the completion before its first restart, and after (the head only)
        self.starts = 0
        self.dies_after_looks = dies_after_looks
        self.looks = 0
        self.calls = []

    def module(self, name, args):
        self.calls.append((name, {k: v for k, v in args.items() if k in ("state", "complete", "argv")}))
        if name == "ansible.builtin.command":  # systemctl kill / reset-failed
            if args["argv"][1] == "reset-failed" and self.active == "failed":
                self.active = "inactive"
            if args["argv"][1] == "kill" and self.active in ("active", "deactivating"):
                self.active = "inactive"
            return {"rc": 0}
        if name == "ansible.builtin.systemd_service":
            if args.get("state") == "stopped":
                self.active = "inactive"
            elif args.get("state") == "started":
                self.active = "active"
                self.starts += 1
            return {"status": {"ActiveState": self.active, "SubState": "x", "Result": "success"}}
        self.looks += 1
        if self.dies_after_looks is not None and self.looks > self.dies_after_looks and self.active == "active":
            self.active = "failed"
        completion = self.answers[min(self.starts, len(self.answers) - 1)]
        return {
            "ready": True,
            "health": 200,
            "unit_state": {"ActiveState": self.active, "Result": "signal" if self.active == "failed" else "success"},
            "completion": completion,
        }


def plugin(node, args, uuid="task-1"):
    task = MagicMock()
    task.args = args
    task.check_mode = False
    task._uuid = uuid
    task.async_val = 0
    action = ACTION.ActionModule(task, MagicMock(), MagicMock(), MagicMock(), MagicMock(), MagicMock())
    action._execute_module = lambda module_name, module_args, task_vars: node.module(module_name, module_args)
    return action


def run_group(head, worker, tmp_path, **extra):
    common = {"model": "M", "unit": UNIT, "interval": 1, "board_dir": str(tmp_path), **extra}
    results = {}

    def run(name, node, rank, **more):
        args = {**common, "group": {**GROUP, "rank": rank}, **more}
        results[name] = plugin(node, args).run(task_vars={"inventory_hostname": name})

    threads = [
        threading.Thread(target=run, args=("ct-b", worker, 1)),
        threading.Thread(target=run, args=("ct-a", head, 0), kwargs={"url": "http://127.0.0.1:8000"}),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


OK = {"ok": True, "problem": ""}
BROKEN = {"ok": False, "problem": "POST /v1/completions answered 500: engine dead"}


def test_the_group_is_ready_after_a_completion_and_both_waits_say_so(tmp_path):
    head, worker = Node([OK]), Node()
    results = run_group(head, worker, tmp_path)
    assert results["ct-a"]["ready"] and results["ct-b"]["ready"] and not results["ct-a"].get("failed")
    assert results["ct-a"]["restarts"] == [] == results["ct-b"]["restarts"]
    assert ("inference_service_probe", {"complete": True}) in head.calls
    assert not [c for c in head.calls + worker.calls if c[1].get("state")]


def test_completions_failing_while_healthy_restart_both_nodes_the_worker_started_before_the_head(tmp_path):
    head, worker = Node([BROKEN, OK]), Node()
    results = run_group(head, worker, tmp_path)
    assert results["ct-a"]["ready"] and results["ct-b"]["ready"]
    [reason] = results["ct-a"]["restarts"]
    assert "engine dead" in reason
    for node in (head, worker):
        assert [c[1]["state"] for c in node.calls if c[1].get("state")] == ["stopped", "started"]
        # A broken group's units are killed before they are stopped (their ranks hang on SIGTERM), and each start
        # clears a start limit a crash loop may have left.
        assert _systemctl(node) == [
            ["systemctl", "kill", "--signal=SIGKILL", UNIT],
            ["systemctl", "reset-failed", UNIT],
        ]


def _systemctl(node):
    return [c[1]["argv"] for c in node.calls if c[0] == "ansible.builtin.command"]


def test_a_rank_stopping_on_its_own_is_killed_and_the_group_restarted(tmp_path):
    """vLLM's headless rank whose worker died: its main process gone, the unit stuck stopping on SIGTERM. The
    head's wait sees it at once, the rank's stop kills what is left instead of waiting out TimeoutStopSec."""
    head, worker = Node([OK]), Node()
    worker.active = "deactivating"
    results = run_group(head, worker, tmp_path)
    assert results["ct-a"]["ready"] and results["ct-b"]["ready"]
    [reason] = results["ct-a"]["restarts"]
    assert reason == "rank 1 (ct-b): its unit is stopping on its own (x)"
    assert _systemctl(worker) == [
        ["systemctl", "kill", "--signal=SIGKILL", UNIT],
        ["systemctl", "reset-failed", UNIT],
    ]
    assert _systemctl(head) == [["systemctl", "kill", "--signal=SIGKILL", UNIT], ["systemctl", "reset-failed", UNIT]]


def test_a_head_unit_that_keeps_failing_fails_both_waits(tmp_path):
    head, worker = Node([OK], dies_after_looks=0), Node()
    results = run_group(head, worker, tmp_path, max_restarts=1)
    for name in ("ct-a", "ct-b"):
        assert results[name]["failed"] and "restarted 1 times already" in results[name]["msg"]


# --- one node -----------------------------------------------------------------------------------------------------


class Single:
    """The probe module's answers on one node, one per look from a script (the last repeats)."""

    def __init__(self, looks):
        self.looks, self.calls = list(looks), []

    def module(self, name, args):
        self.calls.append((name, args))
        return self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]


def look(active="active", restarts="0", ready=True, completion=None, last_log=""):
    answer = {
        "ready": ready,
        "health": 200 if ready else "no answer: connection refused",
        "unit_state": {"ActiveState": active, "SubState": "running", "Result": "success", "NRestarts": restarts},
        "last_log": last_log,
    }
    if ready:
        answer["completion"] = completion or {"ok": True, "problem": ""}
    return answer


def run_single(node, **extra):
    args = {"url": "http://127.0.0.1:8000", "model": "M", "unit": UNIT, "interval": 1, "timeout": 30, **extra}
    return plugin(node, args).run(task_vars={"inventory_hostname": "ct-a"})


def test_served_means_a_completion_came_back_not_only_health():
    node = Single([look()])
    result = run_single(node)
    assert result.get("failed") is not True and result["ready"], result
    assert node.calls[0][1]["complete"] is True


def test_a_dead_engine_that_answers_health_fails_the_wait_naming_the_completion():
    dead = {"ok": False, "problem": "POST /v1/completions answered 500: EngineDeadError"}
    node = Single([look(completion=dead)])
    result = run_single(node)
    assert result["failed"] and "EngineDeadError" in result["msg"] and "2 completions in a row" in result["msg"]
    assert len(node.calls) == 2


def test_a_restart_by_systemd_during_the_wait_names_the_first_failure_instead_of_waiting_through_the_next_load():
    node = Single(
        [
            look(active="activating", restarts="0", ready=False, last_log="Loading weights"),
            look(active="activating", restarts="0", ready=False, last_log="RuntimeError: CUDA error: out of memory"),
            look(active="activating", restarts="1", ready=False, last_log="Starting the engine"),
            look(),
        ]
    )
    result = run_single(node)
    assert result["failed"], result
    assert "NRestarts 0 -> 1" in result["msg"] and "out of memory" in result["msg"], result["msg"]
    assert len(node.calls) == 3
