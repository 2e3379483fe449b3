"""The lab's fake Proxmox API with machines behind its guests: fakepve, whose guests' power drives podman.

    python -m inferhost.sim.pve_power GUESTS.json --machine VMID=CONTAINER ... --node-machine NODE=CONTAINER ...
        [fakepve's own options]

fakepve keeps a guest's status as data, so on its own a guest it calls stopped keeps running and the lab's
plays reach a machine a real host would have switched off. Here a guest's status change is the machine's:
a start runs the guest's hookscript (``pre-start``, on its node's machine, as PVE runs it on the node) and
fails the start task when the hook refuses, then starts the machine; a stop stops the machine, then runs
``post-stop``. A guest without a machine behaves as fakepve's own.

A container's ``devN`` entries are its device nodes, as LXC makes them: at each start every path must exist on
the node ("Device ... does not exist" fails the start) and appears in the machine's ``/dev`` as the node has
it, before the machine's init runs (the lab starts a container's machine with PRESTART_WAIT as its command);
a running container takes a new entry at once (PVE's hotplug), a changed or deleted one at its next start.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

import fakepve.__main__ as fakepve_main
from fakepve.lxc import FakeCt
from fakepve.model import FakeVm, TaskError
from gpu_switch.entries import DEV_KEY, parse_dev

# PVE's default path of storage "local": hookscripts are snippets there (<storage>:snippets/<file>).
STORAGE_PATHS = {"local": "/var/lib/vz"}
STOP_SECONDS = "10"
# A container's machine runs its init once the prestart step has made its device nodes (pass_devices).
PRESTART_DONE = "/dev/.inferhost-prestart-done"
PRESTART_WAIT = (
    f"i=0; while [ ! -e {PRESTART_DONE} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; exec /sbin/init"
)


def _podman(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, check=False)


def device_entries(config: dict) -> list[dict]:
    """The container's devN entries in order, each as gpu-switch reads them ({'path', 'mode', 'uid', ...})."""
    keys = sorted((k for k in config if DEV_KEY.match(k)), key=lambda k: int(DEV_KEY.match(k)[1]))
    return [parse_dev(str(config[k])) for k in keys]


def read_devices(node: str, config: dict, run=_podman) -> list[tuple[str, str]]:
    """What LXC's start reads of each devN path on the node: [(path, how to make it in the container)]. A path
    the node lacks fails the start, as on PVE. The simulated GPUs' nodes are plain files: the container gets
    a plain file too, which processes can hold open as they hold a GPU."""
    entries = device_entries(config)
    if not entries:
        return []
    script = 'for p in "$@"; do if [ -e "$p" ]; then stat -c "%F|%t|%T|%a" "$p"; else echo missing; fi; done'
    proc = run("exec", node, "sh", "-c", script, "sh", *(entry["path"] for entry in entries))
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) != len(entries):
        raise TaskError(f"reading the device nodes on {node} failed: {proc.stderr.strip()}")
    made = []
    for options, line in zip(entries, lines, strict=True):
        path = options["path"]
        if line == "missing":
            raise TaskError(f"Device {path} does not exist")
        kind, major, minor, mode = line.split("|")
        mode = options.get("mode", mode)
        node_path = shlex.quote(path)
        if kind in ("character special file", "block special file"):
            make = f"mknod -m {mode} {node_path} {kind[0]} {int(major, 16)} {int(minor, 16)}"
        else:
            make = f": > {node_path} && chmod {mode} {node_path}"
        owner = f"{options.get('uid', '0')}:{options.get('gid', '0')}"
        made.append((path, f"mkdir -p {shlex.quote(os.path.dirname(path))} && {make} && chown {owner} {node_path}"))
    return made


def pass_devices(machine: str, devices: list[tuple[str, str]], run=_podman) -> None:
    """Make the nodes read_devices read in the container's machine (those it lacks), then let its init run."""
    script = "".join(f"[ -e {shlex.quote(path)} ] || {{ {make}; }}; " for path, make in devices)
    proc = run("exec", machine, "sh", "-c", f"set -e; {script}touch {PRESTART_DONE}")
    if proc.returncode != 0:
        raise TaskError(f"making the device nodes in {machine} failed: {proc.stderr.strip()}")


