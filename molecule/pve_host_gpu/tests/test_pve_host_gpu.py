"""pve_host_gpu on a converged container: boot configuration, modules, NVIDIA packages, units, facts."""

import json

import pytest

CALLS = "/var/log/inferhost-standin/calls.log"
DRIVER = "590.48.01"
PACKAGES = ["nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-persistenced", "nvidia-modprobe"]
PINNING = f"nvidia-driver-pinning-{DRIVER}"
KERNEL = {"bookworm": "6.8.12-9-pve", "trixie": "6.14.8-2-pve"}


@pytest.fixture
def release(host):
    return host.backend.host.rsplit("-", 1)[1]


def calls(host, prefix):
    content = host.file(CALLS).content_string if host.file(CALLS).exists else ""
    return [line for line in content.splitlines() if line.startswith(prefix)]


# --- boot configuration ------------------------------------------------------------------------------


def test_grub_host_gets_a_dropin_and_one_update_grub(host, release):
    if release != "bookworm":
        pytest.skip("bookworm is the GRUB host")
    dropin = host.file("/etc/default/grub.d/inferhost-gpu.cfg")
    assert dropin.mode == 0o644
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} iommu=pt pcie_aspm=off"' in (
        dropin.content_string
    )
    # The stand-in update-grub sources /etc/default/grub and the drop-ins as grub-mkconfig does.
    assert calls(host, "update-grub") == ["update-grub  => GRUB_CMDLINE_LINUX_DEFAULT=quiet iommu=pt pcie_aspm=off"]
    assert calls(host, "proxmox-boot-tool refresh") == [], "no ESPs here: nothing to refresh"
    assert not host.file("/etc/kernel/cmdline").exists


def test_systemd_boot_host_gets_kernel_cmdline_and_one_refresh(host, release):
    if release != "trixie":
        pytest.skip("trixie is the systemd-boot host")
    cmdline = host.file("/etc/kernel/cmdline").content_string
    assert cmdline == "root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on iommu=pt pcie_aspm=off\n"
    # Detection asked proxmox-boot-tool; the handler refreshed the ESPs once, for both changes.
    assert "proxmox-boot-tool status" in calls(host, "proxmox-boot-tool status")
    assert calls(host, "proxmox-boot-tool refresh") == ["proxmox-boot-tool refresh"]
    assert host.file("/var/log/inferhost-standin/esp-cmdline").content_string == cmdline
    assert calls(host, "update-grub") == []
    assert not host.file("/etc/default/grub.d/inferhost-gpu.cfg").exists
    backups = host.check_output("ls /etc/kernel/ | grep -c '^cmdline\\..*~$' || true")
    assert int(backups) == 1, "the original command line is kept as a backup"


def test_initramfs_rebuilt_once_for_all_kernels(host):
    assert calls(host, "update-initramfs") == ["update-initramfs -u -k all"]


# --- modules -----------------------------------------------------------------------------------------


def test_vfio_modules_load_at_boot(host):
    lines = host.file("/etc/modules-load.d/inferhost-vfio.conf").content_string.splitlines()
    assert [line for line in lines if line and not line.startswith("#")] == ["vfio", "vfio_iommu_type1", "vfio_pci"]


def test_modprobe_sees_blacklist_and_uvm_option(host):
    # kmod's own parser reads /etc/modprobe.d: the files are valid, not just present.
    config = host.check_output("modprobe --showconfig").splitlines()
    assert "blacklist nouveau" in config
    assert "options nouveau modeset=0" in config
    assert "options nvidia_uvm uvm_disable_hmm=1" in config


# --- NVIDIA repository and packages ------------------------------------------------------------------


def test_repository_source_is_signed(host):
    source = host.file("/etc/apt/sources.list.d/inferhost-nvidia-cuda.sources").content_string
    assert "URIs: file:///srv/inferhost-standin/apt/" in source
    assert "Suites: /" in source
    assert "Signed-By: /etc/apt/keyrings/inferhost-nvidia-cuda.asc" in source
    assert "Types: deb" in source
    assert host.file("/etc/apt/keyrings/inferhost-nvidia-cuda.asc").contains("BEGIN PGP PUBLIC KEY BLOCK")


