#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: inference_benchmark
short_description: Run the service's engine's own serving benchmark at each concurrency, next to the service
description:
  - Runs C(<environment>/bin/vllm bench serve) for a vLLM service, C(<environment>/bin/python -m
    sglang.bench_serving) for an SGLang one, once per concurrency C(c) with C(c x rounds) prompts of random
    token ids, exactly O(input_tokens) long in the model's tokens, each generating exactly O(output_tokens)
    (EOS ignored). Each run saves the engine's own JSON result, and its output as a log, in O(result_dir).
  - The API key is read on the target from the unit's secret environment file and handed to the benchmark in
    its environment as C(OPENAI_API_KEY), which both engines' benchmarks send as a bearer token; it is on no
    command line. SGLang's result carries the server's arguments, the key among them; the saved files and
    logs show it as C(<hidden>).
  - A run that exits non-zero, outlasts O(run_timeout) or writes no result ends the sweep (a larger
    concurrency would fare no better); the levels not run and every failed request are listed in
    C(sweep.problems), and the module still succeeds, so that the levels measured can be reported. It fails
    only when the benchmark cannot be started at all.
  - Check mode runs nothing and returns the command lines.
version_added: "0.1.0"
author: inferhost contributors
options:
  service:
    description: The service's entry of C(inference_service_services) (C(engine), C(environment), C(model.path),
      C(args)).
    type: dict
    required: true
  concurrency:
    description: The levels, one run each, in this order.
    type: list
    elements: int
    required: true
  rounds:
    description: Prompts per run are C(concurrency x rounds).
    type: int
    default: 2
  input_tokens:
    description: Prompt length in the model's tokens.
    type: int
    default: 1000
  output_tokens:
    description: Tokens generated per request.
    type: int
    default: 1000
  api:
    description: The API measured, C(completions) (the engines' benchmarks' default) or C(chat).
    type: str
    choices: [completions, chat]
    default: completions
  result_dir:
    description: Directory on the target for the results and logs; created if absent.
    type: path
    required: true
  extra_args:
    description: Appended to every run's command line (for example C([--temperature, "0"]) for vLLM).
    type: list
    elements: str
    default: []
  run_timeout:
    description: Seconds one run may take; it is then stopped and the sweep ends.
    type: int
    default: 3600
extends_documentation_fragment:
  - inference_client
attributes:
  check_mode:
    description: Runs nothing; returns the command lines.
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Run the engine's benchmark at concurrency 1, 8 and 64
  inference_benchmark:
    url: http://127.0.0.1:8000
    model: MiniMax-M2.5
    secret_file: /etc/inferhost/services/minimax-m25.secret.env
    service: "{{ inference_service_services | selectattr('name', 'equalto', 'minimax-m25') | first }}"
    concurrency: [1, 8, 64]
    result_dir: /tmp/bench
  async: 7200
  poll: 15
"""

RETURN = r"""
sweep:
  description: What was run and what came of it; playbooks/benchmark.yml saves it as C(sweep.json) for the report.
  returned: always
  type: dict
  sample:
    engine: vllm
    tool: vllm bench serve
    api: completions
    url: http://127.0.0.1:8000
    model: MiniMax-M2.5
    input_tokens: 1000
    output_tokens: 1000
    rounds: 2
    runs:
      - concurrency: 1
        requests: 2
        argv: [/opt/venvs/vllm/bin/vllm, bench, serve, --backend, openai, "..."]
        file: vllm-c1.json
        log: vllm-c1.log
        rc: 0
        seconds: 41.3
        timed_out: false
        completed: 2
        failed: 0
        output_tok_s: 88.4
    problems: []
lines:
  description: One line per run, for the play's output.
  returned: always
  type: list
  elements: str
  sample: ["c=1: 2 of 2 completed, 88.4 output tok/s, TTFT median 92.1 ms, TPOT median 11.2 ms"]
"""

LOG_TAIL_LINES = 15


def stop(proc):
    """Stop the run's whole process group: TERM, then KILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_one(argv, env, log_path, timeout):
    """Run one benchmark with its output in log_path; (rc, seconds, timed_out)."""
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rc, timed_out = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            stop(proc)
            rc, timed_out = proc.returncode, True
    return rc, round(time.monotonic() - start, 1), timed_out


