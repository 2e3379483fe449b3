"""A real Linux kernel under QEMU (software emulation) with an emulated Intel IOMMU.

The machine has three PCI network functions: the management NIC (virtio-net, fixed MAC, ssh), a twin
of it with the same vendor:device id (the stand-in for eight identical GPUs: rebinding one must never
touch the other), and an e1000. Each sits in its own IOMMU group. Nothing here touches this machine's
own PCI devices.

One machine serves every module of the layer: a boot under software emulation is its largest fixed cost.
It also carries test_host_vfio's devices (two display functions, one of them behind a PCI bridge with an
rtl8139); that module reboots the machine into the boot configuration the role wrote, so it runs last.

The tests' commands share one ssh connection (a control master): a new connection costs the guest a key
exchange and a fresh sshd, about two seconds under emulation, a command on the open one a fraction of that.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "kernel"
MGMT_MAC = "52:54:00:00:00:10"
# QEMU's std VGA (1234:1111), a display-class function as a GPU is: one alone on the root bus, one behind a
# conventional PCI bridge that it shares with an rtl8139, whose functions the IOMMU cannot tell apart.
STANDIN_GPUS = (
    *("-device", "VGA"),
    *("-device", "pci-bridge,id=shared,chassis_nr=1"),
    *("-device", "VGA,bus=shared,addr=1"),
    *("-device", "rtl8139,bus=shared,addr=2,netdev=foreign", "-netdev", "user,id=foreign,restrict=on"),
)
# mitigations=off: the emulated CPU's speculation barriers only slow the guest down; the IOMMU is untouched.
KERNEL_ARGS = "root=/dev/vda rw console=ttyS0 intel_iommu=on iommu=pt net.ifnames=0 quiet mitigations=off"
# Modules that leave the machine in another boot configuration: they run after the others.
RUN_LAST = ("test_host_vfio.py",)
TWIN_MAC = "52:54:00:00:00:20"

pytestmark = pytest.mark.kernel


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class KernelVM:
    def __init__(self, workdir: Path, extra: tuple[str, ...] = ()):
        self.workdir = workdir
        self.extra = list(extra)  # more QEMU arguments: devices of a variant machine
        self.port = _free_port()
        self.pidfile = workdir / "qemu.pid"
        self.console = workdir / "console.log"
        self.kernel, self.initrd = CACHE / "vmlinuz", CACHE / "initrd.img"
        # A socket's path has a length limit that a deep pytest basetemp could pass: a short one, by port.
        self.control = Path(tempfile.gettempdir()) / f"inferhost-kernel-{self.port}.ssh"

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout: float = 420) -> None:
        overlay = self.workdir / "overlay.qcow2"
        if not overlay.exists():  # a power cycle keeps the disk
            subprocess.run(
                ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(CACHE / "rootfs.img"), str(overlay)],
                check=True,
            )
        argv = ["qemu-system-x86_64", "-accel", "tcg,thread=multi", "-machine", "q35,kernel-irqchip=split"]
        argv += ["-cpu", "max", "-m", "2048", "-smp", "2", "-device", "intel-iommu,intremap=on,caching-mode=on"]
        argv += ["-kernel", str(self.kernel), "-initrd", str(self.initrd)]
        argv += ["-append", KERNEL_ARGS]
        argv += ["-drive", f"file={overlay},if=virtio,format=qcow2"]
        argv += ["-netdev", f"user,id=mgmt,hostfwd=tcp:127.0.0.1:{self.port}-:22"]
        argv += ["-device", f"virtio-net-pci,netdev=mgmt,mac={MGMT_MAC}"]
        argv += ["-netdev", "user,id=twin,restrict=on", "-device", f"virtio-net-pci,netdev=twin,mac={TWIN_MAC}"]
        argv += ["-device", "e1000,netdev=stand", "-netdev", "user,id=stand,restrict=on"]
        argv += self.extra
        argv += ["-display", "none", "-serial", f"file:{self.console}", "-daemonize", "-pidfile", str(self.pidfile)]
        subprocess.run(argv, check=True)
        self.wait_for_ssh(timeout)

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(self.pidfile.read_text()), signal.SIGKILL)
        self.close_connection()

    def close_connection(self) -> None:
        """End the shared ssh connection (the next command opens a new one)."""
        argv = ["ssh", "-o", f"ControlPath={self.control}", "-O", "exit", "root@127.0.0.1"]
        subprocess.run(argv, capture_output=True, timeout=20, check=False)

    def wait_for_ssh(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ssh("true", timeout=20).returncode == 0:
                return
            time.sleep(1)
        tail = self.console.read_text(errors="replace")[-3000:] if self.console.exists() else ""
        raise AssertionError(f"the kernel test machine did not answer ssh in {timeout:.0f}s; console:\n{tail}")

    def reboot(self, timeout: float = 420, *, from_disk: bool = False) -> None:
        """Reboot; from_disk boots the kernel and initramfs the machine's own /boot holds now, as a boot loader
        would. QEMU reads -kernel/-initrd once at start, so a plain reboot brings back the old initramfs."""
        if from_disk:
            self.power_cycle_from_disk(timeout)
            return
        before = self.boot_id()
        self.ssh("systemctl reboot", timeout=20)
        self.close_connection()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(1)
            if self.ssh("true", timeout=10).returncode == 0 and self.boot_id() != before:
                return
        raise AssertionError("the kernel test machine did not come back after a reboot")

    def power_cycle_from_disk(self, timeout: float = 420) -> None:
        before = self.boot_id()
        release = self.check("uname -r").strip()
        for name, path in (("vmlinuz", "kernel"), ("initrd.img", "initrd")):
            copy = self.workdir / f"{name}-from-disk"
            copy.write_bytes(self.ssh(f"cat /boot/{name}-{release}", timeout=300).stdout)
            assert copy.stat().st_size > 1 << 20, f"/boot/{name}-{release} did not come out of the machine"
            setattr(self, path, copy)
        pid = int(self.pidfile.read_text())
        self.ssh("systemctl poweroff", timeout=20)
        self.close_connection()
        deadline = time.monotonic() + 180
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.stop()
        self.start(timeout)
        assert self.boot_id() != before

    # --- commands ----------------------------------------------------------------------------------
    def ssh(self, command: str, timeout: float = 120, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        argv = ["ssh", "-i", str(CACHE / "id_ed25519"), "-p", str(self.port), "-o", "BatchMode=yes"]
        argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
        argv += ["-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=3", "-o", "ServerAliveCountMax=3"]
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control}", "-o", "ControlPersist=300"]
        argv += ["root@127.0.0.1", command]
        try:
            return subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 255, b"", b"timeout")

    def check(self, command: str, timeout: float = 120) -> str:
        proc = self.ssh(command, timeout=timeout)
        assert proc.returncode == 0, f"{command!r} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}"
        return proc.stdout.decode()

    def put_tree(self, source: Path, dest: str) -> None:
        """Copy a directory into the machine (tar over ssh)."""
        argv = ["tar", "-C", str(source.parent), "--exclude=__pycache__", "-c", source.name]
        tar = subprocess.run(argv, capture_output=True, check=True)
        self.check(f"mkdir -p {shlex.quote(dest)}")
        proc = self.ssh(f"tar -C {shlex.quote(dest)} -x", stdin=tar.stdout)
        assert proc.returncode == 0, proc.stderr.decode()

    def put_gpu_switch(self, dest: str) -> None:
        """gpu-switch's code as the gpu_switch role installs it in its library directory: the gpu_switch package,
        and beside it the Proxmox API client it imports (plugins/module_utils/pve_api.py)."""
        utils = ROOT / "plugins" / "module_utils"
        self.put_tree(utils / "gpu_switch", dest)
        proc = self.ssh(f"cat > {shlex.quote(dest)}/pve_api.py", stdin=(utils / "pve_api.py").read_bytes())
        assert proc.returncode == 0, proc.stderr.decode()

    def boot_id(self) -> str:
        return self.check("cat /proc/sys/kernel/random/boot_id").strip()

    def address_of_mac(self, mac: str) -> str:
        """The PCI address of the NIC with this MAC (virtio NICs sit one level below their PCI function)."""
        path = self.check(f"readlink -f $(dirname $(grep -l {mac} /sys/class/net/*/address))/device")
        return re.findall(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", path)[-1]

    def address_of_id(self, vendor: str, device: str) -> str:
        script = (
            "for d in /sys/bus/pci/devices/*; do "
            f'[ "$(cat $d/vendor)" = {vendor} ] && [ "$(cat $d/device)" = {device} ] && basename $d; done; true'
        )
        return self.check(script).split()[0]

    def driver(self, address: str) -> str | None:
        out = self.ssh(f"basename $(readlink /sys/bus/pci/devices/{address}/driver)").stdout.decode().strip()
        return out or None


@pytest.fixture(scope="session")
def kernel_image() -> Path:
    for tool in ("qemu-system-x86_64", "qemu-img", "debootstrap", "ssh"):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode != 0:
            pytest.fail(f"{tool} is missing: run `make bootstrap`", pytrace=False)
    subprocess.run([str(ROOT / "tests" / "kernel" / "build-image.sh"), str(CACHE)], check=True)
    return CACHE


def pytest_collection_modifyitems(items):
    """Within this layer's tests (the positions they hold in the run), RUN_LAST's modules go after the others."""
    here = Path(__file__).parent
    positions = [i for i, item in enumerate(items) if item.path.parent == here]
    ordered = sorted((items[i] for i in positions), key=lambda item: item.path.name in RUN_LAST)
    for position, item in zip(positions, ordered, strict=True):
        items[position] = item


# Package scope: the machine stops when the layer's last test is done, not at the end of the whole run.
@pytest.fixture(scope="package")
def vm(kernel_image, tmp_path_factory):
    machine = KernelVM(tmp_path_factory.mktemp("kernel-vm"), STANDIN_GPUS)
    machine.start()
    yield machine
    machine.stop()
