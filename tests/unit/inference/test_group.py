"""A group of ranks across nodes: ready only when a completion through the head comes back; a failed rank, or a
completion that fails while /health says ok, restarts the whole group: every rank stopped (the head first),
then started with the head last. Driven with fake units and fake HTTP answers."""

import threading

import pytest
from inference import group

NODES = ["ct-a", "ct-b", "ct-c"]
ACTIVE = {"ActiveState": "active", "SubState": "running", "Result": "success"}
FAILED = {"ActiveState": "failed", "SubState": "failed", "Result": "signal"}
LOADING = {"ActiveState": "activating", "SubState": "start-post", "Result": "success"}
HEALTHY = {"health": 200, "ready": True}
DOWN = {"health": "no answer: connection refused", "ready": False}
OK = {"ok": True, "problem": ""}
BROKEN = {"ok": False, "problem": "POST /v1/completions answered 500: EngineCore died"}


class FakeGroup:
    """Units of the group and the head's answers, one look at a time from a script; records stops and starts."""

    def __init__(self, looks):
        self.looks = list(looks)  # each: (units, probe, completion)
        self.now = None
        self.calls = []
        self.clock_s = 0.0

    def units(self):
        self.now = self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]
        return dict(self.now[0])

    def probe(self):
        return self.now[1]

    def complete(self):
        self.calls.append(("complete",))
        return self.now[2]

    def stop(self, host):
        self.calls.append(("stop", host))

    def start(self, host):
        self.calls.append(("start", host))

    def clock(self):
        return self.clock_s

    def sleep(self, seconds):
        self.clock_s += seconds


def everyone(state, **overrides):
    return {**dict.fromkeys(NODES, state), **overrides}


def wait(fake, **kw):
    kw.setdefault("timeout", 600)
    runner = group.GroupWait(NODES, fake, interval=10, **kw)
    lines = []
    result = runner.run(clock=fake.clock, sleep=fake.sleep, log=lines.append)
    return result, runner, lines


def test_health_alone_is_not_ready_a_completion_is():
    fake = FakeGroup(
        [
            (everyone(LOADING), DOWN, None),
            (everyone(ACTIVE), HEALTHY, OK),
        ]
    )
    result, runner, lines = wait(fake)
    assert result["ready"] and runner.restarts == [] and fake.calls == [("complete",)]
    assert "loading" in lines[0] and "ready" in lines[-1]


def test_a_failed_rank_restarts_the_whole_group_head_stopped_first_and_started_last():
    fake = FakeGroup(
        [
            (everyone(ACTIVE, **{"ct-c": FAILED}), HEALTHY, OK),
            (everyone(LOADING), DOWN, None),
            (everyone(ACTIVE), HEALTHY, OK),
        ]
    )
    result, runner, _ = wait(fake)
    assert result["ready"] and len(runner.restarts) == 1 and "rank 2 (ct-c)" in runner.restarts[0]
    moves = [c for c in fake.calls if c[0] != "complete"]
    assert moves == [
        ("stop", "ct-a"),
        ("stop", "ct-b"),
        ("stop", "ct-c"),
        ("start", "ct-b"),
        ("start", "ct-c"),
        ("start", "ct-a"),
    ]


def test_a_rank_that_systemd_restarted_on_its_own_restarts_the_group_though_every_unit_is_active():
    """A head that crashed and was restarted by Restart=always waits for a peer group that is gone: its unit
    looks active, its /health never answers. The count of automatic restarts gives it away; a count that was
    already there at the first look does not."""
    restarted = {**LOADING, "NRestarts": "1"}
    fake = FakeGroup(
        [
            (everyone({**LOADING, "NRestarts": "0"}, **{"ct-c": {**LOADING, "NRestarts": "4"}}), DOWN, None),
            (
                everyone({**LOADING, "NRestarts": "0"}, **{"ct-a": restarted, "ct-c": {**LOADING, "NRestarts": "4"}}),
                DOWN,
                None,
            ),
            # After the group's restart, counts are taken afresh: ct-a's 1 is its new start's count.
            (everyone(LOADING, **{"ct-a": restarted}), DOWN, None),
            (everyone({**ACTIVE, "NRestarts": "1"}), HEALTHY, OK),
        ]
    )
    result, runner, _ = wait(fake)
    assert result["ready"] and runner.restarts == [
        "rank 0 (ct-a): systemd restarted its unit on its own (NRestarts 0 -> 1)"
    ]
    assert [c for c in fake.calls if c[0] == "stop"] == [("stop", "ct-a"), ("stop", "ct-b"), ("stop", "ct-c")]


def test_a_completion_that_fails_while_health_says_ok_restarts_the_group_once_confirmed():
    fake = FakeGroup(
        [
            (everyone(ACTIVE), HEALTHY, BROKEN),
            (everyone(ACTIVE), HEALTHY, BROKEN),
            (everyone(ACTIVE), HEALTHY, OK),
        ]
    )
    result, runner, lines = wait(fake, confirm=2)
    assert result["ready"] and len(runner.restarts) == 1
    assert "completion failed" in runner.restarts[0] and "EngineCore died" in runner.restarts[0]
    assert "asking again" in lines[0]
    assert [c for c in fake.calls if c[0] == "stop"] == [("stop", h) for h in NODES]


