"""The engines' own serving benchmarks: their command lines, and their results read as one shape.

playbooks/benchmark.yml measures a service with the benchmark its engine ships in the service's environment,
so that its figures compare with what others publish for the same engine:

* vLLM: ``<env>/bin/vllm bench serve``, random dataset (random token ids, exactly ``input_tokens`` long by
  the model's tokenizer), ``--ignore-eos`` so that every request generates exactly ``output_tokens``;
* SGLang: ``<env>/bin/python -m sglang.bench_serving``, dataset ``random-ids`` (the same kind of prompt;
  SGLang's ``random`` downloads ShareGPT to cut its prompts from) with ``--random-range-ratio 1`` (SGLang's
  default 0 draws every length from 1 to the given length, vLLM's default 0 keeps it fixed); SGLang ignores
  EOS unless told not to.

One run per concurrency ``c``, ``c x rounds`` prompts at most ``c`` at a time, through the service's
OpenAI-compatible completions (the engines' default) or chat API. Both benchmarks take the API key from
``OPENAI_API_KEY`` in their environment and send it as ``Authorization: Bearer``; it is on no command line.

``level`` reads a result file of either engine (vLLM writes one JSON object, SGLang appends one JSON line
per run) into the fields playbooks/files/inference-bench-report.py tabulates. Standard library only.
"""

from __future__ import annotations

import json
import os

ENGINES = ("vllm", "sglang")
APIS = ("completions", "chat")
KEY_ENV = "OPENAI_API_KEY"
HIDDEN = "<hidden>"

# api -> (backend, endpoint) for vLLM, backend for SGLang (its backends imply the endpoint).
VLLM_BACKENDS = {"completions": ("openai", "/v1/completions"), "chat": ("openai-chat", "/v1/chat/completions")}
SGLANG_BACKENDS = {"completions": "sglang-oai", "chat": "sglang-oai-chat"}
TOOLS = {"vllm": "vllm bench serve", "sglang": "python -m sglang.bench_serving"}
# Below this median TPOT (10 000 tokens a second for one request) the tokens came in one piece.
ONE_PIECE_TPOT_MS = 0.1
NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def num_prompts(concurrency, rounds):
    """Requests in one run: ``rounds`` full waves of ``concurrency`` (one wave at least)."""
    return int(concurrency) * max(1, int(rounds))


def result_name(engine, concurrency):
    """The file one run writes: SGLang's benchmark appends JSON lines, vLLM's writes one JSON object."""
    return f"{engine}-c{int(concurrency)}.{'jsonl' if engine == 'sglang' else 'json'}"


def _flag(service, name):
    args = service.get("args") or {}
    for key, value in args.items():
        if str(key).lstrip("-").replace("_", "-") == name:
            return value
    return None


def bench_argv(
    service, *, url, served_name, concurrency, rounds, input_tokens, output_tokens, api, result_dir, extra=()
):
    """The command line of one run of the service's engine's benchmark, writing ``result_dir/result_name``.

    ``service`` is the inventory's entry (engine, environment, model.path, args). The tokenizer is the
    checkpoint's, or the one the service's ``args`` give the server (vLLM's ``tokenizer``, SGLang's
    ``tokenizer-path``): prompts and outputs are counted in the model's tokens. Returns (argv, result file).
    """
    engine = service.get("engine")
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} has no benchmark here (vllm or sglang)")
    if api not in APIS:
        raise ValueError(f"api {api!r} is not one of {', '.join(APIS)}")
    if int(concurrency) < 1:
        raise ValueError(f"concurrency {concurrency} is not a positive number")
    env = str(service.get("environment", "")).rstrip("/")
    model_path = str(service["model"]["path"])
    path = os.path.join(result_dir, result_name(engine, concurrency))
    if engine == "vllm":
        backend, endpoint = VLLM_BACKENDS[api]
        argv = [f"{env}/bin/vllm", "bench", "serve", "--backend", backend, "--endpoint", endpoint]
        dataset = ["--dataset-name", "random"]
        lengths = ["--ignore-eos"]
    else:
        argv = [f"{env}/bin/python", "-m", "sglang.bench_serving", "--backend", SGLANG_BACKENDS[api]]
        dataset = ["--dataset-name", "random-ids"]
        lengths = ["--random-range-ratio", "1.0"]
    argv += ["--base-url", url.rstrip("/"), "--model", model_path, "--served-model-name", served_name]
    tokenizer = _flag(service, "tokenizer") or _flag(service, "tokenizer-path") or model_path
    argv += ["--tokenizer", str(tokenizer), *dataset]
    argv += ["--random-input-len", str(int(input_tokens)), "--random-output-len", str(int(output_tokens)), *lengths]
    argv += ["--max-concurrency", str(int(concurrency)), "--num-prompts", str(num_prompts(concurrency, rounds))]
    argv.append("--disable-tqdm")
    if engine == "vllm":
        argv += ["--percentile-metrics", "ttft,tpot,itl,e2el"]
        # The tokenizer needs what the server needed to load it (SGLang's benchmark always trusts remote code).
        if _flag(service, "trust-remote-code"):
            argv.append("--trust-remote-code")
        if _flag(service, "tokenizer-mode"):
            argv += ["--tokenizer-mode", str(_flag(service, "tokenizer-mode"))]
        argv += ["--save-result", "--result-dir", result_dir, "--result-filename", os.path.basename(path)]
    else:
        argv += ["--output-file", path]
    return argv + [str(a) for a in extra], path


