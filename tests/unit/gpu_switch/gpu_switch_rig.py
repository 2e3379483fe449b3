"""Test rig for the gpu-switch unit tests: a simulated kernel on a temp tree, a fake /proc, a fake Proxmox API
and a fake host command runner. Nothing here touches the real /sys, /proc or a network."""

from __future__ import annotations

import os

import yaml
from gpu_switch.config import parse_config
from gpu_switch.entries import parse_dev, parse_hostpci
from gpu_switch.errors import ApiError, TaskFailed
from gpu_switch.fakesys import FakeHost, FakeKernel
from gpu_switch.pve import label
from gpu_switch.switch import Switcher
from gpu_switch.system import Host
from gpu_switch.writer import ThreadWriter

CT, VM = 101, 201


class FakeApi:
    """The Proxmox API as gpu-switch uses it, in memory. Starting a guest checks what PVE would check."""

    def __init__(self, kernel: FakeKernel, config):
        self.kernel, self.cfg = kernel, config
        self.guests = {
            ("lxc", CT): {"status": "running", "config": {"hostname": "ct", "memory": 4096}},
            ("qemu", VM): {
                "status": "stopped",
                "config": {"name": "vm", "machine": "q35", "scsi0": "local-lvm:vm-201-disk-0"},
            },
        }
        self.calls: list[tuple] = []
        self.slow_shutdown: set[tuple] = set()  # (kind, vmid) whose shutdown times out
        self.fail_start: dict[tuple, str] = {}  # (kind, vmid) -> TASK ERROR text
        self.fail_set_config: dict[tuple, ApiError] = {}
        self.down = False

    def _guest(self, kind, vmid):
        if self.down:
            raise ApiError("Proxmox API at 127.0.0.1:8006 unreachable")
        return self.guests[(kind, vmid)]

    def status(self, kind, vmid):
        return self._guest(kind, vmid)["status"]

    def config(self, kind, vmid):
        guest = self._guest(kind, vmid)
        return dict(guest["config"], digest=str(hash(frozenset(guest["config"].items()))))

    def set_config(self, kind, vmid, values, delete=None, digest=None):
        self.calls.append(("set_config", kind, vmid, dict(values), list(delete or [])))
        if (kind, vmid) in self.fail_set_config:
            raise self.fail_set_config[(kind, vmid)]
        guest = self._guest(kind, vmid)
        if digest and digest != self.config(kind, vmid)["digest"]:
            raise ApiError("checksum mismatch", 500)
        guest["config"].update(values)
        for key in delete or []:
            guest["config"].pop(key, None)

    def act(self, kind, vmid, action, want, wait_timeout, **params):
        self.calls.append((action, kind, vmid, params))
        guest = self._guest(kind, vmid)
        if action == "shutdown":
            if guest["status"] != "running":
                raise TaskFailed(f"shutdown {label(kind, vmid)}: not running", "UPID:x", "not running")
            if (kind, vmid) in self.slow_shutdown:
                raise TaskFailed(f"shutdown {label(kind, vmid)}: task failed", "UPID:x", "container did not stop")
            guest["status"] = "stopped"
        elif action == "stop":
            guest["status"] = "stopped"
        elif action == "start":
            if guest["status"] == "running":
                raise TaskFailed("already running", "UPID:x", "already running")
            if (kind, vmid) in self.fail_start:
                raise TaskFailed(
                    f"start {label(kind, vmid)}: task failed: {self.fail_start[(kind, vmid)]}",
                    "UPID:x",
                    self.fail_start[(kind, vmid)],
                )
            self._check_start(kind, guest)
            guest["status"] = "running"

    def _check_start(self, kind, guest):
        """What PVE (and our hookscripts) would refuse at start."""
        if kind == "lxc":
            for key, value in guest["config"].items():
                if key.startswith("dev"):
                    path = parse_dev(value)["path"]
                    if not os.path.exists(os.path.join(self.kernel.dev, path[5:])):
                        raise TaskFailed(f"Device {path} does not exist", "UPID:x", "Device does not exist")
            for bdf, meta in self.kernel.meta["devices"].items():
                if self.kernel.driver_of(bdf) == "vfio-pci" and meta["native"]:
                    raise TaskFailed("hookscript: GPU on vfio-pci", "UPID:x", "hookscript error")
        else:
            for key, value in guest["config"].items():
                if key.startswith("hostpci"):
                    for slot in parse_hostpci(value)["host"]:
                        for bdf in self.kernel.meta["devices"]:
                            if bdf.startswith(slot) and self.kernel.driver_of(bdf) != "vfio-pci":
                                raise TaskFailed(f"{bdf} not on vfio-pci", "UPID:x", "hookscript error")


