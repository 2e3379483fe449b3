"""The local lab end to end: fake Proxmox API, podman machines, site.yml converged, re-converged and checked,
the GPUs moved to the VM and back with gpu-switch, and the stand-in service validated."""

import pytest

from inferhost import lab as labmod

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab():
    labmod.cmd_down(None)
    the_lab = labmod.Lab.from_inventory()
    labmod.build_images(the_lab)
    labmod.start_fakepve(the_lab)
    labmod.start_containers(the_lab)
    labmod.install_standins(the_lab)
    yield the_lab
    labmod.cmd_down(None)


@pytest.fixture(scope="module")
def first_converge(lab):
    return labmod.converge(lab)


def test_first_converge_changes_every_guest(lab, first_converge):
    assert first_converge.status == "successful"
    assert first_converge.failed == 0
    assert {"lab-pve", "lab-ct", "lab-vm"} <= first_converge.hosts
    changed_hosts = {line.split(":")[0] for line in first_converge.changed_tasks}
    assert {"lab-ct", "lab-vm"} <= changed_hosts


def test_the_guests_are_wired_for_all_eight_gpus(lab, first_converge):
    ct, vm = labmod.api_guests(lab)
    ct_config, vm_config = ct.config.get(), vm.config.get()
    assert sorted(k for k in vm_config if k.startswith("hostpci")) == [f"hostpci{n}" for n in range(8)]
    nodes = {v.split(",")[0] for k, v in ct_config.items() if k.startswith("dev") and k[3:].isdigit()}
    assert {f"/dev/nvidia{n}" for n in range(8)} | {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= nodes


def test_second_converge_changes_nothing(lab, first_converge):
    again = labmod.converge(lab)
    assert again.changed == 0, f"second converge changed: {again.changed_tasks}"


def test_check_mode_on_the_converged_lab_reports_nothing(lab, first_converge):
    checked = labmod.converge(lab, check=True)
    assert checked.changed == 0, f"--check on a converged lab reports: {checked.changed_tasks}"


def test_gpu_switch_moves_the_gpus_to_the_vm_and_back(lab, first_converge):
    ct, vm = labmod.api_guests(lab)
    assert (ct.status.current.get()["status"], vm.status.current.get()["status"]) == ("running", "stopped")

    assert labmod.move_gpus(lab, "vm").startswith("owner=vm gpus=8 changed=True")
    assert (ct.status.current.get()["status"], vm.status.current.get()["status"]) == ("stopped", "running")

    assert labmod.move_gpus(lab, "ct").startswith("owner=ct gpus=8 changed=True")
    assert (ct.status.current.get()["status"], vm.status.current.get()["status"]) == ("running", "stopped")

    # Asking for where the GPUs already are changes nothing.
    assert labmod.move_gpus(lab, "ct").startswith("owner=ct gpus=8 changed=False")


def test_validate_asks_the_service_its_questions(lab, first_converge):
    assert "3/3 prompts answered well" in labmod.validate(lab)


def test_the_fake_api_knows_both_guests(lab):
    summary = labmod.api_summary(lab)
    px = lab.proxmox
    assert f"CT {px['container']['vmid']} {px['container']['status']}" in summary
    assert f"VM {px['vm']['vmid']} {px['vm']['status']}" in summary


def test_a_fresh_lab_in_check_mode_shows_the_changes(lab):
    """Against machines that were never converged, --check lists the changes and makes none."""
    labmod.remove_containers(lab)
    labmod.start_containers(lab)
    labmod.install_standins(lab)
    planned = labmod.converge(lab, check=True)
    assert planned.changed > 0
    changed_hosts = {line.split(":")[0] for line in planned.changed_tasks}
    assert {"lab-pve", "lab-ct", "lab-vm"} <= changed_hosts
    again = labmod.converge(lab, check=True)
    assert again.changed == planned.changed, "check mode changed something on the machines"