class Machines:
    """Which podman container runs each guest, and which one is each node, where its guests' hookscripts run and
    their device nodes are read."""

    def __init__(self, guests: dict[int, str], nodes: dict[str, str]):
        self.guests, self.nodes = guests, nodes

    def node_of(self, guest) -> str | None:
        return self.nodes.get(guest.node)

    def podman(self, *argv: str) -> subprocess.CompletedProcess:
        return _podman(*argv)

    def hook(self, guest, phase: str) -> None:
        """Run the guest's hookscript for phase on the node; raise TaskError as PVE fails the task."""
        volume = guest.config.get("hookscript")
        node = self.node_of(guest)
        if not volume or not node:
            return
        storage, _, path = volume.partition(":")
        if storage not in STORAGE_PATHS or not path.startswith("snippets/"):
            raise TaskError(f"hookscript error for {guest.vmid} on {phase}: the lab knows no storage {storage!r}")
        script = f"{STORAGE_PATHS[storage]}/{path}"
        proc = self.podman("exec", node, script, str(guest.vmid), phase)
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
            devices = (
                read_devices(self.node_of(guest), guest.config, self.podman) if isinstance(guest, FakeCt) else None
            )
            proc = self.podman("start", machine)
            if proc.returncode != 0:
                raise TaskError(f"start of {machine} failed: {proc.stderr.strip()}")
            if devices is not None:
                pass_devices(machine, devices, self.podman)
        elif after == "stopped" and before != "stopped":
            self.podman("stop", "-t", STOP_SECONDS, machine)
            try:
                self.hook(guest, "post-stop")
            except TaskError as exc:  # PVE logs a failed post-stop hook; the guest is stopped all the same
                print(exc, file=sys.stderr, flush=True)

    def hotplug(self, guest) -> None:
        """A running container's new devN entries, made in its machine at once; PVE logs a failed hotplug."""
        machine, node = self.guests.get(guest.vmid), self.node_of(guest)
        if machine is None or not node:
            return
        try:
            pass_devices(machine, read_devices(node, guest.config, self.podman), self.podman)
        except TaskError as exc:
            print(f"CT {guest.vmid}: hotplug of its devices failed: {exc}", file=sys.stderr, flush=True)


MACHINES = Machines({}, {})


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


def _dev_config(config: dict) -> dict:
    return {k: v for k, v in config.items() if DEV_KEY.match(k)}


def _powered(guest, cls):
    """The guest fakepve made, as cls: its status moves under the property (set from the guests file)."""
    status = guest.__dict__.pop("status")
    guest.__class__ = cls
    guest.__dict__["_status"] = status
    return guest


class PoweredPve(fakepve_main.FakePve):
    def _apply(self, ct, selection=None, running=False):
        before = _dev_config(ct.config)
        super()._apply(ct, selection, running)
        if running and _dev_config(ct.config) != before:
            MACHINES.hotplug(ct)

    def add_ct(self, *args, **kwargs):
        return _powered(super().add_ct(*args, **kwargs), PoweredCt)

    def add_vm(self, *args, **kwargs):
        return _powered(super().add_vm(*args, **kwargs), PoweredVm)


def _machine(text: str) -> tuple[int, str]:
    vmid, sep, name = text.partition("=")
    if not sep or not vmid.isdigit() or not name:
        raise argparse.ArgumentTypeError(f"expected VMID=CONTAINER, got {text!r}")
    return int(vmid), name


def _node_machine(text: str) -> tuple[str, str]:
    node, sep, name = text.partition("=")
    if not sep or not node or not name:
        raise argparse.ArgumentTypeError(f"expected NODE=CONTAINER, got {text!r}")
    return node, name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--machine", type=_machine, action="append", default=[])
    parser.add_argument("--node-machine", type=_node_machine, action="append", default=[])
    ours, rest = parser.parse_known_args(argv)
    MACHINES.guests.update(dict(ours.machine))
    MACHINES.nodes.update(dict(ours.node_machine))
    fakepve_main.FakePve = PoweredPve
    sys.argv = ["fakepve", *rest]
    fakepve_main.main()


if __name__ == "__main__":
    main()