def test_one_failed_completion_that_the_next_look_contradicts_restarts_nothing():
    fake = FakeGroup([(everyone(ACTIVE), HEALTHY, BROKEN), (everyone(ACTIVE), HEALTHY, OK)])
    result, runner, _ = wait(fake, confirm=2)
    assert result["ready"] and runner.restarts == [] and not [c for c in fake.calls if c[0] == "stop"]


def test_a_group_that_keeps_failing_gives_up_after_its_restarts():
    fake = FakeGroup([(everyone(ACTIVE, **{"ct-b": FAILED}), DOWN, None)])
    with pytest.raises(group.GroupError, match="restarted 2 times already"):
        wait(fake, max_restarts=2)
    assert [c for c in fake.calls if c[0] == "start"].count(("start", "ct-a")) == 2


def test_a_node_that_never_reports_fails_the_wait_naming_it_and_the_fix():
    units = {"ct-a": LOADING, "ct-b": LOADING}
    fake = FakeGroup([(units, DOWN, None)])
    with pytest.raises(group.GroupError, match=r"no state of ct-c .*forks at least"):
        wait(fake, join_timeout=60)


def test_a_group_that_never_serves_times_out_with_what_it_saw():
    fake = FakeGroup([(everyone(LOADING), DOWN, None)])
    with pytest.raises(group.GroupError, match="does not serve after .*the head's health no answer"):
        wait(fake, timeout=100)


@pytest.mark.parametrize(
    ("units", "probe", "completion", "expected"),
    [
        (everyone(ACTIVE), HEALTHY, OK, group.READY),
        (everyone(ACTIVE, **{"ct-b": LOADING}), HEALTHY, OK, group.LOADING),
        (everyone(ACTIVE, **{"ct-b": {"ActiveState": "inactive"}}), HEALTHY, OK, group.RESTART),
        (everyone(ACTIVE), HEALTHY, BROKEN, group.RESTART),
        (everyone(ACTIVE), DOWN, None, group.LOADING),
        ({"ct-a": ACTIVE}, HEALTHY, OK, group.LOADING),
    ],
)
def test_verdict(units, probe, completion, expected):
    assert group.verdict(NODES, units, probe, completion, elapsed=60, grace=30)[0] == expected


def test_an_inactive_rank_gets_its_grace_before_a_restart():
    units = everyone(ACTIVE, **{"ct-b": {"ActiveState": "inactive"}})
    assert group.verdict(NODES, units, DOWN, None, elapsed=5, grace=30)[0] == group.LOADING


class FakeUnit:
    """One node's own unit, as its wait sees it."""

    def __init__(self, state=ACTIVE, fail_stop=False):
        self.state_now, self.fail_stop, self.done = state, fail_stop, []

    def state(self):
        return self.state_now

    def stop(self):
        if self.fail_stop:
            raise RuntimeError("Job for inference-m.service failed")
        self.done.append("stop")
        self.state_now = {"ActiveState": "inactive", "SubState": "dead", "Result": "success"}

    def start(self):
        self.done.append("start")
        self.state_now = ACTIVE


def test_the_heads_commands_reach_the_other_nodes_through_the_board(tmp_path):
    board = group.Board(str(tmp_path / "board.json"))
    worker = FakeUnit(FAILED)
    agent = group.RankAgent(board, "ct-b", worker, join_timeout=30, interval=0.01)
    ended = {}
    thread = threading.Thread(target=lambda: ended.update(agent.run()))
    thread.start()

    class Head(FakeUnit):
        def probe(self):
            return HEALTHY

        def complete(self):
            return OK

    head = Head(ACTIVE)
    ops = group.HeadOps(board, "ct-a", head, command_timeout=30, poll=0.01)
    runner = group.GroupWait(["ct-a", "ct-b"], ops, timeout=60, interval=0.01, join_timeout=30)
    result = runner.run(sleep=lambda _s: threading.Event().wait(0.01), log=lambda _l: None)
    ops.finish(result)
    thread.join(timeout=30)
    assert result["ready"] and len(runner.restarts) == 1 and "rank 1 (ct-b)" in runner.restarts[0]
    assert head.done == ["stop", "start"] and worker.done == ["stop", "start"]
    assert ended == result


def test_a_stop_that_fails_on_another_node_fails_the_group_naming_it(tmp_path):
    board = group.Board(str(tmp_path / "board.json"))
    agent = group.RankAgent(board, "ct-b", FakeUnit(ACTIVE, fail_stop=True), interval=0.01)
    ops = group.HeadOps(board, "ct-a", FakeUnit(), command_timeout=30, poll=0.01)
    thread = threading.Thread(target=agent.run)
    thread.start()
    with pytest.raises(group.GroupError, match="stop of ct-b failed: Job for inference-m.service failed"):
        ops.stop("ct-b")
    ops.finish({"ready": False})
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_rank_whose_head_never_joins_gives_up(tmp_path):
    agent = group.RankAgent(group.Board(str(tmp_path / "b.json")), "ct-b", FakeUnit(), join_timeout=10)
    clock = iter(range(0, 1000, 5))
    with pytest.raises(group.GroupError, match="head's wait never joined"):
        agent.run(clock=lambda: next(clock), sleep=lambda _s: None)