def test_exact_version_installed_though_a_newer_one_is_offered(host):
    offered = host.check_output("apt-cache madison nvidia-kernel-open-dkms")
    assert "595.45.04-1" in offered, "the stand-in repository offers a newer driver"
    for package in PACKAGES:
        assert host.package(package).version == f"{DRIVER}-1", package


def test_pinning_package_holds_apt_to_the_version(host):
    assert host.package(PINNING).is_installed
    policy = host.check_output("apt-cache policy nvidia-driver-cuda")
    assert f"Candidate: {DRIVER}-1" in policy, policy


def test_pinning_package_installed_before_the_driver(host):
    log = host.check_output("grep ' install ' /var/log/dpkg.log").splitlines()
    order = [line.split()[3].split(":")[0] for line in log]
    assert order.index(PINNING) < order.index("nvidia-kernel-open-dkms")


def test_driver_packages_are_held(host):
    held = set(host.check_output("apt-mark showhold").split())
    assert {PINNING, *PACKAGES} <= held


def test_module_built_for_the_kernel_with_headers(host, release):
    kernel = KERNEL[release]
    assert host.package(f"proxmox-headers-{kernel}").is_installed
    assert host.file(f"/lib/modules/{kernel}/updates/dkms/nvidia.ko").contains(f"stand-in nvidia {DRIVER}")


# --- units -------------------------------------------------------------------------------------------


def test_device_node_unit_runs_nvidia_modprobe_for_every_node(host):
    unit = "inferhost-nvidia-device-nodes.service"
    assert host.service(unit).is_enabled
    execs = [
        line
        for line in host.file(f"/etc/systemd/system/{unit}").content_string.splitlines()
        if line.startswith("ExecStart=")
    ]
    assert execs[:4] == [
        "ExecStart=/usr/bin/nvidia-modprobe -c=255",
        "ExecStart=/usr/bin/nvidia-modprobe -c=0",
        "ExecStart=/usr/bin/nvidia-modprobe -c=1",
        "ExecStart=/usr/bin/nvidia-modprobe -u -c=0",
    ]
    assert "Before=pve-guests.service lxc.service" in host.file(f"/etc/systemd/system/{unit}").content_string
    # Not started in a container (no nvidia module in its kernel). Started anyway, it fails at its first
    # line, as the real nvidia-modprobe does when it cannot load the module, and makes no node.
    assert not host.service(unit).is_running
    before = len(calls(host, "nvidia-modprobe"))
    try:
        assert host.run(f"systemctl start {unit}").rc != 0
        assert calls(host, "nvidia-modprobe")[before:] == ["nvidia-modprobe -c=255"]
        assert not host.file("/dev/nvidiactl").exists
    finally:
        host.run(f"systemctl reset-failed {unit}")


def test_persistence_daemon_enabled_not_started_without_a_driver(host):
    service = host.service("nvidia-persistenced")
    assert service.is_enabled
    assert not service.is_running


# --- facts and reboot --------------------------------------------------------------------------------


def test_gpu_inventory_published_as_local_facts(host):
    fact = json.loads(host.file("/etc/ansible/facts.d/inferhost_gpu_facts.fact").content_string)
    assert fact["driver_version"] == DRIVER
    assert fact["loaded_driver_version"] == DRIVER
    assert fact["iommu_active"] is True
    gpus = fact["gpus"]
    assert [g["address"] for g in gpus] == ["0000:01:00.0", "0000:81:00.0"]
    assert [g["numa_node"] for g in gpus] == [0, 1]
    assert [g["iommu_group"] for g in gpus] == [10, 20]
    assert [g["minor"] for g in gpus] == [0, 1]
    assert [f["address"] for f in gpus[0]["functions"]] == ["0000:01:00.0", "0000:01:00.1"]
    assert all("driver" not in f for f in gpus[0]["functions"])
    # The driver bound now is no inventory: the facts stay as they are while gpu-switch moves the GPUs.
    assert "driver" not in gpus[0]
    assert "foreign_group_members" not in gpus[0]


def test_reboot_reasons_kept_until_the_next_boot(host, release):
    marker = host.file("/run/inferhost/reboot-required")
    reasons = [line for line in marker.content_string.splitlines() if not line.startswith("#")]
    assert "kernel command line changed" in reasons[0]
    assert any(r.startswith("module configuration changed") for r in reasons)
    assert f"NVIDIA driver {DRIVER} installed" in reasons
