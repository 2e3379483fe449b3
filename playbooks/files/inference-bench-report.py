#!/usr/bin/env python3
"""Turn the engines' own benchmark results into JSON, a Markdown table and a PNG plot, with the single-stream
decode ceiling and the measured/ceiling ratio next to them.

  playbooks/files/inference-bench-report.py RESULT [RESULT ...] --out-dir DIR [--name NAME]
                            [--service SERVICE.json --hardware HARDWARE.json --config CONFIG.json]
                            [--allreduce ALLREDUCE.json]

A RESULT is the sweep.json playbooks/benchmark.yml writes (what ran; its runs' result files are read from
its folder), or result files of ``vllm bench serve --save-result`` (one JSON object) or of
``python -m sglang.bench_serving --output-file`` (JSON lines), one level per run, in any mix.
plugins/module_utils/inference/bench.py reads both engines' fields under one set of names. SERVICE.json is
one entry of inference_service_services (model facts, tensor_parallel_size, expert_parallel), HARDWARE.json
is inference_service_hardware, CONFIG.json the checkpoint's config.json; without them the report has no
ceiling. ALLREDUCE.json is the result of allreduce-latency.py (benchmark.yml runs it across the service's GPUs):
when it measured as many GPUs as the service uses, with right sums, its latency replaces the hardware profile's
(absent or not usable: the profile's figure); the ceiling says which figure it used and where it came from.
Writes DIR/NAME.json, DIR/NAME.md, DIR/NAME.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "module_utils"))

from inference.bench import NAMES, TOOLS, engine_of, level, read_results  # noqa: E402
from inference.ceiling import CeilingError, Hardware, Model, allreduce_latency_source, decode_ceiling  # noqa: E402

SWEEP_KEYS = ("engine", "engine_version", "tool", "api", "url", "model", "input_tokens", "output_tokens", "rounds")


def load_results(paths):
    """(what ran, its levels by concurrency) from sweep files and engine result files."""
    about, levels = {}, []
    for path in map(Path, paths):
        for record in read_results(path.read_text()):
            if "runs" in record:
                about.update({k: record.get(k) for k in SWEEP_KEYS if record.get(k) is not None})
                about.setdefault("problems", []).extend(record.get("problems") or [])
                for run in record["runs"]:
                    result_file = path.parent / run["file"] if run.get("file") else None
                    if result_file and result_file.exists():
                        levels += [level(r, run.get("requests")) for r in read_results(result_file.read_text())]
            else:
                levels.append(level(record))
                about.setdefault("engine", engine_of(record))
                server = record.get("server_info") or {}
                about.setdefault("model", record.get("model_id") or server.get("served_model_name"))
    about.setdefault("tool", TOOLS.get(about.get("engine")))
    # Results alone do not say the lengths asked for: the first run that completed tells them.
    done = next((lv for lv in levels if lv["completed"]), None)
    for field in ("input_tokens", "output_tokens"):
        if about.get(field) is None and done and done[field] is not None:
            about[field] = round(done[field] / done["completed"])
    return about, sorted(levels, key=lambda lv: lv["concurrency"] or 0)


def ceiling_for(service, hardware, config, allreduce=None):
    """The ceiling of ``service``, with the all-reduce latency ``allreduce`` measured (allreduce-latency.py's
    result) where it fits the service, else the hardware profile's; the ceiling says which it used."""
    model = Model.from_config(config, {"name": service.get("name", "model"), **service["model"]})
    tp = int(service.get("tensor_parallel_size") or len(service["gpus"]))
    used, source = allreduce_latency_source(Hardware.from_dict(hardware), tp, allreduce)
    ceiling = decode_ceiling(model, used, tp, expert_parallel=bool(service.get("expert_parallel")))
    return {**ceiling, "allreduce": source}


def single_stream(result):
    one = next((lv for lv in result["levels"] if lv["concurrency"] == 1), None)
    return one["request_tok_s_median"] if one else None


def cell(value):
    return "-" if value is None else str(value)


def spread(stats):
    """median (p99) of one latency."""
    return f"{cell(stats['median'])} ({cell(stats['p99'])})"


