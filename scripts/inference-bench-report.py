#!/usr/bin/env python3
"""Turn a concurrency sweep (scripts/inference-bench.py) into JSON, a Markdown table and a PNG plot,
with the single-stream decode ceiling and the measured/ceiling ratio next to it.

  inference-bench-report.py RESULT.json --out-dir DIR [--name NAME]
                            [--service SERVICE.json --hardware HARDWARE.json --config CONFIG.json]

SERVICE.json is one entry of inference_service_services (model facts, tensor_parallel_size,
expert_parallel), HARDWARE.json is inference_service_hardware, CONFIG.json the checkpoint's
config.json. Without them the report has no ceiling. Writes DIR/NAME.json, DIR/NAME.md, DIR/NAME.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "module_utils"))

from inference.ceiling import CeilingError, Hardware, Model, decode_ceiling  # noqa: E402


def ceiling_for(service, hardware, config):
    model = Model.from_config(config, {"name": service.get("name", "model"), **service["model"]})
    tp = int(service.get("tensor_parallel_size") or len(service["gpus"]))
    return decode_ceiling(model, Hardware.from_dict(hardware), tp, expert_parallel=bool(service.get("expert_parallel")))


def single_stream(result):
    level = next((lv for lv in result["levels"] if lv["concurrency"] == 1), None)
    return level["request_tok_s_median"] if level else None


def markdown(report):
    result, ceiling = report["result"], report["ceiling"]
    service = f" ({report['service']})" if report.get("service") else ""
    lines = [
        f"# Benchmark: {result['model']}{service}",
        "",
        f"{result['started']}; {result['input_tokens']} prompt words and {result['output_tokens']} output tokens "
        f"per request; concurrency x {result['rounds']} requests per level; {result['url']}.",
        "",
        "| concurrency | requests | errors | output tok/s | per-request tok/s | TTFT p50 ms | TTFT p99 ms "
        "| TPOT p50 ms | TPOT p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in result["levels"]:
        ttft, tpot = lv.get("ttft_ms") or {}, lv.get("tpot_ms") or {}
        lines.append(
            f"| {lv['concurrency']} | {lv['requests']} | {lv['errors']} | {lv['output_tok_s']} | "
            f"{lv['request_tok_s_median']} | {ttft.get('p50')} | {ttft.get('p99')} | {tpot.get('p50')} | "
            f"{tpot.get('p99')} |"
        )
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
            f"| **ceiling** | **{ceiling['tokens_per_s']} tok/s** |",
            f"| measured, one stream (1 / median TPOT at concurrency 1) | {ratio['measured_tok_s']} tok/s |",
            f"| **measured / ceiling** | **{ratio['ratio']}** |",
        ]
    else:
        lines.append(f"No ceiling: {report.get('ceiling_error') or 'no model facts or hardware profile given'}.")
    return "\n".join(lines) + "\n"


def plot(report, path):
    import matplotlib  # noqa: PLC0415  (optional: only the PNG needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    levels = report["result"]["levels"]
    conc = [lv["concurrency"] for lv in levels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(conc, [lv["output_tok_s"] for lv in levels], marker="o")
    left.set(xscale="log", xlabel="concurrent requests", ylabel="output tok/s (all requests)", title="Throughput")
    right.plot(conc, [lv["request_tok_s_median"] or 0 for lv in levels], marker="o", label="measured per request")
    if report["ceiling"]:
        right.axhline(report["ceiling"]["tokens_per_s"], color="tab:red", linestyle="--", label="single-stream ceiling")
    right.set(xscale="log", xlabel="concurrent requests", ylabel="tok/s per request (1 / TPOT)", title="Decode speed")
    right.legend()
    for axis in (left, right):
        axis.set_xticks(conc, [str(c) for c in conc])
        axis.grid(alpha=0.3)
    fig.suptitle(f"{report['result']['model']}: {report['result']['output_tokens']} output tokens per request")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build(result, service=None, hardware=None, config=None):
    report = {"result": result, "service": (service or {}).get("name"), "ceiling": None, "ratio": None}
    if service and hardware and config and service.get("model", {}).get("active_params_b"):
        try:
            report["ceiling"] = ceiling_for(service, hardware, config)
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
    parser.add_argument("result")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--name", default="benchmark")
    parser.add_argument("--service")
    parser.add_argument("--hardware")
    parser.add_argument("--config")
    args = parser.parse_args(argv)

    def load(path):
        return json.loads(Path(path).read_text()) if path else None

    report = build(load(args.result), load(args.service), load(args.hardware), load(args.config))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{args.name}.md").write_text(markdown(report))
    plot(report, out / f"{args.name}.png")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
