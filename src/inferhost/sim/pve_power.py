"""The lab's fake Proxmox API with machines behind its guests: fakepve, whose guests' power drives podman.

    python -m inferhost.sim.pve_power GUESTS.json --machine VMID=CONTAINER ... --node-machine CONTAINER
        [fakepve's own options]

fakepve keeps a guest's status as data, so on its own a guest it calls stopped keeps running and the lab's
plays reach a machine a real host would have switched off. Here a guest's status change is the machine's:
a start runs the guest's hookscript (``pre-start``, on the node's machine, as PVE runs it on the node) and
fails the start task when the hook refuses, then starts the machine; a stop stops the machine, then runs
``post-stop``. A guest without a machine behaves as fakepve's own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import fakepve.__main__ as fakepve_main
from fakepve.lxc import FakeCt
from fakepve.model import FakeVm, TaskError

# PVE's default path of storage "local": hookscripts are snippets there (<storage>:snippets/<file>).
STORAGE_PATHS = {"local": "/var/lib/vz"}
STOP_SECONDS = "10"


class Machines:
    """Which podman container runs each guest, and which one is the node that runs the hookscripts."""

    def __init__(self, guests: dict[int, str], node: str | None):
        self.guests, self.node = guests, node

    def podman(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *argv], capture_output=True, text=True, check=False)

    def hook(self, guest, phase: str) -> None:
        """Run the guest's hookscript for phase on the node; raise TaskError as PVE fails the task."""
        volume = guest.config.get("hookscript")
        if not volume or not self.node:
            return
        storage, _, path = volume.partition(":")
        if storage not in STORAGE_PATHS or not path.startswith("snippets/"):
            raise TaskError(f"hookscript error for {guest.vmid} on {phase}: the lab knows no storage {storage!r}")
        script = f"{STORAGE_PATHS[storage]}/{path}"
        proc = self.podman("exec", self.node, script, str(guest.vmid), phase)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise TaskError(
                f"hookscript error for {guest.vmid} on {phase}: command '{script} {guest.vmid} {phase}' failed: "
                f"exit code {proc.returncode} {detail[0]}".rstrip()
            )

    def power(self, guest, before: str, after: str) -> None:
        machine = self.guests.get(guest.vmid)
        if machine is None:
            return
        if after == "running" and before != "running":
            self.hook(guest, "pre-start")
            proc = self.podman("start", machine)
            if proc.returncode != 0:
                raise TaskError(f"start of {machine} failed: {proc.stderr.strip()}")
        elif after == "stopped" and before != "stopped":
            self.podman("stop", "-t", STOP_SECONDS, machine)
            try:
                self.hook(guest, "post-stop")
            except TaskError as exc:  # PVE logs a failed post-stop hook; the guest is stopped all the same
                print(exc, file=sys.stderr, flush=True)


MACHINES = Machines({}, None)


class _Powered:
    """A guest whose status is its machine's: setting it starts or stops the machine (see Machines.power)."""

    @property
    def status(self) -> str:
        return self.__dict__["_status"]

    @status.setter
    def status(self, value: str) -> None:
        before = self.__dict__.get("_status")
        if before is not None and before != value:
            MACHINES.power(self, before, value)
        self.__dict__["_status"] = value


class PoweredCt(_Powered, FakeCt):
    pass


class PoweredVm(_Powered, FakeVm):
    pass


def _powered(guest, cls):
    """The guest fakepve made, as cls: its status moves under the property (set from the guests file)."""
    status = guest.__dict__.pop("status")
    guest.__class__ = cls
    guest.__dict__["_status"] = status
    return guest


class PoweredPve(fakepve_main.FakePve):
    def add_ct(self, *args, **kwargs):
        return _powered(super().add_ct(*args, **kwargs), PoweredCt)

    def add_vm(self, *args, **kwargs):
        return _powered(super().add_vm(*args, **kwargs), PoweredVm)


def _machine(text: str) -> tuple[int, str]:
    vmid, sep, name = text.partition("=")
    if not sep or not vmid.isdigit() or not name:
        raise argparse.ArgumentTypeError(f"expected VMID=CONTAINER, got {text!r}")
    return int(vmid), name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--machine", type=_machine, action="append", default=[])
    parser.add_argument("--node-machine")
    ours, rest = parser.parse_known_args(argv)
    MACHINES.guests.update(dict(ours.machine))
    MACHINES.node = ours.node_machine
    fakepve_main.FakePve = PoweredPve
    sys.argv = ["fakepve", *rest]
    fakepve_main.main()


if __name__ == "__main__":
    main()
