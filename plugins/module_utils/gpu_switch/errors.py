"""Exceptions and exit codes of gpu-switch.

Every failure the tool reports is one of these, so that each front end can turn it into an exit code
and a one-line reason without guessing.
"""

from __future__ import annotations

# Exit codes (the command's contract).
EXIT_OK = 0  # done, or nothing to do
EXIT_ROLLED_BACK = 1  # the move failed or was refused; the GPUs are where they were
EXIT_USAGE = 2  # bad configuration or usage
EXIT_STRANDED = 3  # the move failed and could not be fully rolled back


class GpuSwitchError(Exception):
    """Base class: a failure with a one-line reason and the exit code it maps to."""

    exit_code = EXIT_ROLLED_BACK

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ConfigError(GpuSwitchError):
    """The configuration (or the command line) is wrong: nothing was touched."""

    exit_code = EXIT_USAGE


class Refused(GpuSwitchError):
    """A precondition does not hold (holders, a mixed IOMMU group, a busy lock...): nothing was changed."""


class StepFailed(GpuSwitchError):
    """A step of the plan failed; the plan is rolled back."""


class RebindError(StepFailed):
    """A PCI function did not end up on the driver it was asked to move to."""


class WriteTimeout(GpuSwitchError):
    """A sysfs write did not return in time: the kernel is stuck in the driver, only a reboot helps."""

    exit_code = EXIT_STRANDED

    def __init__(self, path: str, value: str, timeout: float, address: str | None = None):
        self.path, self.value, self.timeout, self.address = path, value, timeout, address
        super().__init__(f"writing {value.strip()!r} to {path} did not return within {timeout:g} s")


class ApiError(GpuSwitchError):
    """The Proxmox API refused a request or could not be reached."""

    def __init__(self, reason: str, status: int | None = None):
        super().__init__(reason)
        self.status = status


class TaskFailed(ApiError):
    """A Proxmox task ended with an exit status other than OK, or did not end in time."""

    def __init__(self, reason: str, upid: str | None = None, exitstatus: str | None = None):
        super().__init__(reason)
        self.upid, self.exitstatus = upid, exitstatus


class CommandError(GpuSwitchError):
    """A host command (systemctl, modprobe, nvidia-modprobe) failed or timed out."""
