#!/usr/bin/env python3
"""Concurrency sweep against an OpenAI-compatible server: output tok/s, TTFT and TPOT per concurrency.

Standard library only: playbooks/benchmark.yml copies it to the guest, with the API client it imports
(plugins/module_utils/inference/client.py, in the repository's layout), and runs it there with the system
python3, next to the service (which usually listens on 127.0.0.1 only).

  inference-bench.py --url http://127.0.0.1:8000 --model NAME [--key-file FILE]
                     [--concurrency 1,2,4,8,16,32,64,128,256,512,1024] [--rounds 2]
                     [--input-tokens 1000] [--output-tokens 1000] [--timeout 600] [--out result.json]

For each concurrency c it sends c x rounds streamed chat requests, c at a time, each asking for exactly
--output-tokens tokens (ignore_eos), and measures per request the time to the first token (TTFT) and the
time per output token after it (TPOT). A level's output tok/s is all output tokens over the level's wall
time. The result is JSON (stdout, or --out); scripts/inference-bench-report.py turns it into a table, a
plot, and puts the single-stream ceiling next to it.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

# The key file is read as the modules read it; on the guest the client sits in the same layout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "module_utils"))

from inference.client import read_key  # noqa: E402

VOCABULARY = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "river",
    "stone",
    "cloud",
    "field",
    "light",
    "ocean",
    "forest",
]


def prompt(index, words, rng):
    # A distinct first word per request keeps prefix caches from turning the sweep into a cache test.
    return f"request {index}: " + " ".join(rng.choice(VOCABULARY) for _ in range(words))


def one_request(args, key, index, rng):
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": prompt(index, args.input_tokens, rng)}],
        "max_tokens": args.output_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(args.url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    start = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    with urllib.request.urlopen(request, timeout=args.timeout) as response:
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter()
    end = time.perf_counter()
    tokens = (usage or {}).get("completion_tokens") or chunks
    if first is None:
        raise ValueError("the stream carried no token")
    tpot = (end - first) / (tokens - 1) if tokens > 1 else None
    return {"ttft": first - start, "tpot": tpot, "tokens": tokens, "latency": end - start}


def percentiles(values):
    if not values:
        return None
    ordered = sorted(values)

    def pick(q):
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {
        "mean": round(statistics.fmean(ordered) * 1e3, 2),
        "p50": round(pick(0.5) * 1e3, 2),
        "p90": round(pick(0.9) * 1e3, 2),
        "p99": round(pick(0.99) * 1e3, 2),
    }


def run_level(args, key, concurrency, seed):
    total = max(concurrency, concurrency * args.rounds)
    jobs = queue.Queue()
    for i in range(total):
        jobs.put(i)
    results, errors, lock = [], [], threading.Lock()

    def worker(worker_id):
        rng = random.Random(seed * 1000 + worker_id)
        while True:
            try:
                index = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                outcome = one_request(args, key, index, rng)
                with lock:
                    results.append(outcome)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                with lock:
                    errors.append(str(getattr(exc, "reason", exc))[:200])

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    tpots = [r["tpot"] for r in results if r["tpot"]]
    return {
        "concurrency": concurrency,
        "requests": total,
        "ok": len(results),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:3],
        "duration_s": round(wall, 3),
        "output_tokens": tokens,
        "output_tok_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "request_tok_s_median": round(1.0 / statistics.median(tpots), 2) if tpots else None,
        "ttft_ms": percentiles([r["ttft"] for r in results]),
        "tpot_ms": percentiles(tpots),
    }


def arguments():
    """The command line; its defaults are playbooks/benchmark.yml's (the reference deployment's sweep)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--key-file", help="environment file with INFERHOST_API_KEY (the unit's secret file)")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64,128,256,512,1024")
    parser.add_argument("--rounds", type=int, default=2, help="requests per concurrency level = c x rounds")
    parser.add_argument("--input-tokens", type=int, default=1000, help="prompt length, in words")
    parser.add_argument("--output-tokens", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--warmup", type=int, default=1, help="requests sent before measuring")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the JSON here instead of stdout")
    return parser


def main(argv=None):
    parser = arguments()
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1:
        parser.error("--concurrency needs positive integers")
    key = read_key(args.key_file)
    rng = random.Random(args.seed)
    for i in range(args.warmup):
        one_request(args, key, -1 - i, rng)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result = {
        "url": args.url,
        "model": args.model,
        "started": started,
        "input_tokens": args.input_tokens,
        "output_tokens": args.output_tokens,
        "rounds": args.rounds,
        "levels": [],
    }
    for n, concurrency in enumerate(levels):
        level = run_level(args, key, concurrency, args.seed + n)
        result["levels"].append(level)
        print(
            f"c={concurrency}: {level['output_tok_s']} tok/s, TTFT p50 {(level['ttft_ms'] or {}).get('p50')} ms, "
            f"TPOT p50 {(level['tpot_ms'] or {}).get('p50')} ms, errors {level['errors']}",
            file=sys.stderr,
            flush=True,
        )
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        print(text)
    return 0 if all(level["ok"] for level in result["levels"]) else 1


if __name__ == "__main__":
    sys.exit(main())
