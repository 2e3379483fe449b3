"""The host probe's readers against fake sysfs/procfs trees laid out as the kernel does."""

import os

import pve_host_probe as inv
import pytest
from gpu_switch import pci
from pve_testlib import BRIDGE, GPUS, NIC


def probe(root, **kw):
    return inv.probe(f"{root}/sys", f"{root}/proc", f"{root}/lib/modules", **kw)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("0000:01:00.0", "0000:01:00.0"),
        ("01:00.0", "0000:01:00.0"),
        ("0000:81:00", "0000:81:00.0"),
        ("0000:C1:00.1", "0000:c1:00.1"),
        ("1:00.0", None),
        ("0000:01:00.8", None),
        ("10de:2bb5", None),
        ("0000:01:20.0", None),  # a device number has 5 bits: 00-1f
        ("10000:e1:00", "10000:e1:00.0"),  # PCI domains beyond ffff (Intel VMD) stay whole
    ],
)
def test_addresses_are_normalised_or_refused(text, canonical):
    assert inv.normalise_address(text) == canonical


def test_every_nvidia_gpu_with_its_functions_group_numa_and_driver(make_host):
    result = probe(make_host())
    gpus = result["gpus"]
    assert [g["address"] for g in gpus] == ["0000:01:00.0", "0000:81:00.0"]
    first, second = gpus
    assert [f["address"] for f in first["functions"]] == ["0000:01:00.0", "0000:01:00.1"]
    assert first["functions"][1] == {"address": "0000:01:00.1", "class": "0x040300", "driver": "snd_hda_intel"}
    assert (first["iommu_group"], first["numa_node"], first["driver"], first["minor"]) == (10, 0, "nvidia", 0)
    assert (second["iommu_group"], second["numa_node"], second["driver"], second["minor"]) == (20, 1, "vfio-pci", None)
    assert first["slot"] == "0000:01:00"
    assert result["missing"] == []


def test_each_gpu_carries_what_its_pci_mapping_holds(make_host):
    root = make_host()
    gpu = probe(root)["gpus"][0]
    # vendor:device, subsystem vendor:device and the IOMMU group, as a PVE mapping entry holds them.
    assert (gpu["vendor"], gpu["device"]) == ("0x10de", "0x2bb5")
    assert (gpu["subsystem_vendor"], gpu["subsystem_device"]) == ("0x10de", "0x204b")
    assert gpu["iommu_group"] == 10
    os.unlink(f"{root}/sys/devices/pci0000:00/0000:01:00.0/subsystem_vendor")
    assert probe(root)["gpus"][0]["subsystem_vendor"] is None, "a device without a subsystem id has none"


def test_a_bridge_in_the_group_is_not_foreign_a_nic_is(make_host):
    clean = probe(make_host())["gpus"][0]
    assert "0000:00:01.1" in clean["iommu_group_members"]
    assert clean["foreign_group_members"] == []


def test_a_nic_in_the_gpus_group_is_foreign(make_host):
    root = make_host(others=[BRIDGE, {**NIC, "group": 10}])
    gpu = probe(root)["gpus"][0]
    assert gpu["foreign_group_members"] == [{"address": "0000:02:00.0", "class": "0x020000", "driver": "igb"}]


def test_the_host_role_reads_the_gpus_as_gpu_switch_does(make_host):
    # One reading of sysfs for both: the probe is gpu_switch.pci's view of each GPU, put as the role wants it.
    root = make_host(others=[BRIDGE, {**NIC, "group": 10}])
    sysfs = pci.Sysfs(f"{root}/sys")
    minors = pci.nvidia_minors(f"{root}/proc")
    gpus = probe(root)["gpus"]
    assert [g["address"] for g in gpus] == [a for a in sysfs.all_addresses() if pci.is_gpu(sysfs, a, inv.NVIDIA)]
    for gpu in gpus:
        seen = pci.read_gpu(sysfs, gpu["address"])
        functions = [(f.address, f.pci_class, f.driver) for f in seen.functions]
        assert [(f["address"], f["class"], f["driver"]) for f in gpu["functions"]] == functions
        assert (gpu["slot"], gpu["iommu_group"], gpu["numa_node"]) == (seen.slot, seen.iommu_group, seen.numa_node)
        assert gpu["iommu_group_members"] == seen.group_members
        assert [m["address"] for m in gpu["foreign_group_members"]] == [
            m for _, m in pci.foreign_group_members([seen], sysfs)
        ]
        assert gpu["minor"] == minors.get(gpu["address"])
    assert gpus[0]["foreign_group_members"][0]["address"] == NIC["address"]


def test_two_gpus_in_one_group_are_foreign_to_each_other(make_host):
    # The host role wants each GPU in a group of its own; gpu-switch moves its GPUs together, so for it
    # a configured GPU sharing the group is no obstacle (gpu_switch.pci.foreign_group_members over all of them).
    root = make_host(gpus=[{**GPUS[0]}, {**GPUS[1], "group": GPUS[0]["group"]}])
    first, second = probe(root)["gpus"]
    assert [m["address"] for m in first["foreign_group_members"]] == ["0000:81:00.0", "0000:81:00.1"]
    assert [m["address"] for m in second["foreign_group_members"]] == ["0000:01:00.0", "0000:01:00.1"]
    sysfs = pci.Sysfs(f"{root}/sys")
    both = [pci.read_gpu(sysfs, g["address"]) for g in (first, second)]
    assert pci.foreign_group_members(both, sysfs) == []


