"""The watchdog between plays: a service is judged by what it generates, never by /health; failed judgments in a row
restart it, with backoff and a limit after which it is left stopped with the reason; a loading, stopped or paused
service is never touched. Driven with a fake unit, a fake API and a clock."""

import json

import pytest
from inference import watchdog as wd

ACTIVE = {"ActiveState": "active", "SubState": "running", "Result": "success"}
LOADING = {"ActiveState": "activating", "SubState": "start-post", "Result": "success"}
STOPPED = {"ActiveState": "inactive", "SubState": "dead", "Result": "success"}
FAILED = {"ActiveState": "failed", "SubState": "failed", "Result": "start-limit-hit"}
SERVICE = wd.Service(name="svc", unit="inference-svc.service", url="http://127.0.0.1:8000", model="m", engine="vllm")


def metrics(running=0, waiting=0, generated=0, prompt=0):
    return {
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": waiting,
        "vllm:generation_tokens_total": generated,
        "vllm:prompt_tokens_total": prompt,
    }


class Fake:
    """The unit's state, the API's answers and a clock, set by the test; records what the watchdog did."""

    def __init__(self):
        self.state = dict(ACTIVE)
        self.answer = {"ok": True, "problem": ""}
        self.figures = metrics()
        self.now = 1000.0
        self.calls = []

    # systemd
    def show(self, unit):
        return dict(self.state)

    def restart(self, unit):
        self.calls.append(("restart", unit))
        self.state = dict(LOADING)

    def start(self, unit):
        self.calls.append(("start", unit))
        self.state = dict(LOADING)

    def stop(self, unit):
        self.calls.append(("stop", unit))
        self.state = dict(STOPPED)

    # the API
    def metrics(self):
        return self.figures

    def complete(self):
        self.calls.append(("complete",))
        return self.answer

    def clock(self):
        return self.now


def make(fake, pause_file="", **settings):
    values = {"failures": 2, "max_restarts": 2, "backoff_s": 60, "restart_window_s": 3600, "busy_window_s": 60}
    return wd.Watchdog(
        SERVICE,
        wd.Settings(**{**values, **settings}),
        systemd=fake,
        api=fake,
        clock=fake.clock,
        pause_file=pause_file,
    )


def restarts(fake):
    return [c for c in fake.calls if c[0] in ("restart", "start", "stop")]


def test_an_idle_service_is_judged_by_a_completion_and_left_alone_while_it_answers():
    fake = Fake()
    dog = make(fake)
    for _ in range(5):
        assert "completion came back" in dog.look()
        fake.now += 10
    assert fake.calls.count(("complete",)) == 5 and not restarts(fake)
    assert dog.state()["verdict"] == wd.OK


def test_a_hung_engine_that_still_answers_health_is_restarted_after_the_failures_in_a_row():
    fake = Fake()
    dog = make(fake)
    fake.answer = {"ok": False, "problem": "POST /v1/completions answered no answer: timed out"}
    assert "1/2 in a row" in dog.look() and not restarts(fake)
    fake.now += 10
    dog.look()
    assert restarts(fake) == [("restart", SERVICE.unit)]
    entry = dog.state()
    assert len(entry["restarts"]) == 1 and "timed out" in entry["restarts"][0]["reason"]


def test_one_failed_judgment_between_good_ones_restarts_nothing():
    fake = Fake()
    dog = make(fake)
    for ok in (False, True, False, True, False):
        fake.answer = {"ok": ok, "problem": "" if ok else "answered 500"}
        dog.look()
        fake.now += 10
    assert not restarts(fake)


def test_a_busy_service_is_judged_by_its_token_counters_not_by_a_completion_that_would_queue():
    fake = Fake()
    dog = make(fake, busy_window_s=30)
    fake.answer = {"ok": False, "problem": "would queue behind 64 requests"}
    for step in range(6):
        fake.figures = metrics(running=64, generated=100 * step)
        assert "counters moving" in dog.look()
        fake.now += 10
    assert ("complete",) not in fake.calls and not restarts(fake)
    assert dog.state()["judged"] == {"idle": 0, "busy": 6}


