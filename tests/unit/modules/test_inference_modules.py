"""The Ansible modules around the pure checks: inference_service_plan and inference_checkpoint_edit."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from inference_refdata import MODELS, REFERENCE, ROLE
from localhost import free_port, wait_listening
from module_runner import load_module, run_module

from inferhost.sim import ENGINE_DIR

PLAN = load_module("inference_service_plan")
EDIT = load_module("inference_checkpoint_edit")
RULES = yaml.safe_load((ROLE / "vars/main.yml").read_text())["__inference_service_known_bad"]


def at_fixtures(services):
    out = []
    for name, service in services.items():
        out.append({**service, "model": {**service["model"], "path": str(MODELS / REFERENCE[name])}})
    return out


def plan_args(services, **kw):
    args = {
        "services": at_fixtures(services),
        "active": "qwen35",
        "known_bad": RULES,
        "compute_capability": "12.0",
        "gpu_count": 8,
    }
    args.update(kw)
    return args


def test_reference_services_planned_with_units_and_conflicts(services):
    result = run_module(PLAN, plan_args(services))
    assert not result.get("failed"), result.get("msg")
    by_name = {s["name"]: s for s in result["services"]}
    assert by_name["qwen35"]["unit"] == "inference-qwen35.service"
    assert by_name["qwen35"]["conflicts"] == ["inference-kimi-k25.service", "inference-minimax-m25.service"]
    assert by_name["qwen35"]["exec_start"].startswith(
        "/opt/venvs/sglang/bin/python /usr/local/libexec/inferhost/sglang-launch --model-path "
    )
    assert "--api-key" not in by_name["qwen35"]["exec_start"]
    assert by_name["qwen35"]["engine"] == "sglang"
    assert '"CUDA_VISIBLE_DEVICES=0,1,2,3"' in by_name["minimax-m25"]["environment_lines"]


def test_refusal_fails_the_module_with_every_reason(services):
    broken = dict(services)
    broken["minimax-m25"] = {**services["minimax-m25"], "gpus": list(range(8)), "tensor_parallel_size": 8}
    result = run_module(PLAN, plan_args(broken))
    assert result["failed"] and result["refused"]
    assert "service minimax-m25 refused before anything is installed:" in result["msg"]
    assert "1536/8 = 192 per GPU is not a multiple of the FP8 weight block 128" in result["msg"]


def test_expert_parallel_is_warned_with_the_ceilings_of_the_hardware_profile(services, hardware):
    with_ep = dict(services)
    with_ep["kimi-k25"] = {**services["kimi-k25"], "expert_parallel": True}
    result = run_module(PLAN, plan_args(with_ep, hardware=hardware))
    assert not result.get("failed"), result.get("msg")
    kimi = next(s for s in result["services"] if s["name"] == "kimi-k25")
    assert any("118.5 tok/s with expert parallel and 140.1 tok/s without it" in w for w in kimi["warnings"])
    assert "kimi-k25: expert_parallel: the single-stream decode ceiling" in json.dumps(result["warnings"])
    others = [w for s in result["services"] if s["name"] != "kimi-k25" for w in s["warnings"]]
    assert not [w for w in others if "expert_parallel" in w]


def test_inactive_service_without_checkpoint_is_only_a_warning(services):
    args = plan_args(services)
    args["services"][1]["model"]["path"] = "/nonexistent/Kimi-K2.5"
    result = run_module(PLAN, args)
    assert not result.get("failed"), result.get("msg")
    assert "no checkpoint at /nonexistent/Kimi-K2.5 yet" in json.dumps(result["warnings"])
    result = run_module(PLAN, {**args, "active": "kimi-k25"})
    assert result["failed"] and "no config.json under /nonexistent/Kimi-K2.5" in result["msg"]


def test_engine_version_read_from_the_venv(services, tmp_path):
    dist = tmp_path / "venv/lib/python3.12/site-packages/vllm-0.16.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.16.0\n\nlong description\n")
    assert PLAN.installed_version(str(tmp_path / "venv"), "vllm") == "0.16.0"
    assert PLAN.installed_version(str(tmp_path / "venv"), "sglang") is None
    kimi = {
        **services["kimi-k25"],
        "environment": str(tmp_path / "venv"),
        "kv_cache_dtype": "fp8",
        "allow_fp8_kv_cache": True,
    }
    result = run_module(PLAN, plan_args({**services, "kimi-k25": kimi}, fail_on_refusal=False))
    kimi_result = next(s for s in result["services"] if s["name"] == "kimi-k25")
    assert kimi_result["engine_version"] == "0.16.0"
    assert [r["id"] for r in kimi_result["refusals"]] == ["sm120-vllm-triton-mla-fp8-kv"]


def test_duplicate_names_and_unknown_active_are_errors(services):
    args = plan_args(services)
    args["services"].append(args["services"][0])
    assert "names qwen35 more than once" in run_module(PLAN, args)["msg"]
    assert "'nope' is not one of the services" in run_module(PLAN, plan_args(services, active="nope"))["msg"]


@pytest.fixture
def quant_file(checkpoint):
    return checkpoint(REFERENCE["qwen35"]) / "hf_quant_config.json"


def test_edit_removes_key_with_backup_and_diff(quant_file):
    result = run_module(EDIT, {"path": str(quant_file), "key": "quantization.kv_cache_quant_algo"})
    assert result["changed"] and result["before"] == "FP8"
    assert "kv_cache_quant_algo" not in json.loads(quant_file.read_text())["quantization"]
    backup = json.loads(Path(result["backup_file"]).read_text())
    assert backup["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert '"kv_cache_quant_algo": "FP8"' in result["diff"]["before"]
    again = run_module(EDIT, {"path": str(quant_file), "key": "quantization.kv_cache_quant_algo"})
    assert again["changed"] is False and "backup_file" not in again


def test_edit_in_check_mode_writes_nothing(quant_file):
    original = quant_file.read_text()
    result = run_module(EDIT, {"path": str(quant_file), "key": "quantization.group_size", "_ansible_check_mode": True})
    assert result["changed"] and quant_file.read_text() == original
    assert len(list(quant_file.parent.iterdir())) == 2  # no backup either


def test_edit_sets_nested_value(quant_file):
    args = {"path": str(quant_file), "key": "quantization.extra.flag", "state": "present", "value": [1, 2]}
    result = run_module(EDIT, args)
    assert result["changed"]
    assert json.loads(quant_file.read_text())["quantization"]["extra"]["flag"] == [1, 2]


def test_edit_errors(tmp_path, quant_file):
    assert "does not exist" in run_module(EDIT, {"path": str(tmp_path / "none.json"), "key": "a"})["msg"]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert run_module(EDIT, {"path": str(bad), "key": "a"})["failed"]
    result = run_module(EDIT, {"path": str(quant_file), "key": "producer.name.x", "state": "present", "value": 1})
    assert "producer.name is not a JSON object" in result["msg"]


GPU = load_module("inference_gpu_facts")
SMOKE = load_module("inference_smoke")


def test_gpu_facts_from_nvidia_smi_when_the_module_files_are_hidden(tmp_path, monkeypatch):
    smi = tmp_path / "bin/nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 00000000:19:00.0, 580.159.03, 3'\n")
    smi.chmod(0o755)
    node = tmp_path / "nvidia0"
    node.write_text("")
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    result = run_module(GPU, {"cuda": False, "device_paths": [str(node), str(tmp_path / "nvidia-uvm")]})
    assert result["nvidia_smi"]["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "pci_bus_id": "00000000:19:00.0",
            "driver_version": "580.159.03",
            "memory_used_mib": 3,
        }
    ]
    if result["kernel_module_source"] == "nvidia-smi":  # this machine has no nvidia module loaded
        assert result["kernel_module_version"] == "580.159.03"
    assert result["device_nodes"] == {str(node): True, str(tmp_path / "nvidia-uvm"): False}
    assert "cuda" not in result


def test_cuda_probe_reports_a_missing_driver_library(monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")
    probe = GPU.cuda_probe(60)
    if probe.get("init_rc") is None:  # no NVIDIA driver here, as on CI machines
        assert "libcuda.so.1" in probe["error"]


@pytest.mark.parametrize(
    ("answer", "expect", "problem"),
    [
        ("The capital of France is Paris.", "paris", ""),
        ("Lyon", ["Paris", "paris"], "the answer does not contain 'Paris' or 'paris'"),
        ("!!!!!!!!!!!!!!!!!!!!!!!!", None, "one character repeated in most of the answer"),
        ("the the the the the the the the the", None, "one token repeated in most of the answer"),
        ("", None, "empty answer"),
        (None, None, "empty answer"),
    ],
)
def test_smoke_judges_answers(answer, expect, problem):
    assert SMOKE.judge({"answer": answer, "reasoning_chars": 0}, expect) == problem


def test_smoke_names_reasoning_that_used_up_max_tokens():
    assert SMOKE.judge({"answer": None, "reasoning_chars": 900}, "x") == (
        "content empty: the model spent max_tokens on reasoning"
    )


PROBE = load_module("inference_service_probe")


@pytest.fixture
def served(tmp_path):

    port = free_port()
    secret = tmp_path / "s.secret.env"
    secret.write_text('# managed\nINFERHOST_API_KEY="k\\"ey"\n')
    argv = [sys.executable, str(ENGINE_DIR / "openai_standin.py"), "serve", "/m/Probed", "--port", str(port)]
    proc = subprocess.Popen([*argv, "--api-key", 'k"ey', "--load-delay", "1"], stdout=subprocess.DEVNULL)
    wait_listening(port)
    yield f"http://127.0.0.1:{port}", secret
    proc.kill()
    proc.wait()


def test_probe_sees_loading_then_ready_with_the_key_from_the_secret_file(served):
    url, secret = served
    loading = run_module(PROBE, {"url": url, "model": "Probed", "secret_file": str(secret)})
    assert loading["health"] == 503 and loading["ready"] is False
    for _ in range(100):
        result = run_module(PROBE, {"url": url, "model": "Probed", "secret_file": str(secret)})
        if result["ready"]:
            break
        time.sleep(0.1)
    assert result["ready"] and result["models"] == ["Probed"]
    without_key = run_module(PROBE, {"url": url, "model": "Probed"})
    assert without_key["models_status"] == 401 and not without_key["ready"]


def test_probe_reports_a_closed_port():
    result = run_module(PROBE, {"url": "http://127.0.0.1:9", "model": "x", "http_timeout": 2})
    assert str(result["health"]).startswith("no answer:") and not result["ready"]


def test_memory_fit_reads_the_checkpoints_index(services, checkpoint):
    path = checkpoint(REFERENCE["kimi-k25"])
    (path / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 547000000000}, "weight_map": {}}')
    args = plan_args(services, active="kimi-k25", memory_gb=96)
    kimi = next(s for s in args["services"] if s["name"] == "kimi-k25")
    kimi.update(gpus=[0, 1, 2, 3], tensor_parallel_size=4, model={**kimi["model"], "path": str(path)})
    result = run_module(PLAN, args)
    assert result["failed"]
    assert "138.4 GB of weights per GPU at TP 4 (547 GB in all, model.safetensors.index.json" in result["msg"]
    accepted = run_module(PLAN, plan_args(services, memory_gb=96))
    assert not accepted.get("failed"), accepted.get("msg")
