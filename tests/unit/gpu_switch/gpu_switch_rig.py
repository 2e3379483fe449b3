"""Test rig for the gpu-switch unit tests: a simulated kernel on a temp tree, a fake /proc, a fake Proxmox API
and a fake host command runner. Nothing here touches the real /sys, /proc or a network."""

from __future__ import annotations

import io
import os

import yaml
from gpu_switch import cli
from gpu_switch.config import parse_config
from gpu_switch.switch import Switcher
from gpu_switch.system import Host

from inferhost.sim.gpu_api import FakeApi, ThreadWriter
from inferhost.sim.gpu_host import FakeHost
from inferhost.sim.gpu_kernel import FakeKernel

CT, VM = 101, 201
# The device nodes of the first two GPUs, in gpu-switch's order, once the rig has nvidia-caps/nvidia-cap1 (make_node).
NODES_OF_TWO_GPUS = [
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-caps/nvidia-cap1",
]


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
            # Long enough that a write the simulated kernel completes is never taken for a hung one on a loaded
            # machine (0.5 s was, once, with both test streams and QEMU on two cores); short enough that the
            # three tests of a hung write stay quick.
            "timeouts": {"sysfs_write": 2},
        }
        for key, value in config_overrides.items():
            self.data[key] = value
        self.config = parse_config(self.data, str(tmp_path / "config.yml"), environ={})
        self.api = FakeApi(self.kernel, CT, VM)
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

    def make_node(self, path):
        """A stand-in device node under the rig's /dev (path relative to it, such as nvidia-caps/nvidia-cap1)."""
        os.makedirs(os.path.dirname(os.path.join(self.dev, path)), exist_ok=True)
        open(os.path.join(self.dev, path), "w").close()

    def cli(self, *argv) -> tuple[int, str, str]:
        """The gpu-switch command on this host, with the rig's config file: (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        kwargs = {"api": self.api, "host": Host(self.host.run, 5), "writer": ThreadWriter(self.kernel.write)}
        code = cli.main(["--config", self.write_config(), *argv], stdout=out, stderr=err, **kwargs)
        return code, out.getvalue(), err.getvalue()

    def drivers(self) -> dict[str, str | None]:
        return {address: self.kernel.driver_of(address) for address in sorted(self.kernel.meta["devices"])}

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