def redact(value, secret):
    """``value`` (parsed JSON) with ``secret`` replaced by <hidden> wherever it occurs, and every non-empty
    ``*api_key`` field hidden: SGLang's benchmark saves the server's arguments, its API key among them."""
    if isinstance(value, dict):
        return {
            k: HIDDEN if str(k).endswith("api_key") and isinstance(v, str) and v else redact(v, secret)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v, secret) for v in value]
    if isinstance(value, str) and secret and secret in value:
        return value.replace(secret, HIDDEN)
    return value


def read_results(text):
    """The results in a result file: one JSON object (vLLM), or one per line (SGLang appends)."""
    text = text.strip()
    if not text:
        return []
    try:
        whole = json.loads(text)
    except ValueError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return whole if isinstance(whole, list) else [whole]


def engine_of(result):
    """Which benchmark wrote ``result``: vLLM's names its endpoint type, SGLang's counts retokenized output."""
    if "endpoint_type" in result:
        return "vllm"
    if "total_output_tokens_retokenized" in result or "server_info" in result:
        return "sglang"
    raise ValueError("neither vllm bench serve's nor sglang.bench_serving's result (no endpoint_type, server_info)")


def _round(value):
    return round(float(value), 2) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _stats(result, name, field=None):
    # With no request completed the engines report 0 ms: no measurement, so none here.
    if not result.get("completed"):
        return dict.fromkeys(("mean", "median", "p99"))
    return {q: _round(result.get(f"{q}_{field or name}_ms")) for q in ("mean", "median", "p99")}


def level(result, requests=None):
    """One run's figures under one set of names, whichever engine's benchmark wrote them.

    vLLM counts failed requests; SGLang counts only completed ones, so its failures are the requests sent
    (``requests``, from the sweep) less those completed. Latencies are in ms (None when no request
    completed); ``request_tok_s_median`` is one request's decode speed, 1000 / median TPOT, None where the
    tokens came in one piece (``tokens_in_one_piece``: median TPOT under 0.1 ms).
    """
    engine = engine_of(result)
    completed = int(result.get("completed") or 0)
    if engine == "vllm":
        requests = int(result.get("num_prompts") or requests or 0) or None
        failed = result.get("failed")
        total = result.get("total_token_throughput")
        e2el = _stats(result, "e2el")
    else:
        requests = int(requests) if requests else None
        failed = requests - completed if requests is not None else None
        total = result.get("total_throughput")
        e2el = _stats(result, "e2el", "e2e_latency")
    # A stream whose tokens all arrive at once (a loaded server flushing its output late) gives a TPOT of next
    # to nothing: no decode speed can be read from it.
    tpot = result.get("median_tpot_ms") if completed else None
    one_piece = isinstance(tpot, (int, float)) and tpot < ONE_PIECE_TPOT_MS
    return {
        "engine": engine,
        "concurrency": result.get("max_concurrency"),
        "requests": requests,
        "completed": completed,
        "failed": failed,
        "duration_s": _round(result.get("duration")),
        "input_tokens": result.get("total_input_tokens"),
        "output_tokens": result.get("total_output_tokens"),
        "output_tok_s": _round(result.get("output_throughput")),
        "total_tok_s": _round(total),
        "requests_per_s": _round(result.get("request_throughput")),
        "ttft_ms": _stats(result, "ttft"),
        "tpot_ms": _stats(result, "tpot"),
        "itl_ms": _stats(result, "itl"),
        "e2el_ms": e2el,
        "request_tok_s_median": round(1000.0 / tpot, 2) if tpot and not one_piece else None,
        "tokens_in_one_piece": one_piece,
    }
