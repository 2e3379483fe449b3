#!/usr/bin/env python3
"""Benchmark the converge of the local lab: first converge against fresh machines versus the no-change
second converge, and what each Ansible setting that makes a converge fast is worth.

    .venv/bin/python scripts/bench_converge.py [--repeat N]

Every figure is measured in this run and printed as a ratio to the project's own settings, so the noise
of a shared machine cancels out as far as it can. Needs the lab's tools (make bootstrap); it starts the
lab's machines fresh and leaves them converged.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from inferhost import lab as labmod
from inferhost.runner import run_playbook

# Each variant turns one of the project's settings (ansible.cfg) back to Ansible's default.
VARIANTS = {
    "project settings": {},
    "no fact cache (gather every play)": {"ANSIBLE_GATHERING": "implicit", "ANSIBLE_CACHE_PLUGIN": "memory"},
    "no pipelining": {"ANSIBLE_PIPELINING": "False"},
    "strategy free": {"ANSIBLE_STRATEGY": "free"},
    "forks 5 (Ansible's default)": {"ANSIBLE_FORKS": "5"},
}


def timed_converge(lab, env: dict[str, str]) -> tuple[float, int]:
    start = time.monotonic()
    result = run_playbook(
        labmod.ROOT / "site.yml",
        inventory=labmod.INVENTORY / "hosts.yml",
        private_dir=labmod.STATE / "bench",
        project_dir=labmod.ROOT,
        env=env,
        quiet=True,
    )
    if result.status != "successful":
        raise SystemExit(f"converge failed: {result.first_failure}")
    return time.monotonic() - start, result.changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per variant (the median is reported)")
    args = parser.parse_args()
    lab = labmod.Lab.from_inventory()
    labmod.build_images(lab)
    labmod.start_fakepve(lab)
    labmod.remove_containers(lab)
    labmod.start_containers(lab)
    labmod.install_standins(lab)

    first, first_changed = timed_converge(lab, {})
    print(f"first converge (fresh machines): {first:6.1f} s, {first_changed} changes")
    rows = []
    for name, env in VARIANTS.items():
        runs = [timed_converge(lab, env) for _ in range(args.repeat)]
        changed = max(c for _, c in runs)
        rows.append((name, statistics.median(t for t, _ in runs), changed))
    base = rows[0][1]
    print(f"\n{'no-change converge':<36} {'median s':>9} {'vs project':>11} {'changes':>8}")
    for name, secs, changed in rows:
        print(f"{name:<36} {secs:9.1f} {secs / base:10.2f}x {changed:8d}")
    print(f"\nfirst converge / no-change converge: {first / base:.2f}x")
    return 0 if all(c == 0 for _, _, c in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
