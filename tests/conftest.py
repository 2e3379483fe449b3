"""Shared test setup: the commands tests start (ansible-playbook, molecule, ruff, ...) are this environment's."""

import os
import sys

_BIN = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = os.pathsep.join([_BIN, os.environ.get("PATH", "")])

# Per-layer counts and time, printed before pytest's closing line: which layers ran, and what each costs.
_LAYERS: dict[str, dict[str, float]] = {}
# Seconds per molecule step of each scenario (tests/molecule records them), printed after the layers.
_MOLECULE_STEPS: dict[str, dict[str, float]] = {}


def _layer(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def pytest_runtest_logreport(report):
    layer = _LAYERS.setdefault(_layer(report.nodeid), {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0})
    layer["seconds"] += report.duration
    # Every outcome of the test itself, and errors or skips in its setup or teardown.
    if report.when == "call" or report.outcome != "passed":
        layer[report.outcome] += 1
    for name, value in report.user_properties:
        if name == "molecule_steps":
            _MOLECULE_STEPS[report.nodeid.rsplit("[", 1)[-1].rstrip("]")] = value


def pytest_terminal_summary(terminalreporter):
    if not _LAYERS:
        return
    terminalreporter.section("time per test layer")
    for name, layer in sorted(_LAYERS.items()):
        terminalreporter.write_line(
            f"{name:<10} {int(layer['passed']):>5} passed {int(layer['failed']):>3} failed "
            f"{int(layer['skipped']):>3} skipped  {layer['seconds']:8.1f} s"
        )
    if _MOLECULE_STEPS:
        terminalreporter.section("time per molecule step")
        for scenario, steps in sorted(_MOLECULE_STEPS.items()):
            parts = ", ".join(f"{step} {secs:.0f}" for step, secs in steps.items())
            terminalreporter.write_line(f"{scenario:<18} {sum(steps.values()):6.0f} s: {parts}")
