#!/usr/bin/env python3
"""Benchmark the converge of the local lab: first converge against fresh machines versus the no-change
second converge, Ansible's own floor (as many trivial tasks, on the same hosts, over the same SSH connection),
and what each Ansible setting that makes a converge fast is worth.

    .venv/bin/python scripts/bench-converge.py [--repeat N]

Each converge is timed as a user runs it, `ansible-playbook -i inventory/lab/hosts.yml site.yml` from the
project's root; the same converge through ansible-runner, which inferhost-lab uses for its progress lines, is
printed beside it. Every figure is measured in this run and printed as a ratio to the project's own
settings, so the noise of a shared machine cancels out as far as it can. Needs the lab's tools (make bootstrap);
it starts the lab's machines fresh and leaves them converged.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


RECAP = re.compile(r"^\S+\s+:\s+ok=\d+\s+changed=(\d+)", re.MULTILINE)


def timed_converge(_lab, env: dict[str, str]) -> tuple[float, int]:
    return timed_command(labmod.ROOT / "site.yml", env)


def timed_command(path, env: dict[str, str]) -> tuple[float, int]:
    """ansible-playbook PATH against the lab as the README runs it: (seconds, changes in its PLAY RECAP)."""
    start = time.monotonic()
    inventory = labmod.INVENTORY / "hosts.yml"
    done = subprocess.run(
        [str(labmod.ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(path)],
        cwd=labmod.ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    secs = time.monotonic() - start
    if done.returncode:
        raise SystemExit(f"{path.name} failed (rc {done.returncode}):\n{done.stdout[-3000:]}")
    return secs, sum(int(n) for n in RECAP.findall(done.stdout))


def floor_playbook(result) -> Path:
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
    floor_path = floor_playbook(settled)
    floor = statistics.median(timed_command(floor_path, {})[0] for _ in range(args.repeat))
    runner = statistics.median(timed_playbook(labmod.ROOT / "site.yml", {})[0] for _ in range(args.repeat))
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
    print(f"the no-change converge through ansible-runner (inferhost-lab): {runner:.1f} s, {runner / base:.2f}x")
    return 0 if all(c == 0 for _, _, c in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