def scrub_file(path, secret, bench):
    """Hide the key in a written log or result; the parsed results of a result file (None for a log or an
    unreadable result)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    results = None
    if path.endswith((".json", ".jsonl")):
        try:
            results = bench.read_results(text)
        except ValueError:
            results = None
    if results is None:
        if secret and secret in text:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text.replace(secret, bench.HIDDEN))
        return None
    clean = [bench.redact(r, secret) for r in results]
    if clean != results or (secret and secret in text):
        if path.endswith(".jsonl"):
            body = "".join(json.dumps(r) + "\n" for r in clean)
        else:
            body = json.dumps(clean[0] if len(clean) == 1 else clean)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(body)
    return clean


def tail(path, secret, bench):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return ""
    text = "\n".join(lines)
    return text.replace(secret, bench.HIDDEN) if secret else text


def environment(key, bench):
    """The benchmark's environment: ours, with the service's key as OPENAI_API_KEY and no other key."""
    env = {k: v for k, v in os.environ.items() if k not in (bench.KEY_ENV, "API_KEY", "INFERHOST_API_KEY")}
    if key:
        env[bench.KEY_ENV] = key
    env["PYTHONUNBUFFERED"] = "1"
    return env


def summary_line(concurrency, figures):
    of = f" of {figures['requests']}" if figures["requests"] is not None else ""
    line = f"c={concurrency}: {figures['completed']}{of} completed"
    if figures["completed"]:
        ttft, tpot = figures["ttft_ms"]["median"], figures["tpot_ms"]["median"]
        line += f", {figures['output_tok_s']} output tok/s, TTFT median {ttft} ms, TPOT median {tpot} ms"
    if figures["tokens_in_one_piece"]:
        line += " (the tokens came in one piece)"
    return line


def plan(p, bench):
    """(concurrency, prompts, argv, result file) of each run, in order."""
    runs = []
    for concurrency in p["concurrency"]:
        argv, path = bench.bench_argv(
            p["service"],
            url=p["url"],
            served_name=p["model"],
            concurrency=concurrency,
            rounds=p["rounds"],
            input_tokens=p["input_tokens"],
            output_tokens=p["output_tokens"],
            api=p["api"],
            result_dir=p["result_dir"],
            extra=p["extra_args"],
        )
        runs.append((concurrency, bench.num_prompts(concurrency, p["rounds"]), argv, path))
    return runs


def measure(p, bench, key, planned, tool):
    """Run the planned levels until one gives no result; (runs, problems, lines)."""
    runs, problems, lines = [], [], []
    env = environment(key, bench)
    for index, (concurrency, requests, argv, path) in enumerate(planned):
        log_path = path.rsplit(".", 1)[0] + ".log"
        rc, seconds, timed_out = run_one(argv, env, log_path, p["run_timeout"])
        scrub_file(log_path, key, bench)
        results = scrub_file(path, key, bench) if os.path.exists(path) else None
        figures = bench.level(results[-1], requests) if results else None
        run = {"concurrency": concurrency, "requests": requests, "argv": argv, "file": os.path.basename(path)}
        run.update(log=os.path.basename(log_path), rc=rc, seconds=seconds, timed_out=timed_out)
        if figures:
            run.update(completed=figures["completed"], failed=figures["failed"], output_tok_s=figures["output_tok_s"])
            lines.append(summary_line(concurrency, figures))
        runs.append(run)
        why = None
        if timed_out:
            why = f"stopped after {p['run_timeout']} s (run_timeout)"
        elif rc != 0:
            why = f"{tool} exited with {rc}"
        elif not figures:
            why = f"{tool} wrote no result in {run['file']}"
        if why:
            rest = ", ".join(str(c) for c, _, _, _ in planned[index + 1 :])
            not_run = f"; not run: concurrency {rest}" if rest else ""
            problems.append(f"concurrency {concurrency}: {why}{not_run}. Its log ends:\n{tail(log_path, key, bench)}")
            lines.append(f"c={concurrency}: {why}")
            break
        if figures["failed"]:
            problems.append(f"concurrency {concurrency}: {figures['failed']} of {requests} requests failed")
    return runs, problems, lines


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "secret_file": {"type": "path"},
            "service": {"type": "dict", "required": True},
            "concurrency": {"type": "list", "elements": "int", "required": True},
            "rounds": {"type": "int", "default": 2},
            "input_tokens": {"type": "int", "default": 1000},
            "output_tokens": {"type": "int", "default": 1000},
            "api": {"type": "str", "choices": ["completions", "chat"], "default": "completions"},
            "result_dir": {"type": "path", "required": True},
            "extra_args": {"type": "list", "elements": "str", "default": []},
            "run_timeout": {"type": "int", "default": 3600},
        },
        supports_check_mode=True,
    )
    # Imported after argument parsing, so ansible-lint's args rule can validate tasks without our module_utils.
    from ansible.module_utils.inference import bench  # noqa: PLC0415
    from ansible.module_utils.inference.client import read_key  # noqa: PLC0415

    p = module.params
    if not p["concurrency"] or min(p["concurrency"]) < 1:
        module.fail_json(msg=f"concurrency must be positive numbers, not {p['concurrency']}")
    tool = bench.TOOLS.get(p["service"].get("engine"), "the benchmark")
    try:
        planned = plan(p, bench)
    except (ValueError, KeyError, TypeError) as exc:
        module.fail_json(msg=f"cannot build the benchmark's command line: {exc}")
    sweep = {"engine": p["service"].get("engine"), "tool": tool}
    sweep.update({k: p[k] for k in ("api", "url", "model", "input_tokens", "output_tokens", "rounds")})
    if module.check_mode:
        sweep.update(runs=[{"concurrency": c, "requests": n, "argv": argv} for c, n, argv, _ in planned], problems=[])
        lines = [f"c={c}: would run {shlex.join(argv)}" for c, _, argv, _ in planned]
        module.exit_json(changed=False, sweep=sweep, lines=lines, msg="check mode: nothing run")
    program = planned[0][2][0]
    if not os.access(program, os.X_OK):
        module.fail_json(msg=f"{program} is missing or not executable: the service's environment has no {tool}")
    try:
        os.makedirs(p["result_dir"], exist_ok=True)
        runs, problems, lines = measure(p, bench, read_key(p["secret_file"]), planned, tool)
    except OSError as exc:
        module.fail_json(msg=f"cannot run {tool}: {exc}")
    sweep.update(runs=runs, problems=problems)
    module.exit_json(changed=False, sweep=sweep, lines=lines)


if __name__ == "__main__":
    main()