def test_a_busy_service_whose_counters_stand_still_past_the_window_is_restarted():
    fake = Fake()
    dog = make(fake, busy_window_s=30)
    fake.figures = metrics(running=3, generated=500)
    dog.look()
    verdicts = []
    for _ in range(5):
        fake.now += 10
        verdicts.append(dog.look())
    assert "no token counted for 30 s" in verdicts[2]
    assert restarts(fake) == [("restart", SERVICE.unit)]


@pytest.mark.parametrize("state", [LOADING, STOPPED])
def test_a_loading_or_stopped_unit_is_never_judged_nor_touched(state):
    fake = Fake()
    fake.state = dict(state)
    fake.answer = {"ok": False, "problem": "refused"}
    dog = make(fake)
    for _ in range(5):
        dog.look()
        fake.now += 10
    assert fake.calls == []


def test_a_pause_in_force_keeps_its_hands_off_and_ends_by_itself(tmp_path):
    pause = tmp_path / "pause.json"
    fake = Fake()
    fake.answer = {"ok": False, "problem": "restarting"}
    wd.main(["pause", "--file", str(pause), "--for", "60", "--reason", "the role restarts it"])
    dog = make(fake, pause_file=str(pause))
    dog.clock = lambda: json.loads(pause.read_text())["until"] - 30
    for _ in range(4):
        assert "paused: the role restarts it" in dog.look()
    assert fake.calls == []
    dog.clock = lambda: json.loads(pause.read_text())["until"] + 1  # the lease ran out: a play died
    dog.look()
    dog.look()
    assert restarts(fake) == [("restart", SERVICE.unit)]
    wd.main(["pause", "--file", str(pause), "--for", "0"])
    assert not pause.exists()


def test_restarts_back_off_and_give_up_leaving_the_service_stopped_with_the_reason():
    fake = Fake()
    dog = make(fake, max_restarts=2, backoff_s=60)
    fake.answer = {"ok": False, "problem": "answered 500: EngineDeadError"}

    def fail_twice():
        fake.state = dict(ACTIVE)
        dog.look()
        fake.now += 10
        dog.look()
        fake.now += 10

    fail_twice()
    assert restarts(fake) == [("restart", SERVICE.unit)]
    fail_twice()  # 20 s after the first restart: within the backoff
    assert len(restarts(fake)) == 1 and "backoff" in dog.state()["reason"]
    fake.now += 60
    fail_twice()
    assert len(restarts(fake)) == 2
    fail_twice()  # the limit: stopped and left so
    assert restarts(fake)[-1] == ("stop", SERVICE.unit)
    given_up = dog.state()["given_up"]
    assert "EngineDeadError" in given_up and "2 times" in given_up
    for _ in range(3):
        fake.now += 1000
        assert "given up" in dog.look()
    assert len(restarts(fake)) == 3


def test_a_unit_that_failed_on_its_own_is_started_again_within_the_budget():
    fake = Fake()
    fake.state = dict(FAILED)
    dog = make(fake)
    dog.look()
    assert restarts(fake) == [("start", SERVICE.unit)]
    assert "start-limit-hit" in dog.state()["restarts"][0]["reason"]


def test_the_restarts_survive_a_restart_of_the_watchdog(tmp_path):
    fake = Fake()
    dog = make(fake)
    fake.answer = {"ok": False, "problem": "hung"}
    dog.look()
    dog.look()
    state = tmp_path / "state.json"
    wd.write_state(str(state), [dog], fake.now)
    again = make(Fake())
    wd.remembered(again, wd.read_state(str(state)))
    assert again.memory.restarts == dog.memory.restarts and len(again.memory.restarts) == 1


def test_prometheus_text_is_summed_over_labels():
    text = (
        "# HELP vllm:num_requests_running Number of requests\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
        'vllm:generation_tokens_total{model_name="a,b} c"} 7\n'
        "process_open_fds 12\n"
        "broken_line\n"
    )
    sums = wd.metric_sums(text)
    assert sums["vllm:num_requests_running"] == 5.0
    assert sums["vllm:generation_tokens_total"] == 7.0
    assert sums["process_open_fds"] == 12.0 and "broken_line" not in sums
