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
  ``ignore_eos``); ``stream: true`` sends server-sent events, one per
  token, after ``--ttft`` seconds, each ``--token-latency`` seconds apart, slowed down by
  ``--batch-slowdown`` for each other request in flight (a crude batching model for benchmarks).
* ``--reasoning`` (STANDIN_REASONING=1): a reasoning model that first spends ``--reasoning-tokens``
  tokens on ``reasoning_content``; with a smaller ``max_tokens`` the answer is ``content: null`` and
  ``finish_reason: length``, as real reasoning models do.
* ``--api-key``: the /v1 endpoints require ``Authorization: Bearer``. Like the real engines, a ``vllm serve``
  command line also takes the key from ``VLLM_API_KEY``; an SGLang command line takes it only as ``--api-key``
  (SGLang reads no environment variable for it), and logs its parsed arguments, key included, at start as
  SGLang does (the role's SGLang launcher hides it).
* ``--hold PATH`` (STANDIN_HOLD, colon-separated): keep these files open, as an engine keeps
  ``/dev/nvidia*`` open, so a GPU guard can see the process as a holder.
* ``POST /standin/crash``: the crash switch; the process exits with status 3 right after answering.
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
    after parsing do (status 1, the exception's type and message), as standin_engine.py records and keeps them."""
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
    refuse_as_the_engine(engine, ([served] if served else []) + argv)
    args.engine = engine
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


def canned(question):
    """The few questions the stand-in answers correctly, so a smoke test can check coherence."""
    text = str(question).lower()
    if "capital of france" in text:
        return "The capital of France is Paris."
    match = re.search(r"(\d+)\s*\+\s*(\d+)", text)
    if match:
        return f"{int(match.group(1)) + int(match.group(2))}"
    return None


def answer_tokens(messages, count):
    last = next((m.get("content") for m in reversed(messages or []) if m.get("role") == "user"), "") or ""
    known = canned(last)
    if known:
        return known.split()[:count]
    seed = sum(ord(c) for c in str(last))
    return [WORDS[(seed + i) % len(WORDS)] for i in range(count)]


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
        if self.path != "/v1/chat/completions":
            self.error(404, f"no route {self.path}")
            return
        if not self.state.ready.is_set():
            self.error(503, "model is loading")
            return
        if not self.authorised():
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self.error(400, "request body is not JSON")
            return
        if body.get("model") != self.state.args.served_model_name:
            self.error(404, f"model {body.get('model')!r} does not exist")
            return
        with self.state.lock:
            self.state.active += 1
        try:
            self.complete(body)
        finally:
            with self.state.lock:
                self.state.active -= 1

    def complete(self, body):
        args = self.state.args
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 64)
        reasoning_budget = args.reasoning_tokens if args.reasoning else 0
        reasoning_count = min(reasoning_budget, max_tokens)
        room = max(0, max_tokens - reasoning_budget)
        # A natural answer ends by itself; ignore_eos (vLLM, SGLang) makes it run to max_tokens.
        content_count = room if body.get("ignore_eos") else min(room, args.answer_tokens)
        reasoning = answer_tokens([{"role": "user", "content": "think"}], reasoning_count)
        content = answer_tokens(body.get("messages"), content_count)
        finish = "length" if reasoning_count + content_count >= max_tokens else "stop"
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": reasoning_count + content_count,
            "total_tokens": prompt_tokens + reasoning_count + content_count,
        }
        created = int(time.time())
        ident = f"chatcmpl-standin-{created}-{threading.get_ident()}"
        time.sleep(args.ttft)
        if not body.get("stream"):
            time.sleep(self.state.token_delay() * (reasoning_count + content_count))
            message = {"role": "assistant", "content": " ".join(content) if content else None}
            if args.reasoning:
                message["reasoning_content"] = " ".join(reasoning)
            choice = {"index": 0, "message": message, "finish_reason": finish}
            self.send_json(
                200,
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": args.served_model_name,
                    "choices": [choice],
                    "usage": usage,
                },
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

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

        event({"role": "assistant", "content": ""})
        for i, word in enumerate(reasoning):
            event({"reasoning_content": word if i == 0 else " " + word})
            time.sleep(self.state.token_delay())
        for i, word in enumerate(content):
            event({"content": word if i == 0 else " " + word})
            time.sleep(self.state.token_delay())
        event({}, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            event({}, None, {"choices": [], "usage": usage})
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
