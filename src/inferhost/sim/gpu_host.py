"""The host's commands as a simulated host answers them, for the tests.

``FakeHost`` answers ``systemctl``, ``modprobe`` and ``nvidia-modprobe`` (units are active or not, kept in a
JSON file when a path is given, so that separate processes see the same state; every call is recorded). The
unit tests hand its ``run`` to gpu-switch's ``Host``; the command-line tests put this file on PATH under
those three names (``commands_dir``), so that the real gpu-switch command starts them as it would the real
ones, and a move never touches this machine's own services.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

STATE_ENV = "INFERHOST_SIM_HOST_STATE"
COMMANDS = ("systemctl", "modprobe", "nvidia-modprobe")


@dataclass
class Completed:
    returncode: int
    output: str = ""


class FakeHost:
    """systemctl, modprobe and nvidia-modprobe as a simulated host answers them: units are active or not (kept in
    a JSON file when a path is given, so separate processes see the same state); every call is recorded."""

    def __init__(self, state_path: str | None = None, active=("nvidia-persistenced.service",)):
        self.state_path = state_path
        self.calls: list[list[str]] = []
        self._active = set(active)
        if state_path and os.path.exists(state_path):
            with open(state_path, encoding="utf-8") as fh:
                self._active = set(json.load(fh).get("active", []))

    @classmethod
    def for_tree(cls, sysfs: str) -> FakeHost:
        return cls(os.path.join(sysfs, ".fakehost.json"))

    @property
    def active(self) -> set[str]:
        return self._active

    @active.setter
    def active(self, units) -> None:
        self._active = set(units)
        self._save()

    def _save(self) -> None:
        if self.state_path:
            with open(self.state_path, "w", encoding="utf-8") as fh:
                json.dump({"active": sorted(self._active)}, fh)

    def run(self, argv, timeout):
        self.calls.append(list(argv))
        if argv[:2] == ["systemctl", "is-active"]:
            return Completed(0 if argv[-1] in self._active else 3)
        if argv[:2] == ["systemctl", "stop"]:
            self._active.discard(argv[-1])
            self._save()
        elif argv[:2] == ["systemctl", "start"]:
            self._active.add(argv[-1])
            self._save()
        return Completed(0)


def commands_dir(directory: str, state_path: str) -> dict:
    """Write systemctl, modprobe and nvidia-modprobe into directory, each answering from the FakeHost whose
    state is state_path; returns the environment (PATH first) that makes a child process use them."""
    os.makedirs(directory, exist_ok=True)
    for name in COMMANDS:
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(
                f"#!{sys.executable}\nimport sys\nfrom inferhost.sim.gpu_host import command\n"
                "sys.exit(command(sys.argv))\n"
            )
        os.chmod(path, 0o755)
    return {"PATH": directory + os.pathsep + os.environ.get("PATH", ""), STATE_ENV: state_path}


def command(argv: list[str]) -> int:
    """One stand-in command, named by argv[0], answering from the FakeHost at $INFERHOST_SIM_HOST_STATE."""
    result = FakeHost(os.environ[STATE_ENV]).run([os.path.basename(argv[0]), *argv[1:]], 0)
    if result.output:
        print(result.output)
    return result.returncode
