#!/usr/bin/env python3
"""A stand-in for an OpenAI-compatible inference server (vLLM, SGLang), for tests without GPUs.

Standard library only, so it runs with the system python3 of a bare Debian or Ubuntu container. It
accepts the command lines the role builds for either engine (``vllm serve MODEL ...`` through a
``vllm`` wrapper, ``python -m sglang.launch_server --model-path MODEL ...`` through a ``sglang``
package) and refuses, as the real release would, the arguments that release's parser refuses, and those its
checks after parsing refuse (standin_engine.py has its recorded arguments and the checks it keeps); its own
options below are taken out first.

Behaviour (flags, or STANDIN_* environment variables for use from a systemd unit):

* ``--load-delay S`` (STANDIN_LOAD_DELAY): seconds of "model loading", logging progress each second;
  meanwhile ``/health`` and ``/v1/models`` answer 503, as SGLang does during warmup.
* ``/health``: 200 once loaded. ``/v1/models``: the served model name.
* ``/v1/chat/completions``: the right answer to two canned questions (the capital of France, a sum of
  two numbers), otherwise a deterministic answer of ``--answer-tokens`` words (or ``max_tokens`` with
  ``ignore_eos``), never more than ``max_tokens`` words; ``stream: true`` sends server-sent events, one per
  token, after ``--ttft`` seconds, each ``--token-latency`` seconds apart, slowed down by
  ``--batch-slowdown`` for each other request in flight (a crude batching model for benchmarks).
* ``/v1/completions``: a deterministic continuation of the prompt, ``max_tokens`` (16 when not given) words
  at most, with ``usage``.
* Tools: given ``tools``, the model calls the one ``tool_choice`` names, the first with ``required``, or with
  ``auto`` (what the engines default to when tools are given) the first whose name has a word of the last
  user message ("get_weather" and "What is the weather in Paris?"); string arguments are the message's last
  capitalised word. As the engines do: with a tool-call parser (vLLM: ``--enable-auto-tool-choice`` and
  ``--tool-call-parser``; SGLang: ``--tool-call-parser``) the call comes back in ``message.tool_calls`` with
  ``finish_reason: tool_calls``; without one vLLM refuses a tool choice other than ``none`` (400, its
  message) and SGLang returns the model's text (hermes' ``<tool_call>`` form) as content.
* A reasoning model (``--reasoning``, STANDIN_REASONING=1, or a ``--reasoning-parser`` on the command line)
  first spends ``--reasoning-tokens`` tokens on reasoning. With a reasoning parser the reasoning comes apart
  from the content, in ``message.reasoning`` (vLLM: the recorded release and later) or
  ``message.reasoning_content`` (SGLang), and with a ``max_tokens`` smaller than the reasoning the answer is
  ``content: null`` and ``finish_reason: length``, as real reasoning models do; without one it stays in the
  content between ``<think>`` and ``</think>``, as it does with the parsers that keep it there on purpose
  (vLLM's ``minimax_m2_append_think``, SGLang's ``minimax-append-think``).
* ``/metrics``: Prometheus text with the engine's own metrics (``vllm:num_requests_running``,
  ``vllm:request_success_total``, ...; ``sglang:num_running_reqs``, ...), no key needed as with the engines.
  SGLang serves it only with ``--enable-metrics`` (404 without), vLLM has no engine metrics with
  ``--disable-log-stats``.
* ``--api-key``: the /v1 endpoints require ``Authorization: Bearer``. Like the real engines, a ``vllm serve``
  command line also takes the key from ``VLLM_API_KEY``; an SGLang command line takes it only as ``--api-key``
  (SGLang reads no environment variable for it), and logs its parsed arguments, key included, at start as
  SGLang does (the role's SGLang launcher hides it).
* ``--hold PATH`` (STANDIN_HOLD, colon-separated): keep these files open, as an engine keeps
  ``/dev/nvidia*`` open, so a GPU guard can see the process as a holder.
* ``POST /standin/crash``: the crash switch; the process exits with status 3 right after answering.
* ``POST /standin/generation-dead``: generation dies and the server stays: ``/health`` and ``/v1/models`` still
  answer 200 while every completion answers 500, as vLLM did for 30 s after a tensor-parallel worker was killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "seven",
    "curious",
    "engineers",
    "measure",
    "tokens",
    "per",
    "second",
    "on",
    "a",
    "stand-in",
    "server",
    "that",
    "answers",
    "every",
    "question",
    "with",
    "calm",
    "deterministic",
    "prose",
]


def env_default(name, default, cast=str):
    value = os.environ.get(name)
    return default if value in (None, "") else cast(value)


STANDIN_OPTIONS = {  # the stand-in's own options (no engine has them), with whether each takes a value
    "--load-delay": True,
    "--ttft": True,
    "--token-latency": True,
    "--batch-slowdown": True,
    "--reasoning": False,
    "--reasoning-tokens": True,
    "--answer-tokens": True,
    "--hold": True,
}


def refuse_as_the_engine(engine, argv):
    """Exit as the real release would when its parser refuses argv (status 2, argparse's message) or its checks
    after parsing do (status 1, the exception's type and message), as standin_engine.py records and keeps them.
    Returns the engine's parsed arguments."""
    import standin_engine  # noqa: PLC0415  (beside this file, here and where install.yml puts both)

    engine_args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg.split("=", 1)[0] in STANDIN_OPTIONS:
            skip = "=" not in arg and STANDIN_OPTIONS[arg]
        else:
            engine_args.append(arg)
    parsed = standin_engine.parser_for(engine).parse_args(engine_args)  # prints "<prog>: error: ..." and exits 2
    try:
        standin_engine.check_parsed(engine, parsed)
    except (KeyError, TypeError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        sys.exit(f"{type(exc).__name__}: {message}")
    return parsed


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--model-path", "--model")
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key")
    parser.add_argument("--load-delay", type=float, default=env_default("STANDIN_LOAD_DELAY", 0.0, float))
    parser.add_argument("--ttft", type=float, default=env_default("STANDIN_TTFT", 0.02, float))
    parser.add_argument("--token-latency", type=float, default=env_default("STANDIN_TOKEN_LATENCY", 0.002, float))
    parser.add_argument("--batch-slowdown", type=float, default=env_default("STANDIN_BATCH_SLOWDOWN", 0.05, float))
    parser.add_argument("--reasoning", action="store_true", default=env_default("STANDIN_REASONING", "0") == "1")
    parser.add_argument("--reasoning-tokens", type=int, default=env_default("STANDIN_REASONING_TOKENS", 200, int))
    parser.add_argument("--answer-tokens", type=int, default=env_default("STANDIN_ANSWER_TOKENS", 24, int))
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--hold", action="append", default=[p for p in env_default("STANDIN_HOLD", "").split(":") if p])
    served, engine = None, "sglang"
    if argv[:1] == ["serve"] and len(argv) > 1:  # vllm serve MODEL ...
        served, argv, engine = argv[1], argv[2:], "vllm"
    args, unknown = parser.parse_known_args(argv)
    engine_args = refuse_as_the_engine(engine, ([served] if served else []) + argv)
    args.engine = engine
    # What the engine's API does with these flags: parse tool calls (vLLM only with auto tool choice as well),
    # separate reasoning, serve its metrics.
    args.tool_call_parser = engine_args.tool_call_parser
    if engine == "vllm" and not engine_args.enable_auto_tool_choice:
        args.tool_call_parser = None
    args.reasoning_parser = engine_args.reasoning_parser
    args.reasoning = args.reasoning or bool(args.reasoning_parser)
    args.metrics = not engine_args.disable_log_stats if engine == "vllm" else engine_args.enable_metrics
    if engine == "vllm" and not args.api_key:
        args.api_key = os.environ.get("VLLM_API_KEY") or None  # vLLM's own fallback; SGLang has none
    args.model_path = args.model_path or served or "standin-model"
    args.served_model_name = args.served_model_name or os.path.basename(args.model_path.rstrip("/"))
    args.ignored = unknown
    return args


def log(message):
    print(f"standin {time.strftime('%H:%M:%S')} {message}", flush=True)


class State:
    def __init__(self, args):
        self.args = args
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.active = 0
        self.generation_dead = False
        self.finished = {"stop": 0, "length": 0, "tool_calls": 0}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.held = [open(path, "rb") for path in args.hold]  # noqa: SIM115  (kept open on purpose)

    def load(self):
        delay = self.args.load_delay
        steps = max(1, int(delay))
        for step in range(1, steps + 1):
            time.sleep(delay / steps)
            log(f"Loading safetensors checkpoint shards: {step}/{steps} ({self.args.model_path})")
        self.ready.set()
        log(f"The server is fired up and ready to roll! model={self.args.served_model_name}")

    def token_delay(self):
        with self.lock:
            others = max(0, self.active - 1)
        return self.args.token_latency * (1.0 + self.args.batch_slowdown * others)

    def count(self, finish, usage):
        with self.lock:
            self.finished[finish] = self.finished.get(finish, 0) + 1
            self.prompt_tokens += usage["prompt_tokens"]
            self.generation_tokens += usage["completion_tokens"]

    def metrics(self):
        """The engine's metrics in Prometheus' text format, as its /metrics serves them (a few of them)."""
        args = self.args
        lines = ["# HELP python_info Python platform information", "# TYPE python_info gauge"]
        lines.append(f'python_info{{implementation="CPython",version="{sys.version.split()[0]}"}} 1.0')
        if not args.metrics:
            return "\n".join(lines) + "\n"
        with self.lock:
            running, finished = self.active, dict(self.finished)
            prompt, generation = self.prompt_tokens, self.generation_tokens
        name = args.served_model_name.replace("\\", "\\\\").replace('"', '\\"')
        if args.engine == "vllm":
            labels = f'engine="0",model_name="{name}"'
            series = [
                ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                 [(labels, running)]),
                ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [(labels, 0)]),
                ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                 [(f'engine="0",finished_reason="{r}",model_name="{name}"', finished.get(r, 0))
                  for r in ("stop", "length", "abort")]),
                ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [(labels, prompt)]),
                ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                 [(labels, generation)]),
            ]  # fmt: skip
        else:
            labels = f'engine_type="unified",model_name="{name}",pp_rank="0",tp_rank="0"'
            series = [
                ("sglang:num_running_reqs", "gauge", "The number of running requests.", [(labels, running)]),
                ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", [(labels, 0)]),
                ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [(labels, prompt)]),
                ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                 [(labels, generation)]),
                ("sglang:num_requests_total", "counter", "Number of requests processed.",
                 [(labels, sum(finished.values()))]),
            ]  # fmt: skip
        for metric, kind, doc, samples in series:
            lines += [f"# HELP {metric} {doc}", f"# TYPE {metric} {kind}"]
            lines += [f"{metric}{{{sample_labels}}} {float(value)}" for sample_labels, value in samples]
        return "\n".join(lines) + "\n"


