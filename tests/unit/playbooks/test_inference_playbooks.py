"""validate.yml runs against the stand-in server on this machine (local connection); test_benchmark.py has
benchmark.yml."""

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from localhost import free_port, wait_listening
from nccl_init import RESULT_PREFIX
from playbook_testlib import minimax_site, run_playbook

from inferhost.sim import ENGINE_DIR

STANDIN = ENGINE_DIR / "openai_standin.py"
KEY = "pl4ybook-key"


@pytest.fixture
def site(tmp_path, hardware):
    """A checkpoint, a service environment with the NCCL hook, the secret file, and inventory variables."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.check_output(
        [str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
    ).strip()
    # What nccl_tuning installs in an environment.
    hook = "import os; [os.environ.setdefault(k, v) for k, v in (('NCCL_PROTO', 'LL'), ('NCCL_ALGO', 'Ring'))]\n"
    (tmp_path / purelib / "00-inferhost-nccl.pth").write_text(hook)
    port = free_port()
    settings = [
        {"name": "NCCL_PROTO", "value": "LL", "reason": "r"},
        {"name": "NCCL_ALGO", "value": "Ring", "reason": "r"},
    ]
    site = minimax_site(tmp_path, hardware, KEY, venv, port, nccl_tuning_settings=settings, validate_hosts="localhost")
    return {**site, "port": port}


@pytest.fixture
def standin(site):
    procs = []

    def start(*extra, env=None):
        argv = [sys.executable, str(STANDIN), "serve", "/x/MiniMax-M2.5", "--port", str(site["port"])]
        proc = subprocess.Popen(
            [*argv, "--api-key", KEY, *extra], stdout=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
        procs.append(proc)
        wait_listening(site["port"])
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_validate_checks_nccl_and_answers(site, standin):
    standin()
    time.sleep(0.2)
    rc, out = run_playbook(site, "validate.yml", validate_checks=["nccl", "smoke"])
    assert rc == 0, out[-4000:]
    assert '"NCCL_PROTO": "LL"' in out and '"NCCL_ALGO": "Ring"}, as the inventory says' in out
    assert (
        "3/3 prompts answered well; tool call not checked (no tool-call parser); reasoning not checked (no reasoning "
        "parser); one-token completion ok; vllm:num_requests_running 0"
    ) in out
    assert "What is 17 + 25? Answer with the number only. -> 42" in out


def with_args(site, **args):
    """The site's service with these engine args."""
    return [{**site["vars"]["inference_service_services"][0], "args": args}]


def test_validate_asks_for_the_tool_call_and_the_reasoning_the_command_line_promises(site, standin):
    # As the lab's CPU vLLM runs: a reasoning model that spends max_tokens on reasoning at first.
    parsers = {"reasoning-parser": "qwen3", "enable-auto-tool-choice": True, "tool-call-parser": "hermes"}
    standin(
        *[f"--{k}" if v is True else f"--{k}={v}" for k, v in parsers.items()], env={"STANDIN_REASONING_TOKENS": "300"}
    )
    rc, out = run_playbook(
        site, "validate.yml", validate_checks=["smoke"], inference_service_services=with_args(site, **parsers)
    )
    assert rc == 0, out[-4000:]
    assert (
        "3/3 prompts answered well; 3 answered only after the model had spent max_tokens on reasoning (content null), "
        'given 4096 tokens the second time; tool call get_weather {"city": "Paris"}; reasoning split ('
    ) in out
    assert "; one-token completion ok; vllm:num_requests_running 0" in out


def test_validate_fails_when_the_service_promises_what_the_engine_does_not_do(site, standin):
    standin()  # no parser on the engine's command line, whatever the inventory says
    parsers = {"reasoning-parser": "qwen3", "enable-auto-tool-choice": True, "tool-call-parser": "hermes"}
    rc, out = run_playbook(
        site, "validate.yml", validate_checks=["smoke"], inference_service_services=with_args(site, **parsers)
    )
    assert rc != 0
    assert "mm: 3/3 prompts answered well; tool call failed; reasoning not split; one-token completion ok" in out
    assert '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set' in out


