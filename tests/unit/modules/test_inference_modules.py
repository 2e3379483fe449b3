"""The Ansible modules around the pure checks: inference_service_plan and inference_checkpoint_edit."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from inference_refdata import MODELS, REFERENCE
from localhost import free_port, wait_listening
from module_runner import load_module, run_module

from inferhost.sim import ENGINE_DIR

PLAN = load_module("inference_service_plan")
EDIT = load_module("inference_checkpoint_edit")


def at_fixtures(services):
    out = []
    for name, service in services.items():
        out.append({**service, "model": {**service["model"], "path": str(MODELS / REFERENCE[name])}})
    return out


def plan_args(services, **kw):
    args = {
        "services": at_fixtures(services),
        "active": "qwen35",
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
    assert " --enable-metrics " in by_name["qwen35"]["exec_start"]
    assert by_name["qwen35"]["api"] == {"tool_call_parser": "qwen3_coder", "reasoning_parser": "qwen3", "metrics": True}
    assert by_name["minimax-m25"]["api"] == {
        "tool_call_parser": "minimax_m2",
        "reasoning_parser": "minimax_m2_append_think",
        "metrics": True,
    }
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


class FakeService:
    """The service's HTTP answers by path, as client.exchange gives them; records what was asked."""

    def __init__(self, answers):
        self.answers, self.asked, self.timeouts = answers, [], {}

    def __call__(self, path, body=None, timeout=None):
        self.asked.append(path)
        self.timeouts.setdefault(path, timeout)
        status, reply = self.answers.get(path, (404, {"detail": "Not Found"}))
        if callable(reply):
            reply = reply(body)
        text = reply if isinstance(reply, str) else json.dumps(reply)
        return status, text, None if isinstance(reply, str) else reply


def chat_reply(content="42", finish="stop", **message):
    return {"choices": [{"message": {"role": "assistant", "content": content, **message}, "finish_reason": finish}]}


ONE_TOKEN = (200, {"choices": [{"text": " Paris", "finish_reason": "length"}], "usage": {"completion_tokens": 1}})
VLLM_METRICS = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="M"} 0.0\n'
    'vllm:num_requests_running{engine="1",model_name="M"} 2.0\n'
    'vllm:request_success_total{engine="0",finished_reason="stop",model_name="M"} 7.0\n'
)


def smoke_params(**extra):
    params = {
        "model": "M",
        "service": "svc",
        "engine": "vllm",
        "tool_call_parser": None,
        "reasoning_parser": None,
        "metrics": True,
        "max_tokens": 256,
        "reasoning_max_tokens": 4096,
        "completion_timeout": 30,
        "prompts": [{"prompt": "What is 17 + 25?", "expect": "42"}],
    }
    return {**params, **extra}


