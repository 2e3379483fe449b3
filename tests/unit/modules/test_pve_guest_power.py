"""pve_guest_power against fakepve: the running GPU guests of one node recorded and shut down, only those started
again, a guest that does not shut down in time refused (or stopped hard when allowed), bad guests refused first."""

import pytest
from pve_testlib import api_args, load_module, run_module

MODULE = load_module("pve_guest_power")
GUESTS = [{"vmid": 101, "type": "lxc"}, {"vmid": 201, "type": "qemu"}, {"vmid": 102, "type": "lxc"}]


@pytest.fixture
def pve(fakepve):
    """Node pve1: CT 101 and CT 102 running, VM 201 stopped. Node pve2 (another host): CT 301 running."""
    fakepve.add_ct(101, "inference-ct", node="pve1", status="running")
    fakepve.add_vm(201, "inference-vm", node="pve1", status="stopped")
    fakepve.add_ct(102, "inference-ct2", node="pve1", status="running")
    fakepve.add_ct(301, "other-ct", node="pve2", status="running")
    return fakepve


@pytest.fixture
def args(pve, fakepve_cafile):
    def make(**kw):
        return api_args(pve, fakepve_cafile, **{"guests": GUESTS, **kw})

    return make


def status(pve):
    return {vmid: pve.guest(vmid).status for vmid in (101, 102, 201, 301)}


def power_posts(pve):
    """The power actions asked of the API, in order: [(vmid, action)]."""
    posts = [path.split("/") for method, path, _ in pve.requests if method == "POST" and "/status/" in path]
    return [(int(parts[parts.index("status") - 1]), parts[-1]) for parts in posts]


def test_the_running_guests_are_recorded_and_shut_down_in_order(pve, args):
    result = run_module(MODULE, args(state="stopped"))
    assert result["changed"] is True, result
    assert result["running"] == [{"vmid": 101, "type": "lxc"}, {"vmid": 102, "type": "lxc"}]
    assert result["stopped"] == ["CT 101", "CT 102"]
    assert power_posts(pve) == [(101, "shutdown"), (102, "shutdown")]
    # The stopped VM is not touched, nor another node's guest.
    assert status(pve) == {101: "stopped", 102: "stopped", 201: "stopped", 301: "running"}
    assert "pve1" in result["msg"]


def test_only_the_guests_that_ran_are_started_again(pve, args):
    stop = run_module(MODULE, args(state="stopped"))
    start = run_module(MODULE, args(state="started", guests=stop["running"]))
    assert start["changed"] is True, start
    assert start["started"] == ["CT 101", "CT 102"]
    assert status(pve) == {101: "running", 102: "running", 201: "stopped", 301: "running"}
    assert (201, "start") not in power_posts(pve)


def test_a_guest_already_running_is_left_alone_by_the_start(pve, args):
    result = run_module(MODULE, args(state="started", guests=[{"vmid": 101, "type": "lxc"}]))
    assert result["changed"] is False, result
    assert result["started"] == []
    assert power_posts(pve) == []


def test_nothing_running_means_nothing_to_do(pve, args):
    result = run_module(MODULE, args(state="stopped", guests=[{"vmid": 201, "type": "qemu"}]))
    assert (result["changed"], result["running"], power_posts(pve)) == (False, [], [])


def test_check_mode_records_and_reports_but_stops_nothing(pve, args):
    result = run_module(MODULE, args(state="stopped"), check_mode=True)
    assert result["changed"] is True, result
    assert result["running"] == [{"vmid": 101, "type": "lxc"}, {"vmid": 102, "type": "lxc"}]
    assert "would shut down CT 101, CT 102" in result["msg"]
    assert power_posts(pve) == []
    assert status(pve)[101] == "running"


def test_a_guest_that_does_not_shut_down_in_time_is_refused_and_the_next_one_is_left_running(pve, args):
    pve.guest(101).shutdown_secs = 10_000
    result = run_module(MODULE, args(state="stopped", timeout=5))
    assert result.get("failed"), result
    assert "CT 101 did not shut down within 5 s" in result["msg"]
    assert "pve1 was not rebooted" in result["msg"]
    assert "--force" not in result["msg"]
    assert result["running"] == [{"vmid": 101, "type": "lxc"}, {"vmid": 102, "type": "lxc"}]
    assert status(pve) == {101: "running", 102: "running", 201: "stopped", 301: "running"}
    assert (102, "shutdown") not in power_posts(pve)


def test_force_stops_a_guest_hard_that_does_not_shut_down_in_time(pve, args):
    pve.guest(101).shutdown_secs = 10_000
    result = run_module(MODULE, args(state="stopped", timeout=5, force=True))
    assert result["changed"] is True, result
    assert result["stopped"] == ["CT 101", "CT 102"]
    assert (101, "stop") in power_posts(pve)
    assert status(pve)[101] == "stopped"


def test_a_guest_the_node_lacks_is_refused_before_anything_is_stopped(pve, args):
    guests = [*GUESTS, {"vmid": 301, "type": "lxc"}, {"vmid": 999, "type": "qemu"}]
    result = run_module(MODULE, args(state="stopped", guests=guests, context="pve1"))
    assert result.get("failed"), result
    assert result["msg"].startswith("pve1: node pve1 has no CT 301, VM 999")
    assert power_posts(pve) == []
    assert status(pve)[101] == "running"


def test_a_start_that_fails_names_the_guest_and_what_was_started(pve, args):
    pve.guest(201).start_error = "no such disk"
    guests = [{"vmid": 201, "type": "qemu"}, {"vmid": 101, "type": "lxc"}]
    pve.guest(101).status = "stopped"
    result = run_module(MODULE, args(state="started", guests=guests))
    assert result.get("failed"), result
    assert "start VM 201" in result["msg"]
    assert "not started: VM 201, CT 101" in result["msg"]
    assert status(pve)[101] == "stopped"


@pytest.mark.parametrize("name", ["timeout", "task_timeout"])
def test_a_timeout_below_one_second_is_refused(args, pve, name):
    result = run_module(MODULE, args(state="stopped", **{name: 0}))
    assert result.get("failed"), result
    assert f"{name} is 0; expected a number of seconds of at least 1" in result["msg"]
    assert power_posts(pve) == []
