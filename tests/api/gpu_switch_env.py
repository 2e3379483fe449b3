"""The simulated host (kernel model, commands) wired to a fakepve, for the gpu-switch API and Ansible tests.

In-process, the Switcher writes to the model through ThreadWriter; for the real command (a child process,
or the Ansible module), ``Env.serve`` serves the model over FUSE and puts stand-in systemctl and modprobe
first on PATH, so that gpu-switch runs its production path: child-process writes to files that answer as
sysfs does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from gpu_switch import cli
from gpu_switch.config import parse_config, read_secret
from gpu_switch.pve import PveApi
from gpu_switch.switch import Switcher
from gpu_switch.system import Host

from inferhost.sim.gpu_api import ThreadWriter
from inferhost.sim.gpu_fuse import wait_mounted
from inferhost.sim.gpu_host import FakeHost, commands_dir
from inferhost.sim.gpu_kernel import FakeKernel

ROOT = Path(__file__).resolve().parents[2]
CT, VM = 101, 201
CT_BASE = {
    "hostname": "inference-ct",
    "memory": 65536,
    "cores": 32,
    "net0": "name=eth0,bridge=vmbr0,ip=dhcp",
    "mp0": "/srv/models,mp=/srv/models",
    "onboot": 1,
}
VM_BASE = {
    "machine": "q35",
    "bios": "ovmf",
    "memory": "65536",
    "cores": 32,
    "scsi0": "local-lvm:vm-201-disk-0,size=64G",
    "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
    "ostype": "l26",
}


class Env:
    """The simulated host (kernel tree, commands) wired to a fakepve."""

    def __init__(self, pve, cafile, tmp: Path, gpus=2, owner="ct", **config):
        self.pve, self.tmp = pve, tmp
        self._served: list[subprocess.Popen] = []
        roots = {n: str(tmp / n) for n in ("sys", "proc", "dev", "run", "state")}
        self.kernel = FakeKernel.create(roots["sys"], roots["proc"], roots["dev"])
        for driver in ("nvidia", "vfio-pci", "snd_hda_intel"):
            self.kernel.add_driver(driver)
        self.addresses = [
            self.kernel.add_gpu(n + 1, numa=n * 2 // gpus, minor=n, driver="nvidia" if owner == "ct" else "vfio-pci")
            for n in range(gpus)
        ]
        (tmp / "password").write_text("secret\n")
        self.data = {
            "proxmox": {
                "host": pve.host,
                "port": pve.port,
                "user": "root@pam",
                "password_file": str(tmp / "password"),
                "verify_ssl": True,
                "ca_file": cafile,
                "node": "pve1",
                "timeout": 5,
            },
            "container": {"vmid": CT},
            "vm": {"vmid": VM},
            "gpus": self.addresses,
            "roots": {
                "sysfs": roots["sys"],
                "proc": roots["proc"],
                "run": roots["run"],
                "dev": roots["dev"],
                "state": roots["state"],
            },
            "timeouts": {"sysfs_write": 2, "shutdown": 60, "task": 30},
        }
        self.data.update(config)
        self.host = FakeHost.for_tree(roots["sys"])
        self.host.active = {"nvidia-persistenced.service"}
        ct_config = dict(CT_BASE)
        vm_config = dict(VM_BASE)
        if owner == "ct":
            nodes = [f"/dev/nvidia{n}" for n in range(gpus)] + [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
            ]
            ct_config.update({f"dev{n}": p for n, p in enumerate(nodes)})
        self.ct = pve.add_ct(CT, status="running" if owner == "ct" else "stopped", config=ct_config)
        self.vm = pve.add_vm(VM, "inference-vm", status="running" if owner == "vm" else "stopped", config=vm_config)
        if owner == "vm":
            self.vm.config.update({f"hostpci{n}": f"{a[:-2]},pcie=1" for n, a in enumerate(self.addresses)})

    @property
    def config(self):
        return parse_config(self.data, str(self.tmp / "config.yml"), environ={})

    def api(self, **kwargs):
        kwargs.setdefault("sleep", lambda s: None)
        kwargs.setdefault("poll", 0.05)
        return PveApi(self.config.proxmox, read_secret(self.config.proxmox), **kwargs)

    def switcher(self, **kwargs) -> Switcher:
        kwargs.setdefault("api", self.api())
        return Switcher(self.config, writer=ThreadWriter(self.kernel.write), host=Host(self.host.run, 5), **kwargs)

    def run(self, command, **kwargs):
        return cli.run(command, self.switcher(), **kwargs)

    def drivers(self):
        return {b: self.kernel.driver_of(b) for b in sorted(self.kernel.meta["devices"])}

    def owner_consistent(self):
        """Every function on one driver of one side, that side's guest running, the other stopped."""
        drivers = set(self.drivers().values())
        if drivers == {"vfio-pci"}:
            return (self.vm.status, self.ct.status) == ("running", "stopped")
        if drivers == {"nvidia", "snd_hda_intel"}:
            return (self.ct.status, self.vm.status) == ("running", "stopped")
        return False

    def write_config(self):
        path = self.tmp / "config.yml"
        path.write_text(yaml.safe_dump(self.data))
        return str(path)

    def tasks(self):
        return [(t["type"], t["id"], t.get("exitstatus")) for t in self.pve.tasklog]

    def serve(self, path: Path | None = None) -> tuple[str, dict]:
        """Serve the model over FUSE for the real command; write its configuration (roots on the mount) to
        path. Returns the configuration's path and the environment to run the command with."""
        mount = self.tmp / "mnt"
        daemon = subprocess.Popen(
            [sys.executable, "-m", "inferhost.sim.gpu_fuse", "--state", str(self.tmp), "--mount", str(mount)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._served.append(daemon)
        wait_mounted(str(mount))
        data = dict(self.data)
        data["roots"] = dict(
            self.data["roots"], sysfs=str(mount / "sys"), proc=str(mount / "proc"), dev=str(mount / "dev")
        )
        path = path or self.tmp / "config.yml"
        path.write_text(yaml.safe_dump(data))
        environ = {**os.environ, **commands_dir(str(self.tmp / "bin"), self.host.state_path)}
        return str(path), environ

    def close(self) -> None:
        for daemon in self._served:
            daemon.terminate()
            daemon.wait(timeout=10)
        self._served.clear()
