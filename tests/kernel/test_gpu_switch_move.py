"""The whole move on a real kernel: the `gpu-switch` command run inside the QEMU machine, against its real
sysfs and /proc, with fakepve serving the Proxmox API inside the machine on 127.0.0.1.

The "GPU" is the e1000 (one function, its own IOMMU group); its host driver is e1000 instead of nvidia.
The machine gets gpu_switch and the Proxmox API client beside it as they are in the repository, and the
pure-Python packages they and fakepve need, copied from this environment (the machine's Python is the same
minor version).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from fakepve.certs import make_cert
from packaging.requirements import Requirement

from .conftest import KernelVM

pytestmark = pytest.mark.kernel
LIB = "/opt/inferhost"
SITE = f"{LIB}/site"
CT, VM = 101, 201

# The installed command is the same thin launcher the gpu_switch role writes: gpu_switch.cli.main.
LAUNCHER = f"""#!/usr/bin/python3
import sys
sys.path[:0] = ["{LIB}", "{SITE}"]
from gpu_switch.cli import main
sys.exit(main())
"""

# What QEMU does with a passed-through device: a VFIO container with the type1 IOMMU, and the device's fd.
# While that fd is open, an unbind from vfio-pci blocks in the kernel until the process lets go.
HOLD_VFIO = """import fcntl, os, struct, sys, time
group, address = sys.argv[1], sys.argv[2]
container = os.open("/dev/vfio/vfio", os.O_RDWR)
fd = os.open("/dev/vfio/" + group, os.O_RDWR)
fcntl.ioctl(fd, 0x3B68, struct.pack("i", container))  # VFIO_GROUP_SET_CONTAINER
fcntl.ioctl(container, 0x3B66, 3)  # VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU
fcntl.ioctl(fd, 0x3B6A, bytearray(address.encode() + b"\\0"))  # VFIO_GROUP_GET_DEVICE_FD
print("ready", flush=True)
time.sleep(3600)
"""


def _distributions(names):
    """The installed distributions these names need (themselves and their dependencies, extras aside)."""
    found, todo = {}, list(names)
    while todo:
        dist = metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower()
        if key in found:
            continue
        found[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(found.values())


def _site_tar() -> bytes:
    """A tar of the top-level modules of proxmoxer, requests (optional to proxmoxer, its HTTPS backend), PyYAML
    and fakepve, with their dependencies."""
    entries, site = set(), None
    for dist in _distributions(["proxmoxer", "requests", "PyYAML", "fakepve"]):
        site = dist.locate_file("")
        for path in dist.files or []:
            top = path.parts[0]
            if top != ".." and not top.endswith(".dist-info"):
                entries.add(top)
    argv = ["tar", "-C", str(site), "--exclude=__pycache__", "-c", *sorted(entries)]
    return subprocess.run(argv, capture_output=True, check=True).stdout


@dataclass
class ProxmoxHost:
    vm: KernelVM
    e1000: str  # the stand-in GPU's address
    group: int  # its IOMMU group

    def driver(self) -> str | None:
        return self.vm.driver(self.e1000)


@pytest.fixture(scope="module")
def host(vm, tmp_path_factory):
    """The machine as a Proxmox host: gpu-switch installed and configured, fakepve running on 127.0.0.1."""
    proc = vm.ssh(f"mkdir -p {SITE} && tar -C {SITE} -x", stdin=_site_tar(), timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    vm.put_gpu_switch(LIB)
    pki = tmp_path_factory.mktemp("fakepve-pki")
    certfile, keyfile, _ = make_cert(str(pki), hosts=("127.0.0.1",))
    e1000 = vm.address_of_id("0x8086", "0x100e")
    guests = {
        "guests": [
            {"type": "lxc", "vmid": CT, "name": "inference-ct", "status": "running", "config": {"memory": 2048}},
            {"vmid": VM, "name": "inference-vm", "status": "stopped", "config": {"machine": "q35", "memory": "4096"}},
        ]
    }
    config = {
        "proxmox": {
            "host": "127.0.0.1",
            "port": 8006,
            "user": "root@pam",
            "password_file": "/etc/gpu-switch/password",
            "ca_file": "/etc/gpu-switch/fakepve.crt",
            "node": "pve1",
            "timeout": 60,
        },
        "container": {"vmid": CT},
        "vm": {"vmid": VM},
        "gpus": [e1000],
        "drivers": {"host": "e1000", "passthrough": "vfio-pci"},
        "persistenced_unit": None,
        "timeouts": {"sysfs_write": 30, "shutdown": 60, "task": 120, "command": 120},
    }
    files = {
        "/usr/local/bin/gpu-switch": LAUNCHER,
        "/etc/gpu-switch/config.yml": yaml.safe_dump(config),
        "/etc/gpu-switch/password": "secret\n",
        "/etc/gpu-switch/fakepve.crt": Path(certfile).read_text(),
        "/etc/gpu-switch/fakepve.key": Path(keyfile).read_text(),
        f"{LIB}/guests.json": json.dumps(guests),
        "/root/hold-vfio.py": HOLD_VFIO,
    }
    for path, text in files.items():
        proc = vm.ssh(f"mkdir -p $(dirname {path}) && cat > {path}", stdin=text.encode())
        assert proc.returncode == 0, proc.stderr.decode()
    vm.check("chmod 755 /usr/local/bin/gpu-switch && chmod 600 /etc/gpu-switch/password /etc/gpu-switch/fakepve.key")
    # Loopback only: the machine's other NICs are restrict=on, and nothing here listens beyond 127.0.0.1.
    vm.check(
        f"PYTHONPATH={SITE} setsid python3 -m fakepve {LIB}/guests.json --host 127.0.0.1 --port 8006 "
        "--time-scale 0 --cert /etc/gpu-switch/fakepve.crt --key /etc/gpu-switch/fakepve.key "
        "> /var/log/fakepve.log 2>&1 < /dev/null &"
    )
    deadline = time.monotonic() + 180
    while "listening" not in vm.ssh("cat /var/log/fakepve.log").stdout.decode():
        assert time.monotonic() < deadline, vm.ssh("cat /var/log/fakepve.log").stdout.decode()[-2000:]
        time.sleep(0.5)
    return ProxmoxHost(vm, e1000, int(vm.check(f"basename $(readlink /sys/bus/pci/devices/{e1000}/iommu_group)")))


def gpu_switch(host: ProxmoxHost, command: str) -> tuple[int, dict, str]:
    """Run the command in the machine: exit status, its JSON result, the last line of stderr."""
    proc = host.vm.ssh(f"gpu-switch --json {command}", timeout=600)
    stderr = proc.stderr.decode().strip()
    assert proc.returncode in (0, 1, 2, 3), f"gpu-switch {command} died ({proc.returncode}): {stderr[-2000:]}"
    return proc.returncode, json.loads(proc.stdout), stderr.splitlines()[-1] if stderr else ""


def guest_api(host: ProxmoxHost) -> dict:
    """The guests' status and the VM's config, read from the fake API with the machine's own Proxmox API client
    (the one gpu-switch imports, but not through gpu-switch)."""
    code = (
        f"import json, sys; sys.path[:0] = [{LIB!r}, {SITE!r}]; from pve_api import Client, Login\n"
        "api = Client(Login(secret='secret', ca_file='/etc/gpu-switch/fakepve.crt'), 'pve1')\n"
        f"print(json.dumps({{'ct': api.status('lxc', {CT}), 'vm': api.status('qemu', {VM}),"
        f" 'vm_config': api.config('qemu', {VM})}}))"
    )
    return json.loads(host.vm.check(f"python3 -c {shlex.quote(code)}"))


def guests(host: ProxmoxHost) -> dict:
    api = guest_api(host)
    return {"ct": api["ct"], "vm": api["vm"]}


def hold(host: ProxmoxHost, script: str) -> int:
    """Start a process (sh -c script) that opens a device node and says ready; its pid once it holds it."""
    host.vm.check(f"rm -f /root/hold.log; setsid sh -c {shlex.quote(script)} > /root/hold.log 2>&1 < /dev/null &")
    deadline = time.monotonic() + 60
    while "ready" not in host.vm.ssh("cat /root/hold.log").stdout.decode():
        assert time.monotonic() < deadline, host.vm.ssh("cat /root/hold.log").stdout.decode()
        time.sleep(0.5)
    return int(host.vm.check("cat /root/hold.pid").strip())


def release(host: ProxmoxHost, pid: int) -> None:
    host.vm.check(f"kill {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.2; done")


def test_a_holder_of_the_host_side_node_refuses_to_vm(host):
    # The host-side scan looks for /dev/nvidia*: a stand-in node (the null device's numbers) held open by a
    # real process of this kernel.
    host.vm.check("mknod -m 666 /dev/nvidia0 c 1 3")
    pid = hold(host, "echo $$ > /root/hold.pid; exec 3< /dev/nvidia0; echo ready; exec sleep 3600")
    try:
        code, result, reason = gpu_switch(host, "to-vm")
    finally:
        release(host, pid)
        host.vm.check("rm -f /dev/nvidia0")
    assert code == 1, reason
    assert f"pid {pid} (sleep 3600) holds /dev/nvidia0" in reason and "nothing was changed" in reason
    assert result["rolled_back"] is True and result["owner"] == "ct"
    assert host.driver() == "e1000"
    assert guests(host) == {"ct": "running", "vm": "stopped"}


def test_to_vm_binds_the_device_to_vfio_pci_and_starts_the_vm_with_it(host):
    assert host.driver() == "e1000"
    code, result, reason = gpu_switch(host, "to-vm")
    assert code == 0, reason
    assert result["owner"] == "vm" and result["changed"] is True
    assert host.driver() == "vfio-pci"
    host.vm.check(f"test -c /dev/vfio/{host.group}")
    api = guest_api(host)
    assert api["vm_config"]["hostpci0"] == f"{host.e1000[:-2]},pcie=1"
    assert api["vm_config"]["machine"] == "q35"  # the other lines are kept
    assert (api["ct"], api["vm"]) == ("stopped", "running")


def test_a_process_with_the_device_open_through_vfio_refuses_to_ct(host):
    assert host.driver() == "vfio-pci", "needs the move to the VM (previous test)"
    command = f"python3 /root/hold-vfio.py {host.group} {host.e1000}"
    pid = hold(host, f"echo $$ > /root/hold.pid; exec {command}")
    try:
        code, result, reason = gpu_switch(host, "to-ct")
    finally:
        release(host, pid)
    assert code == 1, reason
    assert result["holders"] == [{"pid": pid, "command": command, "path": f"/dev/vfio/{host.group}"}]
    assert "rolled back" in reason and f"pid {pid} ({command}) holds /dev/vfio/{host.group}" in reason
    assert result["rolled_back"] is True
    assert host.driver() == "vfio-pci"
    assert guests(host) == {"ct": "stopped", "vm": "running"}  # the VM was started again


def test_to_ct_gives_the_device_back_to_its_host_driver(host):
    assert host.driver() == "vfio-pci", "needs the move to the VM"
    code, result, reason = gpu_switch(host, "to-ct")
    assert code == 0, reason
    assert result["owner"] == "ct" and result["changed"] is True
    assert host.driver() == "e1000"
    host.vm.check(f"ls /sys/bus/pci/devices/{host.e1000}/net/ && test ! -e /dev/vfio/{host.group}")
    # The override stays on the host driver, so a stray VM start cannot take the device back.
    assert host.vm.check(f"cat /sys/bus/pci/devices/{host.e1000}/driver_override").strip() == "e1000"
    assert guests(host) == {"ct": "running", "vm": "stopped"}
    code, again, reason = gpu_switch(host, "to-ct")
    assert code == 0 and again["changed"] is False, reason
