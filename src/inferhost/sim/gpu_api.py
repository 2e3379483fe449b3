"""For gpu-switch's in-process tests: the Proxmox API as gpu-switch uses it (PveApi's methods), in memory, and
the writer seam that hands sysfs writes to the kernel model in a thread."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable

from gpu_switch.entries import parse_dev, parse_hostpci
from gpu_switch.errors import ApiError, TaskFailed, WriteTimeout
from gpu_switch.pve import label

from .gpu_kernel import FakeKernel


class FakeApi:
    """The Proxmox API as gpu-switch uses it (PveApi's methods), in memory, for unit tests and the benchmark.
    Starting a guest checks what PVE and the hookscript would: the container's device nodes exist, no GPU
    function is on vfio-pci for the container, every hostpciN function is on vfio-pci for the VM."""

    def __init__(self, kernel: FakeKernel, container_vmid: int = 101, vm_vmid: int = 201):
        self.kernel = kernel
        self.guests = {
            ("lxc", container_vmid): {"status": "running", "config": {"hostname": "ct", "memory": 4096}},
            ("qemu", vm_vmid): {
                "status": "stopped",
                "config": {"name": "vm", "machine": "q35", "scsi0": "local-lvm:vm-201-disk-0"},
            },
        }
        self.calls: list[tuple] = []
        self.slow_shutdown: set[tuple] = set()  # (kind, vmid) whose shutdown times out
        self.fail_start: dict[tuple, str] = {}  # (kind, vmid) -> the start task's error
        self.fail_set_config: dict[tuple, Exception] = {}
        self.down = False
        # The cluster's PCI mappings as GET /cluster/mapping/pci lists them: [{'id', 'map': [entry strings]}].
        self.mappings: list[dict] = []

    def _guest(self, kind, vmid):
        if self.down:
            raise ApiError("Proxmox API at 127.0.0.1:8006 unreachable")
        return self.guests[(kind, vmid)]

    def status(self, kind, vmid):
        return self._guest(kind, vmid)["status"]

    def config(self, kind, vmid):
        guest = self._guest(kind, vmid)
        digest = hashlib.sha1(json.dumps(guest["config"], sort_keys=True).encode()).hexdigest()
        return dict(guest["config"], digest=digest)

    def pci_mappings(self):
        if self.down:
            raise ApiError("Proxmox API at 127.0.0.1:8006 unreachable")
        return [dict(m, map=list(m.get("map", []))) for m in self.mappings]

    def set_config(self, kind, vmid, values, delete=None, digest=None):
        self.calls.append(("set_config", kind, vmid, dict(values), list(delete or [])))
        if (kind, vmid) in self.fail_set_config:
            raise self.fail_set_config[(kind, vmid)]
        guest = self._guest(kind, vmid)
        if digest and digest != self.config(kind, vmid)["digest"]:
            raise ApiError("checksum mismatch (file change by other user?)", 500)
        guest["config"].update(values)
        for key in delete or []:
            guest["config"].pop(key, None)

    def act(self, kind, vmid, action, want, wait_timeout, **params):
        self.calls.append((action, kind, vmid, params))
        guest = self._guest(kind, vmid)
        what = f"{action} {label(kind, vmid)}"
        if action == "shutdown":
            if guest["status"] != "running":
                raise TaskFailed(f"{what}: task failed: not running", "UPID:fake", "not running")
            if (kind, vmid) in self.slow_shutdown:
                status = "container did not stop" if kind == "lxc" else "VM quit/powerdown failed - got timeout"
                raise TaskFailed(f"{what}: task failed: {status}", "UPID:fake", status)
            guest["status"] = "stopped"
        elif action == "stop":
            guest["status"] = "stopped"
        elif action == "start":
            if guest["status"] == "running":
                raise TaskFailed(f"{what}: task failed: already running", "UPID:fake", "already running")
            error = self.fail_start.get((kind, vmid)) or self._start_error(kind, guest)
            if error:
                raise TaskFailed(f"{what}: task failed: {error}", "UPID:fake", error)
            guest["status"] = "running"

    def _start_error(self, kind, guest) -> str | None:
        devices = self.kernel.meta["devices"]
        if kind == "lxc":
            for key, value in guest["config"].items():
                if key.startswith("dev") and key[3:].isdigit():
                    path = parse_dev(value)["path"]
                    if not os.path.exists(os.path.join(self.kernel.dev, path[len("/dev/") :])):
                        return f"Device {path} does not exist"
            if any(self.kernel.driver_of(b) == "vfio-pci" for b in devices):
                return "hookscript error for 101 on pre-start: exit code 1 (GPU functions on vfio-pci)"
            return None
        for key, value in guest["config"].items():
            if key.startswith("hostpci"):
                for slot in parse_hostpci(value)["host"]:
                    stray = [b for b in devices if b.startswith(slot) and self.kernel.driver_of(b) != "vfio-pci"]
                    if stray:
                        return f"hookscript error on pre-start: {stray[0]} is not on vfio-pci"
        return None


class ThreadWriter:
    """gpu-switch's writer seam for an in-process kernel: runs the write function in a daemon thread with a
    timeout, where a hung write is a thread that never returns (on a host a child process does the write)."""

    def __init__(self, write: Callable[[str, str], None]):
        self._write = write

    def write(self, path: str, value: str, timeout: float) -> None:
        box: dict = {}

        def run():
            try:
                self._write(path, value)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = exc

        worker = threading.Thread(target=run, name=f"sysfs-write {path}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise WriteTimeout(path, value, timeout)
        if "error" in box:
            raise box["error"]