@pytest.mark.parametrize(
    ("completion", "problem"),
    [
        (ONE_TOKEN, ""),
        (
            (500, {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError"}}),
            "(POST /v1/completions, max_tokens 1) answered HTTP 500: EngineCore encountered an issue.",
        ),
        ((503, "Service Unavailable"), "answered HTTP 503: Service Unavailable"),
        (
            (200, {"choices": [{"text": "", "finish_reason": "stop"}], "usage": {"completion_tokens": 0}}),
            "came back with 0 generated tokens (usage.completion_tokens), text '', finish_reason 'stop'",
        ),
        ((200, {"choices": [{"text": " x"}]}), "came back with None generated tokens"),
    ],
)
def test_smoke_one_token_completion(completion, problem):
    result = SMOKE.one_token(FakeService({"/v1/completions": completion}), "M")
    assert result["ok"] is (not problem)
    assert problem in result["problem"]


def test_smoke_stops_at_a_dead_engine_and_names_the_service_and_what_came_back():
    dead = (500, {"object": "error", "message": "EngineCore encountered an issue. See stack trace (above)."})
    service = FakeService({"/v1/completions": dead, "/health": (200, {})})
    ok, message, values = SMOKE.run_checks(service, smoke_params(completion_timeout=7))
    assert not ok and service.asked == ["/v1/completions"]
    assert service.timeouts["/v1/completions"] == 7  # a hung engine is called not generating within this bound
    assert message.startswith("svc: the one-token completion (POST /v1/completions, max_tokens 1) answered HTTP 500: ")
    assert "EngineCore encountered an issue. See stack trace (above). Nothing else was asked" in message
    assert values["completion"]["ok"] is False


def test_smoke_message_has_one_part_per_check():
    tool_call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}

    def answer(body):
        if body.get("tools"):
            return chat_reply(None, "tool_calls", tool_calls=[tool_call], reasoning="The user wants the weather.")
        return chat_reply("42", reasoning="17 + 25 is 42, I add.")

    service = FakeService(
        {"/v1/completions": ONE_TOKEN, "/v1/chat/completions": (200, answer), "/metrics": (200, VLLM_METRICS)}
    )
    ok, message, values = SMOKE.run_checks(service, smoke_params(tool_call_parser="hermes", reasoning_parser="qwen3"))
    assert ok, message
    assert message == (
        '1/1 prompts answered well; tool call get_weather {"city": "paris"}; reasoning split (21 chars); '
        "one-token completion ok; vllm:num_requests_running 2"
    )
    assert values["metric"] == {
        "checked": True,
        "ok": True,
        "name": "vllm:num_requests_running",
        "value": 2.0,
        "problem": "",
    }
    assert values["tool_call"]["arguments"] == {"city": "paris"}


def test_smoke_skips_what_the_command_line_does_not_promise():
    service = FakeService({"/v1/completions": ONE_TOKEN, "/v1/chat/completions": (200, chat_reply("42"))})
    ok, message, values = SMOKE.run_checks(service, smoke_params(metrics=False))
    assert ok, message
    assert message == (
        "1/1 prompts answered well; tool call not checked (no tool-call parser); "
        "reasoning not checked (no reasoning parser); one-token completion ok; "
        "metrics not checked (the engine runs without them)"
    )
    assert service.asked == ["/v1/completions", "/v1/chat/completions"]
    assert values["tool_call"] == {"checked": False} and values["metric"] == {"checked": False}


def tool_call_message(arguments, name="get_weather"):
    """A chat message whose tool_calls hold one call of name with these arguments (JSON text, or an object)."""
    return {"tool_calls": [{"function": {"name": name, "arguments": arguments}}]}


@pytest.mark.parametrize(
    ("message", "finish", "problem"),
    [
        (tool_call_message('{"city": "Paris"}'), "tool_calls", ""),
        (tool_call_message({"city": "PARIS"}), "tool_calls", ""),
        (
            {"content": '<tool_call>{"name": "get_weather"}</tool_call>', "tool_calls": []},
            "stop",
            "no tool call in message.tool_calls (finish_reason 'stop', content '<tool_call>{\"name\"",
        ),
        ({"tool_calls": None}, "length", "no tool call in message.tool_calls (finish_reason 'length', no content)"),
        (tool_call_message("{}", name="get_time"), "tool_calls", "'get_time', not"),
        (tool_call_message("{city: Paris"), "tool_calls", "the arguments are not JSON: '{city: Paris'"),
        (tool_call_message('["Paris"]'), "tool_calls", "not a JSON object"),
        (
            tool_call_message('{"city": "Lyon"}'),
            "tool_calls",
            'the arguments {"city": "Lyon"} do not name the city Paris',
        ),
        (tool_call_message('{"city": "Paris"}'), "stop", "finish_reason is 'stop', not 'tool_calls'"),
    ],
)
def test_smoke_judges_the_tool_call(message, finish, problem):
    result = {"answer": message.get("content"), "tool_calls": message.get("tool_calls"), "finish_reason": finish}
    found, _name, _arguments = SMOKE.judge_tool_call(result)
    assert (found == "") if not problem else (problem in found), found


def test_smoke_asks_the_tool_call_again_when_reasoning_used_up_max_tokens():
    budgets = []

    def answer(body):
        budgets.append(body["max_tokens"])
        if body["max_tokens"] < 1000:
            return chat_reply(None, "length", reasoning_content="x" * 500)
        call = {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        return chat_reply(None, "tool_calls", tool_calls=[call])

    entry = SMOKE.check_tool_call(FakeService({"/v1/chat/completions": (200, answer)}), "M", "qwen3_coder", 256, 4096)
    assert entry["ok"] and entry["retried_for_reasoning"] and budgets == [256, 4096]


@pytest.mark.parametrize("parser", ["minimax_m2_append_think", "minimax-append-think"])
def test_smoke_leaves_reasoning_kept_in_the_content_on_purpose(parser):
    answer = chat_reply("<think>17 + 25 is 42</think>42")
    service = FakeService({"/v1/completions": ONE_TOKEN, "/v1/chat/completions": (200, answer)})
    ok, message, values = SMOKE.run_checks(service, smoke_params(reasoning_parser=parser, metrics=False))
    assert ok, message
    assert f"; reasoning not checked ({parser} keeps it in the content);" in message
    assert values["reasoning"] == {"checked": False}


@pytest.mark.parametrize(
    ("answers", "ok", "problem"),
    [
        ([("Paris", 31), ("42", 0)], True, ""),
        ([("Paris", 0), ("42", 0)], False, "no answer carried message.reasoning_content or message.reasoning"),
        ([("<think>hmm</think>Paris", 0), ("42", 9)], False, "has <think>/</think> in its content"),
        ([("Paris</think>", 12)], False, "has <think>/</think> in its content"),
    ],
)
def test_smoke_judges_the_reasoning_split(answers, ok, problem):
    results = [{"prompt": f"q{i}", "answer": a, "reasoning_chars": n} for i, (a, n) in enumerate(answers)]
    verdict = SMOKE.judge_reasoning(results, "qwen3")
    assert verdict["ok"] is ok and problem in verdict["problem"]
    if ok:
        assert verdict["chars"] == 31


@pytest.mark.parametrize(
    ("engine", "answer", "expected"),
    [
        ("vllm", (200, VLLM_METRICS), ("vllm:num_requests_running", 2.0)),
        (None, (200, VLLM_METRICS), ("vllm:num_requests_running", 2.0)),
        (
            "sglang",
            (200, 'sglang:gen_throughput{tp_rank="0"} 12.5\nsglang:num_running_reqs{model_name="M"} 1\n'),
            ("sglang:num_running_reqs", 1.0),
        ),
        ("sglang", (200, "sglang:cache_hit_rate 0.25\n"), ("sglang:cache_hit_rate", 0.25)),
        ("sglang", (200, VLLM_METRICS), "GET /metrics has no sglang:* metric (3 samples of others)"),
        ("vllm", (200, "# nothing\npython_info 1.0\n"), "GET /metrics has no vllm:* metric (1 samples of others)"),
        (
            "sglang",
            (404, {"detail": "Not Found"}),
            "GET /metrics answered HTTP 404: Not Found (SGLang serves /metrics only with --enable-metrics)",
        ),
        ("vllm", (401, {"error": "Unauthorized"}), "GET /metrics answered HTTP 401: Unauthorized"),
    ],
)
def test_smoke_reads_one_engine_metric(engine, answer, expected):
    result = SMOKE.check_metrics(FakeService({"/metrics": answer}), engine)
    if isinstance(expected, tuple):
        assert result["ok"] and (result["name"], result["value"]) == expected
    else:
        assert not result["ok"] and result["problem"] == expected


def test_smoke_reports_metric_values_as_a_person_reads_them():
    assert [SMOKE.number(v) for v in (0.0, 7.0, 0.25, 123456789.0, float("nan"))] == [
        "0",
        "7",
        "0.25",
        "123456789",
        "nan",
    ]


@pytest.fixture
def standin(tmp_path):
    """Starts the stand-in server: start(served name, key, flags..., secret=the secret file's text) -> its URL and
    the secret file."""
    procs = []

    def start(served, key, *flags, secret=None):
        port = free_port()
        path = tmp_path / "s.secret.env"
        path.write_text(secret or f'INFERHOST_API_KEY="{key}"\n')
        argv = [sys.executable, str(ENGINE_DIR / "openai_standin.py"), "serve", f"/m/{served}", "--port", str(port)]
        procs.append(subprocess.Popen([*argv, "--api-key", key, *flags], stdout=subprocess.DEVNULL))
        wait_listening(port)
        return f"http://127.0.0.1:{port}", path

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture
def standin_with_parsers(standin):
    parsers = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"]
    return standin("Served", "k3y", *parsers)


def test_smoke_module_against_the_stand_in_in_check_mode_too(standin_with_parsers):
    url, secret = standin_with_parsers
    args = {
        "url": url,
        "model": "Served",
        "service": "lab",
        "engine": "vllm",
        "tool_call_parser": "hermes",
        "reasoning_parser": "qwen3",
        "secret_file": str(secret),
        "prompts": [{"prompt": "What is the capital of France? Answer in one word.", "expect": "Paris"}],
    }
    for check_mode in (False, True):  # it changes nothing, so check mode asks the same
        result = run_module(SMOKE, args, check_mode=check_mode)
        assert not result.get("failed") and result["changed"] is False, result["msg"]
        assert result["msg"].startswith('1/1 prompts answered well; tool call get_weather {"city": "Paris"}; ')
        assert "; reasoning split (" in result["msg"]
        assert result["msg"].endswith("; one-token completion ok; vllm:num_requests_running 0")
    without_key = run_module(SMOKE, {**args, "secret_file": None})
    assert without_key["failed"]
    assert without_key["msg"].startswith(
        "lab: the one-token completion (POST /v1/completions, max_tokens 1) answered HTTP 401"
    )


PROBE = load_module("inference_service_probe")


@pytest.fixture
def served(standin):
    # The key as the role writes it: after a comment, quoted, its quote escaped.
    return standin("Probed", 'k"ey', "--load-delay", "1", secret='# managed\nINFERHOST_API_KEY="k\\"ey"\n')


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


def test_probe_on_a_machine_without_systemd_reports_no_unit_state_and_judges_by_the_api(served, monkeypatch):
    """The real-GPU machine runs the service by hand, with no systemctl: the probe must not fail on the unit."""
    url, secret = served
    monkeypatch.setenv("PATH", "/nonexistent")
    for _ in range(100):
        result = run_module(PROBE, {"url": url, "model": "Probed", "secret_file": str(secret), "unit": "x.service"})
        if result["ready"]:
            break
        time.sleep(0.1)
    assert not result.get("failed"), result
    assert result["ready"] and result["unit_state"] == {} and result["last_log"] == ""


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
