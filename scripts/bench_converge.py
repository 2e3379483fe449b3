#!/usr/bin/env python3
"""Benchmark the converge of the local lab: first converge against fresh machines versus the no-change
second converge, Ansible's own floor (as many trivial tasks, on the same hosts, over the same SSH connection),
and what each Ansible setting that makes a converge fast is worth.

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

import yaml

from inferhost import lab as labmod
from inferhost.runner import run_playbook

# Each variant turns one of the project's settings (ansible.cfg) back to Ansible's default.
VARIANTS = {
    "project settings": {},
    "no fact cache (gather every play)": {"ANSIBLE_GATHERING": "implicit", "ANSIBLE_CACHE_PLUGIN": "memory"},
    "no pipelining": {"ANSIBLE_PIPELINING": "False"},
    "ssh compression (Ansible's default ssh_args)": {
        "ANSIBLE_SSH_ARGS": "-C -o ControlMaster=auto -o ControlPersist=60s"
    },
    "strategy free": {"ANSIBLE_STRATEGY": "free"},
    "forks 5 (Ansible's default)": {"ANSIBLE_FORKS": "5"},
}


def timed_converge(_lab, env: dict[str, str]) -> tuple[float, int]:
    secs, result = timed_playbook(labmod.ROOT / "site.yml", env)
    return secs, result.changed


def floor_playbook(result) -> labmod.Path:
    """A playbook with the plays of the converge, each on the same running hosts with as many trivial tasks as
    the converge ran there (its ok results per host)."""
    plays, off = [], set(labmod.left_for_later(result))  # a guest that is off runs nothing
    for play in result.plays:
        on = sorted(set(play.hosts) - off)
        if not on:
            continue
        per_host = play.ok // len(on)
        tasks = [{"name": f"trivial {n}", "ansible.builtin.stat": {"path": "/"}} for n in range(per_host)]
        hosts = ",".join(on)
        plays.append({"name": f"floor of {play.name}", "hosts": hosts, "gather_facts": False, "tasks": tasks})
    path = labmod.STATE / "bench" / "floor.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path


def timed_playbook(path, env: dict[str, str]):
    start = time.monotonic()
    result = run_playbook(
        path,
        inventory=labmod.INVENTORY / "hosts.yml",
        private_dir=labmod.STATE / "bench",
        project_dir=labmod.ROOT,
        env=env,
        quiet=True,
    )
    if result.status != "successful":
        raise SystemExit(f"{path.name} failed: {result.first_failure}")
    return time.monotonic() - start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per variant (the median is reported)")
    args = parser.parse_args()
    lab = labmod.Lab.from_inventory()
    labmod.remove_containers(lab)
    labmod.bring_up(lab)

    first, first_changed = timed_converge(lab, {})
    print(f"first converge (fresh machines): {first:6.1f} s, {first_changed} changes")
    _, settled = timed_playbook(labmod.ROOT / "site.yml", {})
    floor_runs = [timed_playbook(floor_playbook(settled), {}) for _ in range(args.repeat)]
    floor = statistics.median(secs for secs, _ in floor_runs)
    executed = sum(play.ok for play in settled.plays)
    print(f"Ansible's floor: {executed} trivial tasks over SSH in the same plays: {floor:6.1f} s")
    rows = []
    for name, env in VARIANTS.items():
        runs = [timed_converge(lab, env) for _ in range(args.repeat)]
        changed = max(c for _, c in runs)
        rows.append((name, statistics.median(t for t, _ in runs), changed))
    base = rows[0][1]
    width = max(len(name) for name in VARIANTS)
    print(f"\n{'no-change converge':<{width}} {'median s':>9} {'vs project':>11} {'changes':>8}")
    for name, secs, changed in rows:
        print(f"{name:<{width}} {secs:9.1f} {secs / base:10.2f}x {changed:8d}")
    print(f"\nfirst converge / no-change converge: {first / base:.2f}x")
    print(f"no-change converge / Ansible's floor ({executed} tasks): {base / floor:.2f}x")
    return 0 if all(c == 0 for _, _, c in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
