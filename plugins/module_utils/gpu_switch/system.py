"""Host commands behind one seam: systemctl for the persistence daemon, modprobe, nvidia-modprobe.

Tests replace ``run`` with a fake; nothing else in the package starts a process (except the sysfs writer).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import CommandError


@dataclass
class Completed:
    returncode: int
    output: str = ""


def run_command(argv: Sequence[str], timeout: float) -> Completed:
    try:
        proc = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return Completed(127, f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        raise CommandError(f"{' '.join(argv)} did not finish within {timeout:g} s") from None
    return Completed(proc.returncode, proc.stdout.decode(errors="replace").strip())


class Host:
    """The commands gpu-switch runs on the host."""

    def __init__(self, run: Callable[[Sequence[str], float], Completed] = run_command, timeout: float = 60.0):
        self.run, self.timeout = run, timeout

    def _check(self, argv: list[str]) -> Completed:
        result = self.run(argv, self.timeout)
        if result.returncode != 0:
            last = result.output.splitlines()[-1] if result.output else f"exit status {result.returncode}"
            raise CommandError(f"{' '.join(argv)} failed: {last}")
        return result

    def is_active(self, unit: str) -> bool:
        return self.run(["systemctl", "is-active", "--quiet", unit], self.timeout).returncode == 0

    def stop(self, unit: str) -> None:
        self._check(["systemctl", "stop", unit])

    def start(self, unit: str) -> None:
        self._check(["systemctl", "start", unit])

    def modprobe(self, module: str) -> None:
        self._check(["modprobe", module])

    def nvidia_modprobe(self, *args: str) -> Completed:
        """Create NVIDIA device nodes; a missing nvidia-modprobe is not an error (the nodes are checked after)."""
        return self.run(["nvidia-modprobe", *args], self.timeout)
