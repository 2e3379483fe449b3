"""Run every molecule scenario, with a zero-change --check pass on the converged instances.

One `molecule test` per scenario (each molecule start costs seconds), with the sequence of
.config/molecule/config.yml: create, prepare, converge, idempotence, check, verify, destroy (after a
`molecule reset`).
Molecule's own `check` step only runs converge in check mode; here a check run that reports any change
fails, because `--check` on a converged machine must be a no-op. Each step's time is taken from the
moment molecule announces it, and printed in the run's summary (tests/conftest.py).
"""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(
    p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml") if p.parent.name not in {"shared", "kernel"}
)
# The scenarios the repository has (molecule/shared holds their common playbooks and is none). One missing or
# renamed fails collection: parametrize would only skip an empty list, and the layer would pass having run nothing.
EXPECTED_SCENARIOS = {"gpu_switch", "guest_env", "inference_service", "nccl_tuning", "pve_host_gpu"}
_MISSING = sorted(EXPECTED_SCENARIOS - set(SCENARIOS))
if _MISSING:
    pytest.fail(f"molecule scenarios missing from {ROOT / 'molecule'}: {_MISSING} (found {SCENARIOS})", pytrace=False)
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=\d+\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)")
# Molecule's announcement of a step: "[<scenario> > <step>] Executing" (or, on a terminal,
# "<scenario> \u279c <step>: Executing").
STEP = re.compile(r"(?:\[\S+ > (?P<step>[a-z_]+)\]|\S+ \u279c (?P<term>[a-z_]+):) Executing\b")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

pytestmark = pytest.mark.molecule


def plain(line):
    """The line without colours and without the border molecule draws around a command's output."""
    return ANSI.sub("", line).strip().lstrip("\u2502\u250c\u2514").strip()


def run_test(scenario):
    """molecule test -s scenario: (rc, {step: [lines]}, {step: seconds}), steps in the order they ran."""
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "containers.conf"), "ANSIBLE_FORCE_COLOR": "0"}
    # An interrupted run leaves molecule's state saying the machines exist, and create would skip them:
    # reset forgets it (create.yml replaces the machines themselves).
    subprocess.run(["molecule", "reset", "-s", scenario], cwd=ROOT, env=env, capture_output=True, check=True)
    argv = ["molecule", "test", "-s", scenario]
    output, seconds = {"start": []}, {}
    step, since = "start", time.monotonic()
    with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for raw in proc.stdout:
            line = plain(raw)
            found = STEP.search(line)
            if found:
                now = time.monotonic()
                seconds[step] = seconds.get(step, 0.0) + now - since
                step, since = found.group("step") or found.group("term"), now
                output.setdefault(step, [])
            output[step].append(line)
    seconds[step] = seconds.get(step, 0.0) + time.monotonic() - since
    seconds.pop("start", None)
    return proc.returncode, output, seconds


def changed_hosts(lines):
    """Hosts whose PLAY RECAP line reports changed > 0 (all plays of the step)."""
    hits = [m.groupdict() for line in lines if (m := RECAP.match(line))]
    assert hits, "no PLAY RECAP in the output:\n" + "\n".join(lines[-60:])
    return sorted({h["host"] for h in hits if int(h["changed"])})


def failures(output):
    """Each failed task of the step that failed, under its TASK line: the tail of a long run shows the hosts that
    went on, not the one that stopped (a step's expected failures, in prepare's negative tests, are left out)."""
    failed = [lines for lines in output.values() if any("Executed: Failed" in line for line in lines)]
    lines = failed[0] if failed else []
    found, task = [], ""
    for line, after in zip(lines, [*lines[1:], ""], strict=True):
        if line.startswith("TASK ["):
            task = line
        # Ansible prints "...ignoring" on the line after a failure that the task ignores.
        elif line.startswith(("fatal:", "failed:")) and after != "...ignoring":
            found += [task, line[:1500]]
    return "\n".join(found) or "(no failed task in the output)"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, record_property):
    rc, output, seconds = run_test(scenario)
    record_property("molecule_steps", seconds)
    tail = "\n".join(line for lines in output.values() for line in lines)[-6000:]
    assert rc == 0, f"molecule test -s {scenario} failed (rc {rc}):\n{failures(output)}\n[...]\n{tail}"
    expected = ["create", "prepare", "converge", "idempotence", "check", "verify", "destroy"]
    assert all(step in output for step in expected), f"steps run: {list(output)}\n{tail}"
    changed = changed_hosts(output["check"])
    assert not changed, f"--check on the converged instances reports changes on {changed}"
    verified = "\n".join(output["verify"])
    assert re.search(r"\b\d+ passed\b", verified), f"verify ran no testinfra test:\n{verified[-3000:]}"
