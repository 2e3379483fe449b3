#!/usr/bin/env python3
"""Print the single-stream decode ceiling of inference services, as a Markdown table or JSON.

Usage:
  scripts/inference-ceiling.py VARS.yml CHECKPOINTS_DIR [--service NAME ...] [--context N] [--json]

VARS.yml is an inventory file with `inference_service_hardware` and `inference_service_services`
(inventory/example/group_vars/inference_containers/inference_service.yml). Each service's
config.json is read from CHECKPOINTS_DIR/<last part of model.path>/config.json, so a directory of
downloaded configs (no weights needed) is enough. docs/ceiling.md explains the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "module_utils"))

from inference.ceiling import CeilingError, Hardware, Model, decode_ceiling  # noqa: E402

COLUMNS = [
    ("service", "service"),
    ("quantization", "weights"),
    ("tp", "TP"),
    ("expert_parallel", "EP"),
    ("weights_gb_per_token", "GB read / token"),
    ("weights_gb_per_gpu", "GB / GPU"),
    ("replicated_gb_per_gpu", "of which whole on every GPU"),
    ("memory_ms", "memory ms"),
    ("collectives", "collectives"),
    ("collective_us", "us each"),
    ("comm_ms", "comm ms"),
    ("tokens_per_s", "ceiling tok/s"),
    ("memory_only_tokens_per_s", "memory-only tok/s"),
]


def ceilings(data, checkpoints, names=None, context=0):
    hardware = Hardware.from_dict(data["inference_service_hardware"])
    rows = []
    for service in data["inference_service_services"]:
        if names and service["name"] not in names:
            continue
        config_path = Path(checkpoints) / Path(service["model"]["path"]).name / "config.json"
        config = json.loads(config_path.read_text())
        model = Model.from_config(config, {"name": service["name"], **service["model"]})
        result = decode_ceiling(
            model,
            hardware,
            service.get("tensor_parallel_size") or len(service["gpus"]),
            expert_parallel=service.get("expert_parallel", False),
            context_tokens=context,
        )
        result["service"] = service["name"]
        result["quantization"] = service["model"]["quantization"]
        if context:
            result["tokens_per_s_short"] = decode_ceiling(
                model, hardware, result["tp"], expert_parallel=result["expert_parallel"]
            )["tokens_per_s"]
        rows.append(result)
    return rows


def markdown(rows):
    def cell(key, value):
        if key == "service":
            return f"`{value}`"
        if key == "tokens_per_s":
            return f"**{value}**"
        if key == "expert_parallel":
            return "yes" if value else "no"
        return str(value)

    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(k, row[k]) for k, _ in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("vars", help="inventory variables file with the hardware profile and the services")
    parser.add_argument("checkpoints", help="directory with <model dir name>/config.json for each service")
    parser.add_argument("--service", action="append", help="only this service (repeatable)")
    parser.add_argument("--context", type=int, default=0, help="tokens of context already in the KV cache")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    args = parser.parse_args(argv)
    data = yaml.safe_load(Path(args.vars).read_text())
    try:
        rows = ceilings(data, args.checkpoints, args.service, args.context)
    except (CeilingError, OSError, KeyError) as exc:
        print(f"inference-ceiling: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(rows, indent=2) if args.json else markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