def canned(question):
    """The few questions the stand-in answers correctly, so a smoke test can check coherence."""
    text = str(question).lower()
    if "capital of france" in text:
        return "The capital of France is Paris."
    match = re.search(r"(\d+)\s*\+\s*(\d+)", text)
    if match:
        return f"{int(match.group(1)) + int(match.group(2))}"
    return None


def last_user_message(messages):
    return next((m.get("content") for m in reversed(messages or []) if m.get("role") == "user"), "") or ""


def generated(text, count):
    """A deterministic text of ``count`` words, seeded by ``text``."""
    seed = sum(ord(c) for c in str(text))
    return [WORDS[(seed + i) % len(WORDS)] for i in range(count)]


def answer_tokens(messages, count):
    last = last_user_message(messages)
    known = canned(last)
    if known:
        return known.split()[:count]
    return generated(last, count)


def chosen_tool(tools, tool_choice, question):
    """The tool the stand-in model calls, or None: the named one, the first when required, with auto the first
    whose name has a word (four letters or more) of the question."""
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        return next((t["function"] for t in tools if t["function"]["name"] == wanted), None)
    if tool_choice == "required":
        return tools[0]["function"]
    if tool_choice != "auto":
        return None
    words = set(re.findall(r"[a-z]+", str(question).lower()))
    for tool in tools:
        parts = [w for w in re.split(r"[^a-z]+", tool["function"]["name"].lower()) if len(w) >= 4]
        if any(w in words for w in parts):
            return tool["function"]
    return None


