"""The stand-in OpenAI-compatible server the molecule scenario and the benchmark tests run against."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from localhost import free_port, wait_listening

from inferhost.sim import ENGINE_DIR

SERVER = ENGINE_DIR / "openai_standin.py"


class Standin:
    def __init__(self, *args, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, str(SERVER), *args, "--port", str(self.port)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
        )
        wait_listening(self.port)

    def request(self, path, body=None, key=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method="POST" if data else "GET")
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait_ready(self):
        for _ in range(300):
            if self.request("/health")[0] == 200:
                return
            time.sleep(0.02)
        raise RuntimeError("stand-in never became ready")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)
        return self.proc.stdout.read()


@pytest.fixture
def standin():
    servers = []

    def start(*args, env=None):
        server = Standin(*args, env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def chat(server, max_tokens=64, **extra):
    body = {"model": "M", "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, **extra}
    status, text = server.request("/v1/chat/completions", body)
    return status, json.loads(text)


def test_loading_answers_503_then_ready(standin):
    server = standin("serve", "/models/M", "--load-delay", "1")
    assert server.request("/health")[0] == 503
    assert server.request("/v1/models")[0] == 503
    server.wait_ready()
    status, text = server.request("/v1/models")
    assert status == 200
    assert json.loads(text)["data"][0]["id"] == "M"
    log = server.stop()
    assert "Loading safetensors checkpoint shards: 1/1 (/models/M)" in log
    assert "ready to roll" in log


def test_sglang_style_command_line_takes_the_real_releases_arguments(standin):
    server = standin(
        "--model-path", "/m/X", "--served-model-name", "Y", "--tp-size", "8", "--attention-backend", "triton"
    )
    server.wait_ready()
    assert json.loads(server.request("/v1/models")[1])["data"][0]["id"] == "Y"
    assert "--attention-backend triton" in server.stop()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["serve", "/m/M", "--tensor-paralel-size", "2"],
            "vllm serve: error: unrecognized arguments: --tensor-paralel-size",
        ),
        (["serve", "/m/M", "--kv-cache-dtype", "bf16"], "argument --kv-cache-dtype: invalid choice: 'bf16'"),
        (["--model-path", "/m/X", "--max-model-len", "4096"], "sglang.launch_server: error: unrecognized arguments"),
        (["--model-path", "/m/X", "--attention-backend", "x"], "argument --attention-backend: invalid choice: 'x'"),
        (["--served-model-name", "Y"], "the following arguments are required: --model-path/--model"),
        (["serve", "/m/M", "--max-num-seqs", "lots"], "argument --max-num-seqs: invalid int value: 'lots'"),
        (["--model-path", "/m/X", "--max-running-requests", "many"], "--max-running-requests: invalid int value"),
        (["--model-path", "/m/X", "--reasoning-parser", "qwen4"], "argument --reasoning-parser: invalid choice"),
    ],
)
def test_what_the_real_release_refuses_the_stand_in_refuses(argv, message):
    done = subprocess.run([sys.executable, str(SERVER), *argv], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["serve", "/m/M", "--enable-auto-tool-choice"],
            "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser",
        ),
        (
            ["serve", "/m/M", "--enable-auto-tool-choice", "--tool-call-parser", "hermez"],
            "KeyError: invalid tool call parser: hermez (chose from { ",
        ),
        (["serve", "/m/M", "--reasoning-parser", "qwen4"], "KeyError: Reasoning parser 'qwen4' not found."),
        (
            ["--model-path", "/m/X", "--enable-hierarchical-cache", "--disable-radix-cache"],
            "ValueError: The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive",
        ),
    ],
)
def test_what_the_real_release_refuses_after_parsing_the_stand_in_refuses_at_start(argv, message):
    done = subprocess.run([sys.executable, str(SERVER), *argv], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1
    assert message in done.stderr


def test_a_parser_plugin_may_bring_any_parser_name(standin):
    server = standin(
        "serve", "/m/M", "--enable-auto-tool-choice", "--tool-call-parser", "site_parser",
        "--tool-parser-plugin", "/etc/inferhost/site_parser.py",
    )  # fmt: skip
    server.wait_ready()


def test_chat_completion_is_deterministic_and_stops(standin):
    server = standin("serve", "/m/M")
    server.wait_ready()
    status, first = chat(server)
    assert status == 200
    choice = first["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert len(choice["message"]["content"].split()) == 24
    assert chat(server)[1]["choices"][0]["message"] == choice["message"]
    assert first["usage"]["completion_tokens"] == 24


def test_ignore_eos_runs_to_max_tokens(standin):
    server = standin("serve", "/m/M")
    server.wait_ready()
    choice = chat(server, max_tokens=40, ignore_eos=True)[1]["choices"][0]
    assert len(choice["message"]["content"].split()) == 40
    assert choice["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["serve", "/m/M", "--reasoning-parser", "qwen3"], "reasoning"),  # vLLM's field since the recorded release
        (["--model-path", "/m/M", "--reasoning-parser", "qwen3"], "reasoning_content"),  # SGLang's
    ],
)
def test_a_reasoning_parser_separates_the_reasoning_and_max_tokens_can_run_out_in_it(standin, argv, field):
    server = standin(*argv, env={"STANDIN_REASONING_TOKENS": "50"})
    server.wait_ready()
    message = chat(server, max_tokens=32)[1]["choices"][0]
    assert message["message"]["content"] is None
    assert len(message["message"][field].split()) == 32
    assert message["finish_reason"] == "length"
    roomy = chat(server, max_tokens=200)[1]["choices"][0]
    assert roomy["message"]["content"] and roomy["finish_reason"] == "stop"
    assert "<think>" not in roomy["message"]["content"] and len(roomy["message"][field].split()) == 50


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["serve", "/m/M"], {"STANDIN_REASONING": "1"}),
        (["serve", "/m/M", "--reasoning-parser", "minimax_m2_append_think"], {}),  # keeps it there on purpose
    ],
)
def test_a_reasoning_model_without_a_separating_parser_thinks_in_the_content(standin, argv, env):
    server = standin(*argv, env={**env, "STANDIN_REASONING_TOKENS": "5"})
    server.wait_ready()
    body = {"model": "M", "messages": [{"role": "user", "content": "What is 17 + 25?"}], "max_tokens": 64}
    message = json.loads(server.request("/v1/chat/completions", body)[1])["choices"][0]["message"]
    assert message["content"].startswith("<think>\n") and message["content"].endswith("</think>\n\n42")
    assert message["reasoning"] is None


def test_max_tokens_is_honoured_and_refused_below_what_the_engine_takes(standin):
    server = standin("serve", "/m/M")
    server.wait_ready()
    choice = chat(server, max_tokens=3)[1]["choices"][0]
    assert len(choice["message"]["content"].split()) == 3 and choice["finish_reason"] == "length"
    status, reply = chat(server, max_tokens=0)
    assert status == 400 and reply["message"] == "max_tokens must be at least 1, got 0."
    body = {"model": "M", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8}
    short = json.loads(server.request("/v1/chat/completions", body)[1])
    assert short["choices"][0]["finish_reason"] == "stop" and short["usage"]["completion_tokens"] == 6


def test_one_token_completion(standin):
    server = standin("serve", "/m/M")
    server.wait_ready()
    status, text = server.request(
        "/v1/completions", {"model": "M", "prompt": "The capital of France is", "max_tokens": 1}
    )
    assert status == 200
    reply = json.loads(text)
    assert reply["object"] == "text_completion" and reply["usage"]["completion_tokens"] == 1
    assert len(reply["choices"][0]["text"].split()) == 1 and reply["choices"][0]["finish_reason"] == "length"
    default = json.loads(server.request("/v1/completions", {"model": "M", "prompt": "Once"})[1])
    assert default["usage"]["completion_tokens"] == 16  # the engines' default max_tokens for completions
    assert server.request("/v1/completions", {"model": "M", "max_tokens": 1})[0] == 400
    streamed = server.request("/v1/completions", {"model": "M", "prompt": "Once", "max_tokens": 2, "stream": True})[1]
    events = [line[6:] for line in streamed.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def ask_weather(server, **extra):
    body = {
        "model": "M",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "max_tokens": 64,
        "tools": [WEATHER],
        **extra,
    }
    status, text = server.request("/v1/chat/completions", body)
    return status, json.loads(text)


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "/m/M", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        ["--model-path", "/m/M", "--tool-call-parser", "hermes"],
    ],
)
def test_a_tool_call_parser_returns_the_call_parsed(standin, argv):
    server = standin(*argv)
    server.wait_ready()
    status, reply = ask_weather(server)
    assert status == 200
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    named = ask_weather(server, tool_choice={"type": "function", "function": {"name": "get_weather"}})[1]
    assert named["choices"][0]["finish_reason"] == "stop" and named["choices"][0]["message"]["tool_calls"]
    declined = ask_weather(server, tool_choice="none")[1]["choices"][0]
    assert declined["finish_reason"] == "stop" and not declined["message"]["tool_calls"]
    unrelated = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    answered = ask_weather(server, tools=[unrelated])[1]["choices"][0]  # auto: the model answers instead
    assert answered["finish_reason"] == "stop" and answered["message"]["content"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "/m/M"], '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        (["serve", "/m/M", "--tool-call-parser", "hermes"], '"auto" tool choice requires --enable-auto-tool-choice'),
    ],
)
def test_vllm_without_auto_tool_choice_refuses_tools_as_vllm_does(standin, argv, message):
    server = standin(*argv)
    server.wait_ready()
    status, reply = ask_weather(server)
    assert status == 400 and message in reply["message"]
    status, reply = ask_weather(server, tool_choice="required")
    assert status == 400 and reply["message"] == 'tool_choice="required" requires --tool-call-parser to be set'
    assert ask_weather(server, tool_choice="none")[0] == 200


def test_sglang_without_a_tool_call_parser_returns_the_models_text(standin):
    server = standin("--model-path", "/m/M")
    server.wait_ready()
    choice = ask_weather(server)[1]["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"] is None
    assert choice["message"]["content"].startswith("<tool_call>") and '"city": "Paris"' in choice["message"]["content"]


def metrics(server, key=None):
    status, text = server.request("/metrics", key=key)
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split()[0]
            samples[name] = samples.get(name, 0) + float(line.rsplit(" ", 1)[1])
    return status, samples


def test_vllm_metrics_count_requests_and_need_no_key(standin):
    server = standin("serve", "/m/M", "--api-key", "s3cret")
    server.wait_ready()
    status, samples = metrics(server)
    assert status == 200 and samples["vllm:num_requests_running"] == 0
    body = {"model": "M", "messages": [{"role": "user", "content": "17 + 25?"}], "max_tokens": 64}
    assert server.request("/v1/chat/completions", body, key="s3cret")[0] == 200
    samples = metrics(server, key="s3cret")[1]
    assert samples["vllm:request_success_total"] == 1 and samples["vllm:generation_tokens_total"] == 1


def test_vllm_without_log_stats_serves_no_engine_metrics(standin):
    server = standin("serve", "/m/M", "--disable-log-stats")
    server.wait_ready()
    status, samples = metrics(server)
    assert status == 200 and samples and not [n for n in samples if n.startswith("vllm:")]


def test_sglang_serves_metrics_only_with_enable_metrics(standin):
    server = standin("--model-path", "/m/M")
    server.wait_ready()
    assert server.request("/metrics")[0] == 404
    metered = standin("--model-path", "/m/M", "--enable-metrics")
    metered.wait_ready()
    status, samples = metrics(metered)
    assert status == 200 and samples["sglang:num_running_reqs"] == 0


def test_dead_generation_keeps_health_and_models_answering(standin):
    server = standin("serve", "/m/M")
    server.wait_ready()
    assert server.request("/standin/generation-dead", {})[0] == 200
    assert server.request("/health")[0] == 200 and server.request("/v1/models")[0] == 200
    status, text = server.request("/v1/completions", {"model": "M", "prompt": "x", "max_tokens": 1})
    assert status == 500 and "EngineCore encountered an issue" in text
    assert chat(server)[0] == 500
    assert chat(server, max_tokens=0)[0] == 400  # the request is refused before the engine is asked


def test_streaming_sends_one_event_per_token_and_usage(standin):
    server = standin("serve", "/m/M", "--token-latency", "0")
    server.wait_ready()
    body = {
        "model": "M",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 10,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, text = server.request("/v1/chat/completions", body)
    assert status == 200
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(tokens) == 10
    assert chunks[-1]["usage"]["completion_tokens"] == 10


def test_api_key_and_model_name_are_enforced(standin):
    server = standin("serve", "/m/M", "--api-key", "s3cret")
    server.wait_ready()
    assert server.request("/health")[0] == 200  # like vLLM: health needs no key
    assert server.request("/v1/models")[0] == 401
    assert server.request("/v1/models", key="s3cret")[0] == 200
    body = {"model": "other", "messages": []}
    assert server.request("/v1/chat/completions", body, key="s3cret")[0] == 404


def test_vllm_command_line_takes_the_key_from_vllm_api_key(standin):
    server = standin("serve", "/m/M", env={"VLLM_API_KEY": "s3cret", "INFERHOST_API_KEY": ""})
    server.wait_ready()
    assert server.request("/v1/models")[0] == 401
    assert server.request("/v1/models", key="s3cret")[0] == 200


@pytest.mark.parametrize("variable", ["INFERHOST_API_KEY", "VLLM_API_KEY", "SGLANG_API_KEY"])
def test_sglang_command_line_reads_no_key_from_the_environment(standin, variable):
    """Like SGLang: only --api-key sets the key, so a key in the environment alone protects nothing."""
    server = standin("--model-path", "/m/M", env={variable: "s3cret"})
    server.wait_ready()
    assert server.request("/v1/models")[0] == 200


def test_vllm_command_line_ignores_the_probes_variable(standin):
    server = standin("serve", "/m/M", env={"INFERHOST_API_KEY": "s3cret", "VLLM_API_KEY": ""})
    server.wait_ready()
    assert server.request("/v1/models")[0] == 200


def test_sglang_command_line_logs_its_arguments_key_included_as_sglang_does(standin):
    server = standin("--model-path", "/m/M", "--api-key", "s3cret")
    server.wait_ready()
    assert server.request("/v1/models")[0] == 401
    log = server.stop()
    assert "server_args=" in log and "'api_key': 's3cret'" in log


def test_crash_switch_exits_with_failure(standin):
    server = standin("serve", "/m/M")
    server.wait_ready()
    assert server.request("/standin/crash", {})[0] == 200
    assert server.proc.wait(timeout=10) == 3


def test_holds_files_open(standin, tmp_path):
    node = tmp_path / "nvidia0"
    node.write_text("")
    server = standin("serve", "/m/M", env={"STANDIN_HOLD": str(node)})
    server.wait_ready()
    fds = Path(f"/proc/{server.proc.pid}/fd")
    assert any(os.readlink(fd) == str(node) for fd in fds.iterdir())


def test_canned_questions_are_answered_correctly(standin):
    server = standin("serve", "/m/M")
    server.wait_ready()
    for question, answer in (("What is the capital of France?", "The capital of France is Paris."), ("17 + 25?", "42")):
        body = {"model": "M", "messages": [{"role": "user", "content": question}], "max_tokens": 64}
        reply = json.loads(server.request("/v1/chat/completions", body)[1])["choices"][0]
        assert reply["message"]["content"] == answer
        assert reply["finish_reason"] == "stop"
