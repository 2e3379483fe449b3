"""pve_kernel_cmdline and pve_host_probe, run as Ansible runs them (main() with module arguments)."""

import os
import stat
from pathlib import Path

import pytest
from pve_testlib import BRIDGE, NIC, load_module, run_module

CMDLINE = load_module("pve_kernel_cmdline")
PROBE = load_module("pve_host_probe")
IOMMU_KEYS = ["amd_iommu", "intel_iommu", "iommu"]


@pytest.mark.parametrize(
    ("current", "args", "remove", "expected"),
    [
        # Added at the end; every other argument stays where it is.
        (
            "root=ZFS=rpool/ROOT/pve-1 boot=zfs",
            ["amd_iommu=on", "iommu=pt"],
            IOMMU_KEYS,
            "root=ZFS=rpool/ROOT/pve-1 boot=zfs amd_iommu=on iommu=pt",
        ),
        # A same-key argument is replaced in place, duplicates of it go.
        ("iommu=off root=/dev/x iommu=soft quiet", ["iommu=pt"], IOMMU_KEYS, "iommu=pt root=/dev/x quiet"),
        # A CPU change swaps the vendor argument.
        (
            "root=/dev/x intel_iommu=on iommu=pt",
            ["amd_iommu=on", "iommu=pt"],
            IOMMU_KEYS,
            "root=/dev/x iommu=pt amd_iommu=on",
        ),
        # A managed key that is no longer wanted is removed; unmanaged ones are not.
        ("root=/dev/x pcie_aspm=off nokaslr", ["iommu=pt"], [*IOMMU_KEYS, "pcie_aspm"], "root=/dev/x nokaslr iommu=pt"),
        # Already right: the same line.
        (
            "root=/dev/x amd_iommu=on iommu=pt",
            ["amd_iommu=on", "iommu=pt"],
            IOMMU_KEYS,
            "root=/dev/x amd_iommu=on iommu=pt",
        ),
    ],
)
def test_reconcile_keeps_foreign_arguments_in_place(current, args, remove, expected):
    assert " ".join(CMDLINE.reconcile(current.split(), args, remove)) == expected


@pytest.fixture
def cmdline(tmp_path):
    path = tmp_path / "cmdline"
    path.write_text("root=ZFS=rpool/ROOT/pve-1 boot=zfs\n")
    path.chmod(0o644)
    return path


def test_module_writes_with_backup_and_diff(cmdline):
    result = run_module(
        CMDLINE, {"path": str(cmdline), "args": ["amd_iommu=on", "iommu=pt"], "remove_keys": IOMMU_KEYS}, diff=True
    )
    assert result["changed"] is True
    assert cmdline.read_text() == "root=ZFS=rpool/ROOT/pve-1 boot=zfs amd_iommu=on iommu=pt\n"
    assert Path(result["backup_file"]).read_text() == "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n"
    assert result["diff"]["before"] == "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n"
    assert stat.S_IMODE(os.stat(cmdline).st_mode) == 0o644
    again = run_module(CMDLINE, {"path": str(cmdline), "args": ["amd_iommu=on", "iommu=pt"], "remove_keys": IOMMU_KEYS})
    assert again["changed"] is False and "backup_file" not in again


def test_check_mode_reports_without_writing(cmdline):
    result = run_module(CMDLINE, {"path": str(cmdline), "args": ["iommu=pt"]}, check_mode=True)
    assert result["changed"] is True
    assert result["cmdline"] == "root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt"
    assert cmdline.read_text() == "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n"
    assert len(list(cmdline.parent.iterdir())) == 1, "no backup in check mode"


def test_missing_file_says_how_to_create_it(tmp_path):
    result = run_module(CMDLINE, {"path": str(tmp_path / "nope"), "args": ["iommu=pt"]})
    assert result["failed"] and "does not exist" in result["msg"] and "cat /proc/cmdline" in result["msg"]


def test_two_lines_are_refused(cmdline):
    cmdline.write_text("root=/dev/x\nquiet\n")
    result = run_module(CMDLINE, {"path": str(cmdline), "args": ["iommu=pt"]})
    assert result["failed"] and "has 2 lines" in result["msg"]
    assert cmdline.read_text() == "root=/dev/x\nquiet\n"


@pytest.mark.parametrize("bad", ["iommu=pt quiet", 'x="a b"', ""])
def test_an_argument_with_spaces_or_quotes_is_refused(cmdline, bad):
    result = run_module(CMDLINE, {"path": str(cmdline), "args": [bad]})
    assert result["failed"] and "is not a single kernel argument" in result["msg"]


# --- pve_host_probe ------------------------------------------------------------------------------------


def probe_args(root, **kw):
    return {"sysfs_root": f"{root}/sys", "proc_root": f"{root}/proc", "modules_root": f"{root}/lib/modules", **kw}


def test_probe_reports_without_changing(make_host):
    result = run_module(PROBE, probe_args(make_host(), addresses=["01:00.0"]), check_mode=True)
    assert result["changed"] is False
    assert [g["address"] for g in result["gpus"]] == ["0000:01:00.0"]
    assert result["mok_enrolled"] is None and result["mok_detail"] == "Secure Boot is disabled"


def test_probe_takes_the_gpu_vendor_as_a_parameter(make_host):
    # The real-kernel tests stand in for GPUs with emulated display devices of another vendor.
    root = make_host(others=[BRIDGE, {**NIC, "address": "0000:03:00.0", "class": "0x030000", "vendor": "0x1234"}])
    other = run_module(PROBE, probe_args(root, addresses=["0000:03:00.0"], vendor="0x1234"))
    assert [g["address"] for g in other["gpus"]] == ["0000:03:00.0"] and other["missing"] == []
    nvidia = run_module(PROBE, probe_args(root, addresses=["0000:03:00.0"]))
    assert nvidia["gpus"] == [] and "is not a 0x10de GPU" in nvidia["missing"][0]["reason"]


@pytest.fixture
def mokutil(tmp_path):
    tool = tmp_path / "mokutil"
    tool.write_text(
        '#!/bin/sh\nif grep -q ENROLLED "$2"; then echo "$2 is already enrolled"; '
        'else echo "$2 is not enrolled"; exit 1; fi\n'
    )
    tool.chmod(0o755)
    return str(tool)


@pytest.mark.parametrize(("content", "enrolled"), [("ENROLLED key", True), ("another key", False)])
def test_secure_boot_asks_mokutil_about_the_dkms_key(make_host, tmp_path, mokutil, content, enrolled):
    key = tmp_path / "mok.pub"
    key.write_text(content)
    result = run_module(PROBE, probe_args(make_host(secure_boot=True), mok_key=str(key), mokutil=mokutil))
    assert result["secure_boot"] == "enabled"
    assert result["mok_enrolled"] is enrolled
    assert ("is already enrolled" if enrolled else "is not enrolled") in result["mok_detail"]


def test_secure_boot_without_a_key_or_mokutil(make_host, tmp_path, mokutil):
    root = make_host(secure_boot=True)
    no_key = run_module(PROBE, probe_args(root, mok_key=str(tmp_path / "none.pub"), mokutil=mokutil))
    assert no_key["mok_enrolled"] is False and "does not exist" in no_key["mok_detail"]
    key = tmp_path / "mok.pub"
    key.write_text("ENROLLED")
    no_tool = run_module(PROBE, probe_args(root, mok_key=str(key), mokutil=str(tmp_path / "no-mokutil")))
    assert no_tool["mok_enrolled"] is False and "is not installed" in no_tool["mok_detail"]