def row(lv):
    cells = [lv["concurrency"], lv["requests"], lv["failed"], lv["output_tok_s"], lv["total_tok_s"]]
    cells += [lv["requests_per_s"], spread(lv["ttft_ms"]), spread(lv["tpot_ms"]), spread(lv["itl_ms"])]
    cells.append(lv["request_tok_s_median"])
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def markdown(report):
    result, ceiling = report["result"], report["ceiling"]
    service = f" ({report['service']})" if report.get("service") else ""
    engine = NAMES.get(result.get("engine"), result.get("engine"))
    version = f" {result['engine_version']}" if result.get("engine_version") else ""
    api = f", {result['api']} API" if result.get("api") else ""
    rounds = f"; concurrency x {result['rounds']} requests per level" if result.get("rounds") else ""
    lines = [
        f"# Benchmark: {result.get('model')}{service}",
        "",
        f"Measured with {engine}{version}'s own benchmark (`{result.get('tool')}`{api}): "
        f"{cell(result.get('input_tokens'))} prompt tokens (random token ids) and "
        f"{cell(result.get('output_tokens'))} output tokens (EOS ignored) per request{rounds}. "
        "Latencies in ms: median (p99).",
        "",
        "| concurrency | requests | failed | output tok/s | total tok/s | requests/s | TTFT | TPOT | ITL "
        "| per-request tok/s (1000 / median TPOT) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(row(lv) for lv in result["levels"]),
    ]
    one_piece = [str(lv["concurrency"]) for lv in result["levels"] if lv.get("tokens_in_one_piece")]
    if one_piece:
        lines += [
            "",
            f"At concurrency {', '.join(one_piece)} the median TPOT is under 0.1 ms: the server sent each request's "
            "tokens in one piece (a loaded server flushing its output late), so no decode speed is read there.",
        ]
    for problem in result.get("problems") or []:
        lines += ["", f"Problem: {problem.splitlines()[0]}"]
    lines += ["", "## Single-stream ceiling", ""]
    if ceiling:
        ratio = report["ratio"]
        lines += [
            f"{ceiling['hardware']}, TP {ceiling['tp']}{' with expert parallel' if ceiling['expert_parallel'] else ''} "
            "(docs/ceiling.md explains the model).",
            "",
            "| | value |",
            "|---|---|",
            f"| weights read per token, per GPU | {ceiling['weights_gb_per_gpu']} GB |",
            f"| memory time per token | {ceiling['memory_ms']} ms |",
            f"| collectives per token | {ceiling['collectives']} x {ceiling['collective_us']} us "
            f"= {ceiling['comm_ms']} ms |",
            f"| all-reduce latency used | {ceiling['allreduce']['latency_us']} us: {ceiling['allreduce']['detail']} |",
            f"| **ceiling** | **{ceiling['tokens_per_s']} tok/s** |",
            f"| measured, one stream (1000 / median TPOT at concurrency 1) | {cell(ratio['measured_tok_s'])} tok/s |",
            f"| **measured / ceiling** | **{cell(ratio['ratio'])}** |",
        ]
    else:
        lines.append(f"No ceiling: {report.get('ceiling_error') or 'no model facts or hardware profile given'}.")
    return "\n".join(lines) + "\n"


def plot(report, path):
    import matplotlib  # noqa: PLC0415  (optional: only the PNG needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    result = report["result"]
    levels = [lv for lv in result["levels"] if lv["concurrency"]]
    conc = [lv["concurrency"] for lv in levels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(conc, [lv["output_tok_s"] or 0 for lv in levels], marker="o")
    left.set(xscale="log", xlabel="concurrent requests", ylabel="output tok/s (all requests)", title="Throughput")
    right.plot(conc, [lv["request_tok_s_median"] or 0 for lv in levels], marker="o", label="measured per request")
    if report["ceiling"]:
        right.axhline(report["ceiling"]["tokens_per_s"], color="tab:red", linestyle="--", label="single-stream ceiling")
    right.set(xscale="log", xlabel="concurrent requests", ylabel="tok/s per request (1 / TPOT)", title="Decode speed")
    right.legend()
    for axis in (left, right):
        axis.set_xticks(conc, [str(c) for c in conc])
        axis.grid(alpha=0.3)
    fig.suptitle(
        f"{result.get('model')}: {result.get('tool')}, {cell(result.get('input_tokens'))} in / "
        f"{cell(result.get('output_tokens'))} out tokens per request"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build(result, service=None, hardware=None, config=None, allreduce=None):
    """The report of ``result`` ({what ran..., "levels": [...]}), with the ceiling where the facts allow (and the
    measured all-reduce latency ``allreduce`` in it where it fits)."""
    report = {"result": result, "service": (service or {}).get("name"), "ceiling": None, "ratio": None}
    if service and hardware and config and service.get("model", {}).get("active_params_b"):
        try:
            report["ceiling"] = ceiling_for(service, hardware, config, allreduce)
        except (CeilingError, KeyError, ValueError) as exc:
            report["ceiling_error"] = str(exc)
    if report["ceiling"]:
        measured = single_stream(result)
        report["ratio"] = {
            "measured_tok_s": measured,
            "ceiling_tok_s": report["ceiling"]["tokens_per_s"],
            "ratio": round(measured / report["ceiling"]["tokens_per_s"], 3) if measured else None,
        }
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", metavar="RESULT")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--name", default="benchmark")
    parser.add_argument("--service")
    parser.add_argument("--hardware")
    parser.add_argument("--config")
    parser.add_argument("--allreduce", help="allreduce-latency.py's JSON result: the measured all-reduce latency")
    args = parser.parse_args(argv)

    def load(path):
        return json.loads(Path(path).read_text()) if path else None

    about, levels = load_results(args.results)
    if not levels:
        parser.error("no result of vllm bench serve or sglang.bench_serving in " + ", ".join(args.results))
    allreduce = load(args.allreduce) if args.allreduce and Path(args.allreduce).exists() else None
    report = build(
        {**about, "levels": levels}, load(args.service), load(args.hardware), load(args.config), allreduce=allreduce
    )
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{args.name}.md").write_text(markdown(report))
    plot(report, out / f"{args.name}.png")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
