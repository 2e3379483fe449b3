"""Whether NCCL took the inventory's settings, on one GPU and on several (plugins/filter/nccl_init.py)."""

import json

import pytest
from nccl_init import nccl_init_verdict

SETTINGS = [
    {"name": "NCCL_PROTO", "value": "LL", "reason": "r"},
    {"name": "NCCL_ALGO", "value": "Ring", "reason": "r"},
    {"name": "NCCL_P2P_LEVEL", "value": "SYS", "reason": "r"},
]
ENVIRONMENT = {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "INFO", "NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL"}


def nccl(name, value, rank=0):
    """One line as NCCL 2.28.9 logs it with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV."""
    pid = 4211 + rank
    return f"gpu-host:{pid}:{pid} [{rank}] NCCL INFO {name} set by environment to {value}"


def output(world, *reported, environment=ENVIRONMENT):
    """The probe's stdout: NCCL's lines of each rank, then rank 0's result line and the closing line."""
    lines = [
        "gpu-host:4211:4211 [0] NCCL INFO cudaDriverVersion 13000",
        "gpu-host:4211:4211 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
    ]
    lines += [nccl(name, value, rank) for rank in range(world) for name, value in reported]
    result = {"world_size": world, "nccl_version": "2.28.9", "environment": environment}
    lines.append("validate-nccl-init: result " + json.dumps(result))
    lines.append(f"validate-nccl-init: all-reduce correct on {world} GPU(s), NCCL 2.28.9")
    return lines


# What a real H200 logged with one process: NCCL_P2P_LEVEL and the machine's own NCCL_NVLS_ENABLE, with the
# full stop NCCL puts after some values.
ONE_RANK = [("NCCL_P2P_LEVEL", "SYS"), ("NCCL_NVLS_ENABLE", "0.")]
ALL = [("NCCL_PROTO", "LL"), ("NCCL_ALGO", "Ring"), ("NCCL_P2P_LEVEL", "SYS")]


def test_one_rank_passes_without_proto_and_algo_and_says_they_are_unconfirmed():
    verdict = nccl_init_verdict(output(1, *ONE_RANK), SETTINGS)
    assert verdict["ok"] is True and verdict["world_size"] == 1
    assert verdict["confirmed"] == ["NCCL_P2P_LEVEL=SYS"]
    assert verdict["environment_only"] == ["NCCL_PROTO=LL", "NCCL_ALGO=Ring"]
    assert verdict["wrong"] == []
    assert verdict["reported"] == ["NCCL_P2P_LEVEL=SYS", "NCCL_NVLS_ENABLE=0"]
    assert verdict["msg"] == (
        "NCCL 2.28.9 on 1 GPU(s): all-reduce correct; reported NCCL_P2P_LEVEL=SYS; "
        "NCCL_PROTO=LL, NCCL_ALGO=Ring only in the environment of the probe, not NCCL-confirmed: one rank selects no "
        "algorithm or protocol, so NCCL reads neither (run on 2 or more GPUs to confirm); "
        "also reported, not from the inventory: NCCL_NVLS_ENABLE=0"
    )


def test_one_rank_fails_when_nccl_does_not_report_p2p_level():
    verdict = nccl_init_verdict(output(1, ("NCCL_NVLS_ENABLE", "0.")), SETTINGS)
    assert verdict["ok"] is False
    assert verdict["wrong"] == ["NCCL_P2P_LEVEL=SYS (NCCL did not report it)"]
    assert verdict["msg"].startswith("NCCL 2.28.9 on 1 GPU(s) did not take NCCL_P2P_LEVEL=SYS (NCCL did not report")


@pytest.mark.parametrize(
    ("environment", "why"),
    [
        ({"NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}, "NCCL_PROTO=LL (not in the environment of the probe)"),
        (
            {**ENVIRONMENT, "NCCL_PROTO": "Simple"},
            "NCCL_PROTO=LL (the environment of the probe has NCCL_PROTO=Simple)",
        ),
    ],
)
def test_one_rank_fails_when_the_environment_lacks_proto(environment, why):
    verdict = nccl_init_verdict(output(1, *ONE_RANK, environment=environment), SETTINGS)
    assert verdict["ok"] is False
    assert verdict["wrong"] == [why]
    assert verdict["environment_only"] == ["NCCL_ALGO=Ring"]


def test_one_rank_takes_proto_that_nccl_reports_after_all():
    verdict = nccl_init_verdict(output(1, *ALL, environment={}), SETTINGS)
    assert verdict["ok"] is True
    assert verdict["confirmed"] == ["NCCL_PROTO=LL", "NCCL_ALGO=Ring", "NCCL_P2P_LEVEL=SYS"]
    assert verdict["environment_only"] == []


@pytest.mark.parametrize("world", [2, 8])
def test_several_ranks_pass_when_nccl_reports_every_setting(world):
    verdict = nccl_init_verdict(output(world, *ALL, ("NCCL_NVLS_ENABLE", "0.")), SETTINGS)
    assert verdict["ok"] is True and verdict["world_size"] == world
    assert verdict["confirmed"] == ["NCCL_PROTO=LL", "NCCL_ALGO=Ring", "NCCL_P2P_LEVEL=SYS"]
    assert verdict["environment_only"] == []
    assert verdict["msg"] == (
        f"NCCL 2.28.9 on {world} GPU(s): all-reduce correct; "
        "reported NCCL_PROTO=LL, NCCL_ALGO=Ring, NCCL_P2P_LEVEL=SYS; "
        "also reported, not from the inventory: NCCL_NVLS_ENABLE=0"
    )


def test_several_ranks_fail_when_nccl_does_not_report_proto_even_if_the_environment_has_it():
    verdict = nccl_init_verdict(output(2, *ONE_RANK, ("NCCL_ALGO", "Ring")), SETTINGS)
    assert verdict["ok"] is False
    assert verdict["wrong"] == ["NCCL_PROTO=LL (NCCL did not report it)"]
    assert verdict["environment_only"] == []
    assert verdict["msg"] == (
        "NCCL 2.28.9 on 2 GPU(s) did not take NCCL_PROTO=LL (NCCL did not report it); "
        "it reported NCCL_ALGO=Ring, NCCL_P2P_LEVEL=SYS; also reported, not from the inventory: NCCL_NVLS_ENABLE=0"
    )


def test_a_value_nccl_reports_differently_is_wrong():
    verdict = nccl_init_verdict(output(2, ("NCCL_PROTO", "Simple"), *ALL[1:]), SETTINGS)
    assert verdict["wrong"] == ["NCCL_PROTO=LL (NCCL reported Simple)"]


def test_inventory_values_compare_as_text():
    settings = [{"name": "NCCL_NVLS_ENABLE", "value": 0, "reason": "r"}]
    assert nccl_init_verdict(output(2, ("NCCL_NVLS_ENABLE", "0.")), settings)["confirmed"] == ["NCCL_NVLS_ENABLE=0"]


def test_output_without_the_result_line_fails_and_quotes_its_end():
    lines = output(1, *ONE_RANK)
    lines = [line for line in lines if not line.startswith("validate-nccl-init: result")]
    verdict = nccl_init_verdict(lines, SETTINGS)
    assert verdict["ok"] is False and verdict["world_size"] is None
    assert verdict["msg"].startswith('The NCCL probe printed no line starting "validate-nccl-init: result"')
    assert "all-reduce correct on 1 GPU(s)" in verdict["msg"]
