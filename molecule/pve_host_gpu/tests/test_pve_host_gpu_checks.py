"""pve_host_gpu's checks, driven through pass and fail cases by checks.yml on the converged instances.

Each case points the role's inputs (sysfs, procfs and modules roots, the inventory's variables) at a fake
tree that prepare.yml built; one ansible-playbook run covers every case on every instance, and one more, with
--check, the cases of CHECK_MODE_CASES.
"""

import json
from pathlib import Path

import pytest
from molecule_play import instances, play

SCENARIO = Path(__file__).resolve().parents[1]
# The only way the converged instances differ from the configuration: bookworm's fake running kernel was booted
# before the IOMMU arguments were added (molecule.yml's fake_cmdline); trixie's has them.
STALE_CMDLINE = "the running kernel command line lacks iommu=pt pcie_aspm=off"


# Cases for task files that change the instance, run with --check: on the converged instance the repository
# exists, so an error of a task that depends on it must stop the check run as it would stop the real one.
# (That a check run of the whole role passes there is tests/molecule's zero-change --check step.)
CHECK_MODE_CASES = [
    # The repository offers 590.48.01-1 only: apt cannot install revision 9.
    {"name": "revision_not_offered", "then": ["repository", "driver"], "pve_host_gpu_driver_package_revision": "9"},
]


def drive(request, out, *extra):
    hosts = instances(request)
    changed = play(SCENARIO / "checks.yml", hosts, "-e", f"checks_out={out}", *extra)
    assert set(changed.values()) == {0}, f"a check case changed the instance: {changed}"
    return {h: json.loads((out / f"{h}.json").read_text()) for h in hosts}


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory):
    return drive(request, tmp_path_factory.mktemp("checks"))


@pytest.fixture(scope="module")
def check_mode_outcomes(request, tmp_path_factory):
    cases = json.dumps({"cases": CHECK_MODE_CASES})
    return drive(request, tmp_path_factory.mktemp("check_mode"), "--check", "-e", cases)


@pytest.fixture
def case(outcomes, host):
    return outcomes[host.backend.host]


@pytest.fixture
def check_case(check_mode_outcomes, host):
    return check_mode_outcomes[host.backend.host]


def failed(outcome, *fragments):
    assert outcome["failed"], f"expected a failure, the case passed: {outcome}"
    for fragment in fragments:
        assert fragment in outcome["msg"], f"{fragment!r} not in {outcome['msg']!r}"
    return outcome


def test_the_converged_configuration_passes(case, host):
    assert case["passes"]["failed"] is False
    expected = [STALE_CMDLINE] if host.backend.host.endswith("bookworm") else []
    assert case["passes"]["state_reasons"] == expected


def test_every_check_accepts_what_the_inventory_allows(case):
    # Secure Boot with the key enrolled, expected swap, an accepted mixed group, an allowed version change.
    assert case["tolerated"]["failed"] is False, case["tolerated"]


def test_a_malformed_driver_version_stops_before_any_change(case):
    outcome = failed(
        case["bad_version"],
        'pve_host_gpu_driver_version: given "590.48"',
        "expected a driver version such as 590.48.01",
    )
    assert outcome["task"] == "preflight | Check the role's variables against its rules (meta/rules.yml)"


def test_addresses_that_are_not_gpus_of_the_host_are_named(case):
    outcome = failed(
        case["missing_address"],
        "pve_host_gpu_addresses: 0000:03:00.0 (no such PCI function), "
        "0000:00:01.1 (vendor 0x1022 class 0x060400 is not a 0x10de GPU)",
    )
    assert outcome["task"].startswith("preflight | ")
    assert "0000:01:00.0" not in outcome["msg"], "only the wrong addresses are named"


def test_secure_boot_without_an_enrolled_key_stops_with_what_to_do(case):
    failed(case["secure_boot_no_key"], "Secure Boot is on", "does not exist", "mokutil --import", "dkms generate_mok")


def test_swap_the_inventory_does_not_expect_stops(case):
    failed(case["swap_unexpected"], "Swap is active", "/dev/zd0", "pve_host_gpu_allow_swap")


def test_a_gpu_sharing_its_iommu_group_with_a_nic_stops(case):
    outcome = failed(case["group_mixed"], "GPU 0000:01:00.0 shares IOMMU group 10 with", "0000:02:00.0 (class 0x020000")
    assert "0000:00:01.1" not in outcome["msg"], "a bridge in the group is not foreign"
    assert "0000:01:00.1" not in outcome["msg"], "the GPU's own audio function is not foreign"


def test_a_version_other_than_the_installed_one_is_refused(case):
    outcome = failed(
        case["other_version_installed"],
        "has NVIDIA driver 590.48.01-1 installed",
        "the inventory names 595.45.04",
        "pve_host_gpu_allow_driver_change=true",
    )
    assert outcome["task"] == "preflight | Refuse a driver version the inventory does not name"


def test_a_version_the_repository_lacks_is_refused_with_what_it_offers(case):
    failed(
        case["version_not_offered"],
        "pve_host_gpu_driver_version: 590.99.01 is not in the NVIDIA repository",
        "590.48.01-1",
        "595.45.04-1",
    )


def test_a_kernel_without_the_built_module_stops(case):
    outcome = failed(
        case["kernel_unbuilt"],
        "The NVIDIA module is not built for 6.8.12-10-pve:",
        "proxmox-headers-6.8.12-10-pve",
        "dkms autoinstall",
    )
    assert "-9-pve" not in outcome["msg"] and "-2-pve" not in outcome["msg"], "built kernels are not named"


def test_a_loaded_uvm_module_with_the_wrong_option_asks_for_a_reload(case):
    outcome = case["uvm_wrong"]
    assert outcome["failed"] is False, outcome
    wrong = "nvidia_uvm is loaded with uvm_disable_hmm=N (wanted 1): reload it with the GPUs idle, or reboot"
    assert wrong in outcome["state_reasons"]
    assert wrong in outcome["reasons"]
    assert not any("uvm" in r for r in case["passes"]["state_reasons"])


def test_no_reboot_without_kernel_access_even_when_allowed(case, host):
    outcome = case["uvm_wrong"]
    assert outcome["reboot_now"] is False
    assert "NVIDIA driver 590.48.01 installed" in outcome["reasons"]
    if host.backend.host.endswith("bookworm"):
        assert STALE_CMDLINE in outcome["reasons"]
    else:
        assert not any("command line lacks" in r for r in outcome["reasons"])


def test_check_mode_refuses_a_pin_the_repository_cannot_install(check_case):
    # The repository and the installed driver are there, so check mode has no excuse: what stops the real run
    # stops the check run.
    wanted = "no available installation candidate for nvidia-kernel-open-dkms=590.48.01-9"
    outcome = failed(check_case["revision_not_offered"], wanted)
    assert outcome["task"] == "driver | Install the driver at the exact version"