def test_requested_addresses_short_forms_and_the_missing_ones(make_host):
    result = probe(make_host(), addresses=["81:00.0", "0000:03:00.0", "0000:00:01.1", "nonsense"])
    assert [g["address"] for g in result["gpus"]] == ["0000:81:00.0"]
    assert result["missing"] == [
        {"address": "0000:03:00.0", "reason": "no such PCI function"},
        {"address": "0000:00:01.1", "reason": "vendor 0x1022 class 0x060400 is not a 0x10de GPU"},
        {"address": "nonsense", "reason": "no such PCI function"},
    ]


def test_no_iommu_groups_means_inactive_and_no_group(make_host):
    root = make_host(gpus=[{"address": "0000:01:00.0", "numa": 0}], others=[])
    result = probe(root)
    assert result["iommu_active"] is False
    assert result["gpus"][0]["iommu_group"] is None
    assert result["gpus"][0]["foreign_group_members"] == []


@pytest.mark.parametrize(("state", "expected"), [(None, "bios"), (False, "disabled"), (True, "enabled")])
def test_secure_boot_state_from_efivars(make_host, state, expected):
    assert probe(make_host(secure_boot=state))["secure_boot"] == expected


def test_efi_without_the_variable_is_disabled(make_host):
    root = make_host(secure_boot=False)
    os.unlink(os.path.join(root, "sys/firmware/efi/efivars/SecureBoot-" + inv.EFI_GLOBAL))
    assert probe(root)["secure_boot"] == "disabled"


def test_swaps_cpu_vendor_and_cmdline(make_host):
    result = probe(make_host(swaps=["/dev/zd0", "/swapfile"], cpu_vendor="GenuineIntel", cmdline="ro intel_iommu=on"))
    assert result["swaps"] == ["/dev/zd0", "/swapfile"]
    assert result["cpu_vendor"] == "intel"
    assert result["cmdline"] == ["ro", "intel_iommu=on"]
    assert probe(make_host(cpu_vendor="SomethingElse"))["cpu_vendor"] is None


def test_kernels_matching_the_pattern_with_their_built_module(make_host):
    root = make_host(kernels={"6.8.12-9-pve": True, "6.8.12-10-pve": False, "6.1.0-27-amd64": False})
    kernels = {k["name"]: k for k in probe(root)["kernels"]}
    assert set(kernels) == {"6.8.12-9-pve", "6.8.12-10-pve"}
    assert kernels["6.8.12-9-pve"]["module_built"] is True
    assert kernels["6.8.12-9-pve"]["module_files"][0].endswith("updates/dkms/nvidia.ko.xz")
    assert kernels["6.8.12-10-pve"]["module_built"] is False
    assert {k["name"] for k in probe(root, kernel_pattern="")["kernels"]} == set(kernels) | {"6.1.0-27-amd64"}


@pytest.mark.parametrize(
    ("wanted", "actual", "match"),
    [(1, "Y", True), ("1", "1", True), (0, "N", True), (1, "N", False), ("abc", "abc", True), ("abc", "abd", False)],
)
def test_module_parameters_compare_as_sysfs_shows_them(wanted, actual, match):
    assert inv.param_matches(wanted, actual) is match


def test_a_loaded_module_with_a_different_option_is_a_mismatch(make_host):
    root = make_host(
        modules={"nvidia": {"version": "590.48.01"}, "nvidia_uvm": {"parameters": {"uvm_disable_hmm": "N"}}}
    )
    result = probe(root, module_options={"nvidia_uvm": {"uvm_disable_hmm": 1}, "nvidia_drm": {"modeset": 1}})
    assert result["modules"]["nvidia"] == {"version": "590.48.01", "parameters": {}}
    assert result["modules"]["nvidia_drm"] is None, "not loaded: nothing to compare"
    assert result["module_mismatches"] == [
        {
            "module": "nvidia_uvm",
            "parameter": "uvm_disable_hmm",
            "wanted": "1",
            "actual": "N",
            "message": "nvidia_uvm is loaded with uvm_disable_hmm=N (wanted 1): "
            "reload it with the GPUs idle, or reboot",
        }
    ]


def test_a_parameter_the_module_does_not_have_is_a_mismatch(make_host):
    root = make_host(modules={"nvidia_uvm": {"parameters": {}}})
    mismatch = probe(root, module_options={"nvidia_uvm": {"uvm_disable_hmm": 1}})["module_mismatches"][0]
    assert mismatch["actual"] is None and "uvm_disable_hmm=unset" in mismatch["message"]


def test_a_missing_tree_reads_as_an_empty_host(tmp_path):
    result = inv.probe(str(tmp_path / "sys"), str(tmp_path / "proc"), str(tmp_path / "modules"))
    assert result["gpus"] == [] and result["swaps"] == [] and result["kernels"] == []
    assert result["iommu_active"] is False and result["secure_boot"] == "bios" and result["cmdline"] == []
