"""Playbook runs from a molecule scenario's verify step, on its converged instances, as the converge reached
them (molecule's inventory, over SSH); the fixtures of a journey of such runs (a scenario's tests/conftest.py
imports them)."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import testinfra

ROOT = Path(__file__).resolve().parents[2]


def instances(request) -> list[str]:
    """The instances testinfra was given (molecule passes them as --hosts)."""
    return [h.split("://")[-1] for h in request.config.getoption("hosts").split(",") if h]


def machine(name: str):
    """A testinfra host for an instance, for use outside the per-host fixtures."""
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={os.environ['MOLECULE_INVENTORY_FILE']}")


def play(playbook: Path, hosts: list[str], *extra: str) -> dict[str, int]:
    """Run the playbook on those instances; it must succeed. Returns each host's changed count."""
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    argv = ["ansible-playbook", "-i", inventory, "--limit", ",".join(hosts), *extra, str(playbook)]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return {h: int(n) for h, n in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", proc.stdout, re.M)}


def installed(host, *patterns: str) -> dict[str, tuple[str, str]]:
    """{name: (dpkg's selection and state, e.g. "hi" when held, version)} of the installed packages matching."""
    fmt = "${db:Status-Abbrev}${Package}=${Version}\\n"
    out = host.run(" ".join(["dpkg-query", "--show", "--showformat", f"'{fmt}'", *(f"'{p}'" for p in patterns)]))
    found = {}
    for line in out.stdout.splitlines():
        if line[1:2] == "i":
            name, version = line[3:].split("=", 1)
            found[name] = (line[:2], version)
    return found


def journey(request, playbook: Path, steps: list[tuple[str, list[str]]], state) -> dict[str, dict[str, dict]]:
    """Run the playbook once per step (name, extra arguments) on every instance, and read each instance's
    state(host) after each: {step: {instance: {"changed": n, **state}}}."""
    hosts = instances(request)
    machines = {h: machine(h) for h in hosts}
    seen = {}
    for step, extra in steps:
        changed = play(playbook, hosts, *extra)
        seen[step] = {h: {"changed": changed[h], **state(m)} for h, m in machines.items()}
    return seen


@pytest.fixture(scope="module")
def journey_states(request):
    """journey() over the test module's JOURNEY (playbook, steps, state), run once for the module."""
    playbook, steps, state = request.module.JOURNEY
    return journey(request, playbook, steps, state)


@pytest.fixture
def at(journey_states, host):
    """The journey as the instance under test saw it: {step: {"changed": n, **state}}."""
    return {step: states[host.backend.host] for step, states in journey_states.items()}
