"""pve_cluster_quorum: the cluster's status in words (quorum() of the API client), and the wait against fakepve:
quorum lost then back, never back, the node offline, an API that does not answer."""

import itertools

import pytest
from pve_testlib import api_args, load_module, run_module

MODULE = load_module("pve_cluster_quorum")
# The client as the module imports it (ansible.module_utils.pve_api), whose ApiError the wait catches.
Client, Login, quorum = MODULE.Client, MODULE.Login, MODULE.quorum


def rows(quorate=1, **online):
    cluster = (
        [{"type": "cluster", "name": "dc", "quorate": quorate, "nodes": len(online)}] if quorate is not None else []
    )
    return cluster + [{"type": "node", "name": name, "online": up} for name, up in online.items()]


@pytest.mark.parametrize(
    ("status", "node", "quorate", "words"),
    [
        (rows(1, pve1=1, pve2=1), "pve1", True, "cluster dc quorate: 2 of 2 nodes online"),
        (
            rows(0, pve1=1, pve2=0, pve3=0),
            "pve1",
            False,
            "cluster dc NOT quorate: 1 of 3 nodes online (offline: pve2, pve3)",
        ),
        (rows(1, pve1=1, pve2=1, pve3=0), "pve1", True, "2 of 3 nodes online (offline: pve3)"),
        (rows(1, pve1=0, pve2=1, pve3=1), "pve1", False, "node pve1 is offline"),
        (rows(1, pve2=1), "pve1", False, "node pve1 is not in the cluster's status"),
        # A node outside any cluster: no cluster row, quorate by itself.
        (rows(None, pve1=1), "pve1", True, "a single node outside any cluster"),
    ],
)
def test_the_status_in_words(status, node, quorate, words):
    ok, seen = quorum(status, node)
    assert ok is quorate
    assert words in seen


@pytest.fixture
def args(fakepve, fakepve_cafile):
    fakepve.add_node("pve2")

    def make(**kw):
        return api_args(fakepve, fakepve_cafile, **kw)

    return make


def client(fakepve, fakepve_cafile, port=None):
    login = Login(host=fakepve.host, port=port or fakepve.port, secret="secret", ca_file=fakepve_cafile)
    return Client(login, "pve1", attempts=1, sleep=lambda _: None)


def test_a_quorate_cluster_passes_at_the_first_read(fakepve, args):
    result = run_module(MODULE, args())
    assert result["quorate"] is True, result
    assert (result["changed"], result["reads"]) == (False, 1)
    assert result["msg"] == "pve1: cluster fakecluster quorate: 2 of 2 nodes online"


def test_quorum_lost_then_back_is_waited_for(fakepve, fakepve_cafile):
    fakepve.lose_quorum()
    pauses = []

    def sleep(seconds):
        pauses.append(seconds)
        if len(pauses) == 2:
            fakepve.regain_quorum()

    ok, seen, reads = MODULE.wait_for_quorum(
        client(fakepve, fakepve_cafile), "pve1", 600, 5, clock=itertools.count().__next__, sleep=sleep
    )
    assert (ok, reads, pauses) == (True, 3, [5, 5])
    assert seen == "cluster fakecluster quorate: 1 of 1 nodes online"


def test_quorum_that_does_not_come_back_fails_saying_what_was_seen(fakepve, args):
    fakepve.lose_quorum()
    result = run_module(MODULE, args(timeout=0, context="pve1"))
    assert result.get("failed"), result
    assert result["msg"].startswith("pve1: pve1: no quorum within 0 s; last seen: cluster fakecluster NOT quorate")


def test_the_node_offline_in_the_cluster_is_not_back(fakepve, args):
    fakepve.set_node_offline("pve2")
    assert run_module(MODULE, args(timeout=0))["quorate"] is True
    result = run_module(MODULE, args(timeout=0, node="pve2"))
    assert result.get("failed"), result
    assert "node pve2 is offline" in result["msg"]


def test_an_api_that_does_not_answer_yet_is_asked_again(fakepve, fakepve_cafile):
    down = client(fakepve, fakepve_cafile, port=1)  # nothing listens there
    clock = itertools.count(step=10).__next__
    ok, seen, reads = MODULE.wait_for_quorum(down, "pve1", 25, 5, clock=clock, sleep=lambda _: None)
    assert (ok, reads) == (False, 3)
    assert seen.startswith("the API did not answer: ")


def test_a_negative_timeout_is_refused(fakepve, args):
    result = run_module(MODULE, args(timeout=-1))
    assert result.get("failed"), result
    assert "timeout is -1; expected a number of seconds of at least 0" in result["msg"]
