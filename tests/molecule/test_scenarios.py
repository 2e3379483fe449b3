"""Run every molecule scenario step by step, with a zero-change --check pass on the converged instances.

`molecule test` has an idempotence step but its `check` step only runs converge in check mode; here a
check run that reports any change fails, because `--check` on a converged machine must be a no-op.
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
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=\d+\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)")

pytestmark = pytest.mark.molecule


def molecule(step, scenario, *extra, check=True):
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "containers.conf"), "ANSIBLE_FORCE_COLOR": "0"}
    argv = ["molecule", step, "-s", scenario, *extra]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        pytest.fail(f"molecule {step} -s {scenario} failed (rc {proc.returncode}):\n{out[-6000:]}", pytrace=False)
    return out


def changed_hosts(output):
    """Hosts whose PLAY RECAP line reports changed > 0 (all plays of the run)."""
    hits = [m.groupdict() for line in output.splitlines() if (m := RECAP.match(line.strip()))]
    assert hits, "no PLAY RECAP in the output:\n" + output[-3000:]
    return sorted({h["host"] for h in hits if int(h["changed"])})


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, record_property):
    seconds = {}  # per step, printed in the run's summary (tests/conftest.py)

    def step(name, *extra, check=True):
        start = time.monotonic()
        try:
            return molecule(name, scenario, *extra, check=check)
        finally:
            label = "check" if "--check" in extra else name
            seconds[label] = seconds.get(label, 0.0) + time.monotonic() - start

    step("destroy")
    try:
        step("create")
        step("prepare")
        step("converge")
        step("idempotence")
        changed = changed_hosts(step("converge", "--", "--check", "--diff"))
        assert not changed, f"--check on the converged instances reports changes on {changed}"
        verified = step("verify")
        assert re.search(r"\b\d+ passed\b", verified), f"verify ran no testinfra test:\n{verified[-3000:]}"
    finally:
        step("destroy", check=False)
        record_property("molecule_steps", seconds)
