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


# The rest of what pve_host_gpu decides on, read in the same call.


def test_probe_reads_installed_packages_with_their_holds():
    output = (
        "hi nvidia-kernel-open-dkms=590.48.01-1\n"
        "ii nvidia-driver-pinning-590.48.01=590.48.01-1\n"
        "rc nvidia-modprobe=580.65.06-1\n"  # removed, its configuration left: not installed
        "un nvidia-persistenced=\n"
    )
    assert PROBE.parse_packages(output) == [
        {
            "name": "nvidia-kernel-open-dkms",
            "version": "590.48.01-1",
            "held": True,
            "entry": "nvidia-kernel-open-dkms=590.48.01-1",
        },
        {
            "name": "nvidia-driver-pinning-590.48.01",
            "version": "590.48.01-1",
            "held": False,
            "entry": "nvidia-driver-pinning-590.48.01=590.48.01-1",
        },
    ]


def test_probe_asks_dpkg_for_the_packages_with_the_format_untouched(make_host, tmp_path, monkeypatch):
    """dpkg-query gets its ${...} format as written, not expanded as variables; exit 1 (a name it does not
    know) is no failure."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dpkg = bin_dir / "dpkg-query"
    dpkg.write_text(
        '#!/bin/sh\nprintf "%s\\n" "$3" > "$(dirname "$0")/format"\necho "hi nvidia-modprobe=590.48.01-1"\nexit 1\n'
    )
    dpkg.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("Package", "expanded")  # what an expansion of the format's ${Package} would put there
    result = run_module(PROBE, probe_args(make_host(), packages=["nvidia-modprobe", "nvidia-driver-pinning*"]))
    assert result["packages"][0]["held"] is True and result["packages"][0]["version"] == "590.48.01-1"
    assert (bin_dir / "format").read_text() == PROBE.DPKG_FORMAT + "\n"
    dpkg.write_text("#!/bin/sh\necho 'dpkg: database locked' >&2\nexit 2\n")
    failed = run_module(PROBE, probe_args(make_host(), packages=["nvidia-modprobe"]))
    assert failed["failed"] and "database locked" in failed["msg"]


def test_probe_reports_paths_and_the_apt_sources_naming_a_url(make_host, tmp_path):
    sources = tmp_path / "sources.list.d"
    sources.mkdir()
    url = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
    (sources / "inferhost-nvidia-cuda.sources").write_text(f"Types: deb\nURIs: {url}\nSuites: /\n")
    (sources / "cuda-debian12-x86_64.list").write_text(f"deb [signed-by=/usr/share/keyrings/cuda.gpg] {url} /\n")
    (sources / "debian.sources").write_text("URIs: http://deb.debian.org/debian\n")
    (sources / "notes.txt").write_text(url)  # apt reads only .list and .sources
    empty = tmp_path / "proxmox-boot-uuids"
    empty.write_text("")
    result = run_module(
        PROBE,
        probe_args(
            make_host(),
            paths=[str(empty), str(tmp_path / "absent")],
            apt_sources_naming=url,
            apt_sources_dir=str(sources),
        ),
    )
    assert result["apt_sources"] == [
        str(sources / "cuda-debian12-x86_64.list"),
        str(sources / "inferhost-nvidia-cuda.sources"),
    ]
    assert result["paths"] == {
        str(empty): {"exists": True, "size": 0},
        str(tmp_path / "absent"): {"exists": False, "size": None},
    }
    assert run_module(PROBE, probe_args(make_host(), apt_sources_dir=str(sources)))["apt_sources"] == []


def test_probe_reports_what_systemctl_says_of_each_unit(make_host, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(
        '#!/bin/sh\ncase "$2" in\n  on.service) echo enabled ;;\n  off.service) echo disabled; exit 1 ;;\n'
        '  *) echo "Failed to get unit file state for $2: No such file or directory" >&2; exit 1 ;;\nesac\n'
    )
    systemctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    result = run_module(PROBE, probe_args(make_host(), units=["on.service", "off.service", "gone.service"]))
    assert result["units"] == {"on.service": "enabled", "off.service": "disabled", "gone.service": "not-found"}