def tool_arguments(function, question):
    """Arguments for the tool from the question: strings are its last capitalised word (not the first word)."""
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    names = parameters.get("required") or list(properties)
    words = re.findall(r"[A-Za-z][\w-]*", str(question))
    capitalised = [w for w in words[1:] if w[0].isupper()]
    numbers = re.findall(r"-?\d+(?:\.\d+)?", str(question))
    arguments = {}
    for name in names:
        kind = (properties.get(name) or {}).get("type", "string")
        if kind == "string":
            arguments[name] = capitalised[-1] if capitalised else "unknown"
        elif kind in ("integer", "number"):
            value = float(numbers[0]) if numbers else 1
            arguments[name] = int(value) if kind == "integer" else value
        elif kind == "boolean":
            arguments[name] = True
    return arguments


def hermes_text(function, arguments):
    """The model's own text for a tool call (hermes' form, which Qwen and Hermes models write)."""
    call = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


class Refused(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


class Handler(BaseHTTPRequestHandler):
    server_version = "standin/1"
    protocol_version = "HTTP/1.1"
    state: State = None

    def log_message(self, fmt, *args):
        log(f'{self.address_string()} "{self.requestline}" {args[1] if len(args) > 1 else ""}')

    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_text(self, status, text, content_type):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status, message):
        self.send_json(status, {"object": "error", "message": message, "code": status})

    def authorised(self):
        key = self.state.args.api_key
        if not key or self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self.error(401, "invalid or missing API key")
        return False

    def do_GET(self):  # noqa: N802 (http.server naming)
        if self.path == "/health":
            if self.state.ready.is_set():
                self.send_json(200, {})
            else:
                self.error(503, "model is loading")
        elif self.path == "/v1/models":
            if not self.state.ready.is_set():
                self.error(503, "model is loading")
            elif self.authorised():
                name = self.state.args.served_model_name
                model = {"id": name, "object": "model", "owned_by": "standin", "root": self.state.args.model_path}
                model["max_model_len"] = self.state.args.max_model_len
                self.send_json(200, {"object": "list", "data": [model]})
        elif self.path == "/metrics" and (self.state.args.engine == "vllm" or self.state.args.metrics):
            # Neither engine asks for the key here (vLLM guards /v1 only; SGLang lets /health and /metrics by).
            self.send_text(200, self.state.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/metrics":  # SGLang without --enable-metrics mounts no /metrics: FastAPI's 404
            self.send_json(404, {"detail": "Not Found"})
        else:
            self.error(404, f"no route {self.path}")

    def do_POST(self):  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        if self.path == "/standin/crash":
            self.send_json(200, {"crashing": True})
            self.wfile.flush()
            log("crash switch pulled: exiting with status 3")
            os._exit(3)
        if self.path == "/standin/generation-dead":
            self.state.generation_dead = True
            log("generation switch pulled: completions answer 500 from now on, /health stays 200")
            self.send_json(200, {"generation_dead": True})
        elif self.path not in ("/v1/chat/completions", "/v1/completions"):
            self.error(404, f"no route {self.path}")
        elif not self.state.ready.is_set():
            self.error(503, "model is loading")
        elif self.authorised():
            try:
                self.generate(self.request_body(raw))
            except Refused as exc:
                self.error(exc.status, exc.message)

    def request_body(self, raw):
        """The request as the engine takes it, or Refused with the status and message it answers."""
        try:
            body = json.loads(raw)
        except ValueError:
            raise Refused(400, "request body is not JSON") from None
        if not isinstance(body, dict):
            raise Refused(400, "request body is not a JSON object")
        if body.get("model") != self.state.args.served_model_name:
            raise Refused(404, f"model {body.get('model')!r} does not exist")
        return body

    def engine_alive(self):
        """After the request is validated (a refusal comes first, as in the engine): is generation alive?"""
        if self.state.generation_dead:
            raise Refused(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.")

    def generate(self, body):
        with self.state.lock:
            self.state.active += 1
        try:
            if self.path == "/v1/completions":
                self.text_completion(body)
            else:
                self.complete(body)
        finally:
            with self.state.lock:
                self.state.active -= 1

    def max_tokens(self, body, default):
        """``max_tokens`` as the engine takes it: vLLM refuses fewer than 1, SGLang fewer than 0."""
        value = body.get("max_tokens")
        if value is None:
            value = body.get("max_completion_tokens")
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise Refused(400, f"max_tokens must be an integer, got {value!r}")
        if self.state.args.engine == "vllm" and value < 1:
            raise Refused(400, f"max_tokens must be at least 1, got {value}.")
        if value < 0:
            raise Refused(400, f"max_new_tokens must be at least 0, got {value}.")
        return value

    def tool_plan(self, body, question):
        """(the tool the model calls or None, whether the engine parses it), refusing what the engine refuses."""
        args = self.state.args
        tools = body.get("tools")
        tool_choice = body.get("tool_choice")
        if tools is not None and (
            not isinstance(tools, list)
            or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)
            or not all(isinstance(t["function"].get("name"), str) for t in tools)
        ):
            raise Refused(400, "tools must be a list of {'type': 'function', 'function': {'name': ...}}")
        if tool_choice is None and tools:
            tool_choice = "auto"  # as both engines default when tools are given
        if tool_choice in (None, "none"):
            return None, False
        if not tools:
            raise Refused(400, "When using `tool_choice`, `tools` must be set.")
        if args.engine == "vllm" and not args.tool_call_parser:
            if tool_choice == "auto":
                raise Refused(
                    400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
                )
            raise Refused(400, f'tool_choice="{tool_choice}" requires --tool-call-parser to be set')
        return chosen_tool(tools, tool_choice, question), bool(args.tool_call_parser)

    def chat_output(self, body):
        """What the stand-in model answers a chat request, shaped as the engine returns it."""
        args = self.state.args
        max_tokens = self.max_tokens(body, 64)
        question = last_user_message(body.get("messages"))
        tool, parsed = self.tool_plan(body, question)
        self.engine_alive()
        arguments = tool_arguments(tool, question) if tool else None
        reasoning_budget = args.reasoning_tokens if args.reasoning else 0
        reasoning = generated("think", min(reasoning_budget, max_tokens))
        room = max(0, max_tokens - reasoning_budget)
        # A natural answer ends by itself; ignore_eos (vLLM, SGLang) makes it run to max_tokens.
        if tool:
            natural = hermes_text(tool, arguments).split(" ")
        elif body.get("ignore_eos"):
            natural = answer_tokens(body.get("messages"), room)
        else:
            natural = answer_tokens(body.get("messages"), args.answer_tokens)
        content = natural[:room]
        out = {
            "reasoning": reasoning,
            "content": content,
            "finish": "length" if reasoning_budget + len(natural) >= max_tokens else "stop",
            "tool_calls": None,
            # The parser takes the reasoning out of the content, except those that keep it there on purpose.
            "split": bool(args.reasoning_parser) and not re.search(r"append[-_]think", args.reasoning_parser),
            "closed": len(reasoning) >= reasoning_budget,  # the model got to the end of its reasoning
        }
        if tool and parsed and out["finish"] == "stop":  # the parser finds a whole call only
            ident = f"chatcmpl-tool-{uuid.uuid4().hex}" if args.engine == "vllm" else f"call_{uuid.uuid4().hex[:24]}"
            function = {"name": tool["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}
            out["tool_calls"] = [{"id": ident, "type": "function", "function": function}]
            if args.engine == "sglang":
                out["tool_calls"][0]["index"] = 0
            out["finish"] = "stop" if isinstance(body.get("tool_choice"), dict) else "tool_calls"  # named: "stop"
        text = " ".join(content) if content else None
        if reasoning and not out["split"]:
            text = "<think>\n" + " ".join(reasoning) + ("\n</think>\n\n" + (text or "") if out["closed"] else "")
        out["text"] = None if out["tool_calls"] else text
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])
        generated_tokens = len(reasoning) + len(content)
        out["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": generated_tokens,
            "total_tokens": prompt_tokens + generated_tokens,
        }
        return out

    def complete(self, body):
        args = self.state.args
        out = self.chat_output(body)
        created = int(time.time())
        ident = f"chatcmpl-standin-{created}-{threading.get_ident()}"
        time.sleep(args.ttft)
        if body.get("stream"):
            self.stream_chat(body, out, ident, created)
            return
        time.sleep(self.state.token_delay() * out["usage"]["completion_tokens"])
        message = {"role": "assistant", "content": out["text"]}
        if args.engine == "vllm":  # vLLM's ChatMessage has these always
            message.update(tool_calls=out["tool_calls"] or [], reasoning=None)
        else:
            message.update(tool_calls=out["tool_calls"], reasoning_content=None)
        if out["split"]:
            message["reasoning" if args.engine == "vllm" else "reasoning_content"] = " ".join(out["reasoning"]) or None
        choice = {"index": 0, "message": message, "finish_reason": out["finish"]}
        self.state.count(out["finish"], out["usage"])
        self.send_json(
            200,
            {
                "id": ident,
                "object": "chat.completion",
                "created": created,
                "model": args.served_model_name,
                "choices": [choice],
                "usage": out["usage"],
            },
        )

    def start_event_stream(self):
        """The headers of a streamed answer (server-sent events, one connection per stream)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def stream_chat(self, body, out, ident, created):
        args = self.state.args
        self.start_event_stream()

        def event(delta, finish_reason=None, extra=None):
            chunk = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": args.served_model_name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            chunk.update(extra or {})
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        reasoning_field = "reasoning" if args.engine == "vllm" else "reasoning_content"
        event({"role": "assistant", "content": ""})
        for i, word in enumerate(out["reasoning"]):
            piece = word if i == 0 else " " + word
            event({reasoning_field: piece} if out["split"] else {"content": ("<think>\n" if i == 0 else "") + piece})
            time.sleep(self.state.token_delay())
        if out["reasoning"] and not out["split"] and out["closed"]:
            event({"content": "\n</think>\n\n"})
        if out["tool_calls"]:
            event({"tool_calls": [{"index": 0, **out["tool_calls"][0]}]})
            time.sleep(self.state.token_delay() * len(out["content"]))
        else:
            for i, word in enumerate(out["content"]):
                event({"content": word if i == 0 else " " + word})
                time.sleep(self.state.token_delay())
        event({}, out["finish"])
        self.state.count(out["finish"], out["usage"])
        if (body.get("stream_options") or {}).get("include_usage"):
            event({}, None, {"choices": [], "usage": out["usage"]})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def text_completion(self, body):
        """/v1/completions: a continuation of the prompt (no chat template, so no reasoning and no tools)."""
        args = self.state.args
        max_tokens = self.max_tokens(body, 16)
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        if prompt in (None, "", []) or not all(isinstance(p, (str, list)) and p for p in prompts):
            raise Refused(400, "Either prompt or prompt_embeds must be provided and non-empty.")
        self.engine_alive()
        created = int(time.time())
        ident = f"cmpl-standin-{created}-{threading.get_ident()}"
        outputs = []
        for text in prompts:
            natural = generated(text, max_tokens if body.get("ignore_eos") else args.answer_tokens)
            words = natural[:max_tokens]
            prompt_tokens = len(text) if isinstance(text, list) else len(text.split())
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words)}
            outputs.append((words, "length" if len(natural) >= max_tokens else "stop", usage))
        usage = {
            "prompt_tokens": sum(u["prompt_tokens"] for _w, _f, u in outputs),
            "completion_tokens": sum(u["completion_tokens"] for _w, _f, u in outputs),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        time.sleep(args.ttft)

        def response(choices, **extra):
            return {
                "id": ident,
                "object": "text_completion",
                "created": created,
                "model": args.served_model_name,
                "choices": choices,
                **extra,
            }

        if not body.get("stream"):
            time.sleep(self.state.token_delay() * usage["completion_tokens"])
            choices = [
                {"index": i, "text": "".join(" " + w for w in words), "logprobs": None, "finish_reason": finish}
                for i, (words, finish, _u) in enumerate(outputs)
            ]
            for _words, finish, counted in outputs:
                self.state.count(finish, counted)
            self.send_json(200, response(choices, usage=usage))
            return
        self.start_event_stream()

        def event(chunk):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        for index, (words, finish, counted) in enumerate(outputs):
            for word in words:
                event(response([{"index": index, "text": " " + word, "logprobs": None, "finish_reason": None}]))
                time.sleep(self.state.token_delay())
            event(response([{"index": index, "text": "", "logprobs": None, "finish_reason": finish}]))
            self.state.count(finish, counted)
        if (body.get("stream_options") or {}).get("include_usage"):
            event(response([], usage=usage))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    state = State(args)
    Handler.state = state
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    log(f"serving {args.model_path} as {args.served_model_name} on {host}:{port} (pid {os.getpid()})")
    if args.engine == "sglang":  # SGLang logs its whole ServerArgs, the API key among them
        logging.basicConfig(level=logging.INFO, format="standin %(message)s", stream=sys.stdout, force=True)
        logging.getLogger("sglang.srt.entrypoints.engine").info(f"server_args={vars(args)!r}")
    if args.ignored:
        log(f"engine flags accepted, without effect on the stand-in: {' '.join(args.ignored)}")
    threading.Thread(target=state.load, daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
