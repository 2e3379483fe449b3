"""The pve_host_gpu role on a real kernel: its IOMMU-group check, and a vfio binding by id through the
modprobe.d files it writes, across a reboot.

The role runs through ansible-playbook over ssh into the QEMU machine: its preflight (the checks) and its
module configuration (modprobe.d, modules-load.d, the initramfs update in its handler). QEMU cannot
present NVIDIA's vendor id, so the GPUs are emulated display devices (std VGA, 1234:1111) and the probe is
told their vendor. One sits alone in its IOMMU group; the other sits with an rtl8139 behind a conventional
PCI bridge, whose devices the IOMMU cannot tell apart, so all three share a group (conftest.STANDIN_GPUS,
on the layer's one machine). The vfio binding is made for the e1000's id; the reboot that proves it comes
last in the layer.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from .conftest import CACHE, ROOT, KernelVM

pytestmark = pytest.mark.kernel
STANDIN_VENDOR = "0x1234"  # QEMU's std VGA: a display-class function, as the probe wants of a GPU
STANDIN_ID = "8086:100e"  # the e1000's vendor:device, bound to vfio-pci by id
GROUP_CHECK = "preflight | Check each GPU has its IOMMU group to itself"
PROBE = "preflight | Probe the GPUs, IOMMU groups, firmware, swap, kernels, modules, NVIDIA packages and sources"
# Puts the e1000 module into the initramfs without loading it, as a host's initramfs can carry its GPU driver:
# early boot's udev then binds the device to e1000 unless the initramfs carries the role's blacklist.
HOST_DRIVER_HOOK = """#!/bin/sh
[ "$1" = prereqs ] && exit 0
. /usr/share/initramfs-tools/hook-functions
manual_add_modules e1000
"""


@pytest.fixture(scope="module")
def machine(vm):
    return vm


def address_of(vm: KernelVM, bus: str, vendor: str, device: str) -> str:
    found = [a for a in vm.check(f"lspci -D -n -d {vendor}:{device} | cut -d' ' -f1").split() if a[5:7] == bus]
    assert len(found) == 1, found
    return found[0]


def play(vm: KernelVM, tmp_path, tasks_from: list[str], **role_vars) -> dict:
    """Run the role's task files in the machine; ansible.posix.json's result for the machine."""
    inventory = {
        "all": {
            "hosts": {
                "kernel-test": {
                    "ansible_host": "127.0.0.1",
                    "ansible_port": vm.port,
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(CACHE / "id_ed25519"),
                    "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                    "-o ServerAliveInterval=3 -o ServerAliveCountMax=3",
                    "ansible_python_interpreter": "/usr/bin/python3",
                }
            }
        }
    }
    variables = {
        "pve_host_gpu_driver_version": "590.48.01",
        "pve_host_gpu_install_driver": False,  # no NVIDIA repository here; the checks and files are the point
        **role_vars,
    }
    playbook = [
        {
            "name": "The host role's checks and module files on the kernel test machine",
            "hosts": "kernel-test",
            "gather_facts": False,
            # The probe's vendor is a parameter: here the stand-in GPUs' (the role asks for NVIDIA's).
            "module_defaults": {"pve_host_probe": {"vendor": STANDIN_VENDOR}},
            "vars": variables,
            "tasks": [
                {
                    "name": f"Run the role's {name}",
                    "ansible.builtin.import_role": {"name": "pve_host_gpu", "tasks_from": name},
                }
                for name in tasks_from
            ],
        }
    ]
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(playbook, sort_keys=False))
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CACHE_PLUGIN": "memory"}
    argv = ["ansible-playbook", "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml")]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500, check=False)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON from ansible-playbook:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}") from None
    tasks = {  # by name without the "pve_host_gpu : " prefix; handlers included
        t["task"]["name"].split(" : ", 1)[-1]: t["hosts"].get("kernel-test", {}) for t in report["plays"][0]["tasks"]
    }
    return {"stats": report["stats"]["kernel-test"], "tasks": tasks, "output": proc.stdout[-6000:]}


def test_the_group_check_fails_naming_the_device_that_shares_the_group(machine, tmp_path):
    shared = address_of(machine, "01", "1234", "1111")
    foreign = address_of(machine, "01", "10ec", "8139")
    result = play(machine, tmp_path, ["preflight.yml"], pve_host_gpu_addresses=[shared])
    assert result["stats"]["failures"] == 1, result["output"]
    check = result["tasks"][GROUP_CHECK]
    assert check.get("failed") is True, result["output"]
    assert f"GPU {shared} shares IOMMU group" in check["msg"]
    assert f"{foreign} (class 0x020000, driver 8139cp)" in check["msg"]


def test_a_vfio_binding_by_id_in_the_roles_modprobe_files_survives_a_reboot(machine, tmp_path):
    alone = address_of(machine, "00", "1234", "1111")
    e1000 = machine.address_of_id("0x8086", "0x100e")
    assert machine.driver(e1000) == "e1000"
    # The image's initramfs holds the root file system's modules alone (build-image.sh): mkinitramfs with
    # every module (MODULES=most) takes over 20 minutes under software emulation.
    machine.check("grep -qx MODULES=list /etc/initramfs-tools/initramfs.conf")
    hook = "/etc/initramfs-tools/hooks/standin-host-driver"
    proc = machine.ssh(f"cat > {hook} && chmod 755 {hook}", stdin=HOST_DRIVER_HOOK.encode())
    assert proc.returncode == 0, proc.stderr.decode()
    result = play(
        machine,
        tmp_path,
        ["preflight.yml", "modules.yml"],
        pve_host_gpu_addresses=[alone],
        pve_host_gpu_module_options={"vfio_pci": {"ids": STANDIN_ID}},
        # The host driver stays off the device, as nouveau does off a GPU: vfio-pci gets it at boot.
        pve_host_gpu_blacklist=["nouveau", "e1000"],
    )
    assert result["stats"]["failures"] == 0, result["output"]
    # The group check ran and passed for a device alone in its group.
    check = result["tasks"][GROUP_CHECK]
    assert not check.get("failed") and not check.get("skipped"), check
    probe = result["tasks"][PROBE]
    gpu = probe["gpus"][0]
    assert (gpu["address"], gpu["iommu_group_members"], gpu["foreign_group_members"]) == (alone, [alone], [])
    assert result["tasks"]["Update the initramfs"].get("changed") is True, result["output"]

    options = machine.check("cat /etc/modprobe.d/inferhost-gpu-options.conf")
    assert f"options vfio_pci ids={STANDIN_ID}" in options.splitlines()
    assert "blacklist e1000" in machine.check("cat /etc/modprobe.d/inferhost-blacklist.conf").splitlines()
    # The new initramfs carries the host driver and the role's files: without them early boot binds the device.
    initramfs = machine.check("lsinitramfs /boot/initrd.img-$(uname -r)", timeout=300).splitlines()
    assert "etc/modprobe.d/inferhost-blacklist.conf" in initramfs
    assert "etc/modprobe.d/inferhost-gpu-options.conf" in initramfs
    assert any(p.endswith("/e1000/e1000.ko") for p in initramfs)
    assert machine.driver(e1000) == "e1000", "the binding belongs to the next boot, not this one"

    machine.reboot(from_disk=True)
    assert machine.driver(e1000) == "vfio-pci"
    group = machine.check(f"basename $(readlink /sys/bus/pci/devices/{e1000}/iommu_group)").strip()
    machine.check(f"test -c /dev/vfio/{group}")
    # By id, and only that id: the virtio twin and the other NICs keep their drivers.
    twin = machine.check("lspci -D -n -d 1af4:1000 | cut -d' ' -f1").split()
    assert {machine.driver(a) for a in twin} == {"virtio-pci"}
    assert machine.driver(address_of(machine, "01", "10ec", "8139")) == "8139cp"