def test_validate_fails_at_once_when_generation_is_dead_though_health_answers(site, standin):
    standin()
    url = f"http://127.0.0.1:{site['port']}"
    urllib.request.urlopen(urllib.request.Request(url + "/standin/generation-dead", data=b"{}"), timeout=10).close()
    with urllib.request.urlopen(url + "/health", timeout=10) as health:
        assert health.status == 200
    rc, out = run_playbook(site, "validate.yml", validate_checks=["smoke"])
    assert rc != 0
    assert (
        "mm: the one-token completion (POST /v1/completions, max_tokens 1) answered HTTP 500: EngineCore encountered "
        "an issue. See stack trace (above) for the root cause. Nothing else was asked"
    ) in out


def test_validate_fails_on_a_wrong_answer_and_on_missing_nccl_settings(site, standin):
    standin()
    prompts = [{"prompt": "What is the capital of France?", "expect": "Lyon"}]
    rc, out = run_playbook(site, "validate.yml", validate_checks=["smoke"], validate_prompts=prompts)
    assert rc != 0 and "the answer does not contain 'Lyon'" in out
    wanted = [*site["vars"]["nccl_tuning_settings"], {"name": "NCCL_P2P_LEVEL", "value": "SYS", "reason": "r"}]
    rc, out = run_playbook(site, "validate.yml", validate_checks=["nccl"], nccl_tuning_settings=wanted)
    assert rc != 0 and "wrong or missing: NCCL_P2P_LEVEL" in out


def fake_python(directory, lines):
    """An "environment" whose python prints what NCCL would print (this machine has no GPU)."""
    (directory / "bin").mkdir(parents=True)
    script = directory / "bin/python"
    body = "".join(f"echo {json.dumps(line)}\n" for line in lines)
    script.write_text(f'#!/bin/sh\necho "argv: $*"; env | grep -E "^(NCCL|KEEP)" | sed "s/^/env: /"\n{body}')
    script.chmod(0o755)
    return directory


def probe_result(world, **environment):
    """The probe's result line: the world size and the NCCL variables of its process."""
    result = {"world_size": world, "nccl_version": "2.28.9", "environment": environment}
    return RESULT_PREFIX + json.dumps(result)


def test_nccl_init_check_on_one_gpu_confirms_what_one_rank_reports(site):
    # What NCCL 2.28.9 logged on one H200: one rank chooses no protocol or algorithm, so no PROTO or ALGO line.
    env = fake_python(
        site["tmp"] / "gpu-env",
        [
            "h:1:1 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS",
            "h:1:1 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.",
            probe_result(1, NCCL_ALGO="Ring", NCCL_P2P_LEVEL="SYS", NCCL_PROTO="LL"),
            "validate-nccl-init: all-reduce correct on 1 GPU(s), NCCL 2.28.9",
        ],
    )
    service = {**site["vars"]["inference_service_services"][0], "environment": str(env)}
    settings = [*site["vars"]["nccl_tuning_settings"], {"name": "NCCL_P2P_LEVEL", "value": "SYS", "reason": "r"}]
    rc, out = run_playbook(
        site,
        "validate.yml",
        validate_checks=["nccl_init"],
        inference_service_services=[service],
        nccl_tuning_settings=settings,
        validate_nccl_init_env={"KEEP_ME": "1"},
    )
    assert rc == 0, out[-4000:]
    assert "NCCL 2.28.9 on 1 GPU(s): all-reduce correct; reported NCCL_P2P_LEVEL=SYS;" in out
    assert "NCCL_PROTO=LL, NCCL_ALGO=Ring only in the environment of the probe, not NCCL-confirmed" in out
    # NCCL ends some of these lines with a full stop; it is not part of the value
    assert "not from the inventory: NCCL_NVLS_ENABLE=0" in out and "=0." not in out


def test_nccl_init_check_on_two_gpus_needs_nccl_to_report_every_setting(site):
    env = fake_python(
        site["tmp"] / "gpu-env",
        [
            "h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to Simple",
            probe_result(2, NCCL_ALGO="Ring", NCCL_PROTO="LL"),
        ],
    )
    service = {**site["vars"]["inference_service_services"][0], "environment": str(env)}
    rc, out = run_playbook(site, "validate.yml", validate_checks=["nccl_init"], inference_service_services=[service])
    assert rc != 0
    wrong = "NCCL_PROTO=LL (NCCL reported Simple), NCCL_ALGO=Ring (NCCL did not report it)"
    assert f"NCCL 2.28.9 on 2 GPU(s) did not take {wrong}" in out