class Rig:
    """One simulated host: kernel tree, fake /proc, config, API, commands; makes Switchers."""

    def __init__(self, tmp_path, gpus=2, functions=2, owner="ct", **config_overrides):
        self.tmp = tmp_path
        self.sysfs, self.proc, self.dev, self.run = (str(tmp_path / n) for n in ("sys", "proc", "dev", "run"))
        self.kernel = FakeKernel.create(self.sysfs, self.proc, self.dev)
        for driver in ("nvidia", "vfio-pci", "snd_hda_intel", "xhci_hcd"):
            self.kernel.add_driver(driver)
        self.addresses = []
        for n in range(gpus):
            self.addresses.append(
                self.kernel.add_gpu(
                    n + 1,
                    numa=0 if n < gpus // 2 or gpus == 1 else 1,
                    minor=n,
                    functions=functions,
                    driver="nvidia" if owner == "ct" else "vfio-pci",
                )
            )
        password = tmp_path / "password"
        password.write_text("secret\n")
        self.data = {
            "proxmox": {"node": "pve1", "password_file": str(password)},
            "container": {"vmid": CT},
            "vm": {"vmid": VM},
            "gpus": list(self.addresses),
            "roots": {"sysfs": self.sysfs, "proc": self.proc, "run": self.run, "dev": self.dev},
            "timeouts": {"sysfs_write": 0.5},
        }
        for key, value in config_overrides.items():
            self.data[key] = value
        self.config = parse_config(self.data, str(tmp_path / "config.yml"), environ={})
        self.api = FakeApi(self.kernel, self.config)
        self.host = FakeHost()
        if owner == "vm":
            self.api.guests[("lxc", CT)]["status"] = "stopped"
            self.api.guests[("qemu", VM)]["status"] = "running"
            self.api.guests[("qemu", VM)]["config"].update(
                {f"hostpci{n}": f"{a[:-2]},pcie=1" for n, a in enumerate(self.addresses)}
            )
        else:
            self.api.guests[("lxc", CT)]["config"].update({f"dev{n}": f"/dev/nvidia{n}" for n in range(gpus)})
            self.api.guests[("lxc", CT)]["config"].update(
                {
                    f"dev{gpus}": "/dev/nvidiactl",
                    f"dev{gpus + 1}": "/dev/nvidia-uvm",
                    f"dev{gpus + 2}": "/dev/nvidia-uvm-tools",
                }
            )

    def write_config(self):
        path = self.tmp / "config.yml"
        path.write_text(yaml.safe_dump(self.data))
        return str(path)

    def switcher(self, **kwargs) -> Switcher:
        kwargs.setdefault("writer", ThreadWriter(self.kernel.write))
        kwargs.setdefault("api", self.api)
        kwargs.setdefault("host", Host(self.host.run, 5))
        return Switcher(self.config, **kwargs)

    def drivers(self) -> dict[str, str | None]:
        return {bdf: self.kernel.driver_of(bdf) for bdf in sorted(self.kernel.meta["devices"])}

    def functions(self) -> list[str]:
        return sorted(self.kernel.meta["devices"])

    def add_process(self, pid, command, fds=(), cgroup="0::/user.slice\n", maps=""):
        base = os.path.join(self.proc, str(pid))
        os.makedirs(os.path.join(base, "fd"), exist_ok=True)
        with open(os.path.join(base, "cmdline"), "wb") as fh:
            fh.write(command.replace(" ", "\0").encode() + b"\0")
        with open(os.path.join(base, "comm"), "w") as fh:
            fh.write(command.split()[0].rsplit("/", 1)[-1][:15] + "\n")
        with open(os.path.join(base, "cgroup"), "w") as fh:
            fh.write(cgroup)
        with open(os.path.join(base, "maps"), "w") as fh:
            fh.write(maps)
        for n, target in enumerate(fds):
            os.symlink(target, os.path.join(base, "fd", str(n)))

    def set_boot_id(self, value):
        with open(os.path.join(self.proc, "sys", "kernel", "random", "boot_id"), "w") as fh:
            fh.write(value + "\n")
