"""The pve_guest_gpu role run by ansible-playbook against fakepve: the entries it derives from the GPU inventory,
idempotence and check mode at the role level, and bad inputs stopped before any change with the variable named."""

import pytest
from pve_testlib import play_with_pve_api

GPUS = [
    {"address": "0000:01:00.0", "slot": "0000:01:00", "index": 0, "minor": 0},
    {"address": "0000:81:00.0", "slot": "0000:81:00", "index": 1, "minor": 1},
]


@pytest.fixture
def pve(fakepve):
    fakepve.add_ct(
        101,
        "inference-ct",
        node="pve1",
        status="running",
        config={"hostname": "inference-ct", "memory": 65536, "dev0": "/dev/dri/renderD128"},
    )
    fakepve.add_vm(
        201,
        "inference-vm",
        node="pve1",
        status="stopped",
        config={"machine": "q35", "bios": "ovmf", "memory": "65536", "hostpci0": "0000:41:00.0,pcie=1"},
    )
    return fakepve


@pytest.fixture
def play(pve, fakepve_cafile, tmp_path):
    def run(*extra, **given):
        role = {
            "role": "pve_guest_gpu",
            "pve_guest_gpu_gpus": GPUS,
            "pve_guest_gpu_containers": [{"vmid": 101}],
            "pve_guest_gpu_vms": [{"vmid": 201}],
            "pve_guest_gpu_ct_method": "devN",
            **{k: v for k, v in given.items() if not k.startswith("pve_api_")},
        }
        # The connection is role pve_api's (run first, as playbooks/host.yml does), set as an inventory sets it: a
        # role's parameters are checked against its own argument spec only.
        connection = {
            "pve_api_node": "pve1",
            "pve_api_host": pve.host,
            "pve_api_port": pve.port,
            "pve_api_password": "secret",
            "pve_api_ca_path": fakepve_cafile,
            # The "host" here is this machine, whose Python (this environment) has the API client already.
            "pve_api_packages": [],
            **{k: v for k, v in given.items() if k.startswith("pve_api_")},
        }
        return play_with_pve_api(tmp_path, connection, role, *extra)

    return run


def test_the_role_wires_both_guests_once(pve, play):
    changed, failed, out = play()
    assert failed == 0, out[-4000:]
    assert changed == 2
    ct = pve.ct(101).config
    assert {k: v for k, v in ct.items() if k.startswith("dev")} == {
        "dev0": "/dev/dri/renderD128",
        "dev1": "/dev/nvidia0,mode=0666",
        "dev2": "/dev/nvidia1,mode=0666",
        "dev3": "/dev/nvidiactl,mode=0666",
        "dev4": "/dev/nvidia-uvm,mode=0666",
        "dev5": "/dev/nvidia-uvm-tools,mode=0666",
    }
    vm = pve.vm(201).config
    assert (vm["hostpci0"], vm["hostpci1"], vm["hostpci2"]) == (
        "0000:41:00.0,pcie=1",
        "0000:01:00,pcie=1",
        "0000:81:00,pcie=1",
    )
    assert play()[:2] == (0, 0), "a second run changes nothing"
    assert play("--check", "--diff")[:2] == (0, 0), "--check on the wired guests reports nothing"


def test_a_gpu_taken_off_the_vm_leaves_it_and_check_mode_shows_it_first(pve, play):
    assert play()[1] == 0
    changed, failed, out = play("--check", "--diff", pve_guest_gpu_vms=[{"vmid": 201, "gpus": ["0000:01:00.0"]}])
    assert (changed, failed) == (1, 0)
    assert "-hostpci2: 0000:81:00,pcie=1" in out
    assert "hostpci2" in pve.vm(201).config, "check mode wrote nothing"
    assert play(pve_guest_gpu_vms=[{"vmid": 201, "gpus": ["0000:01:00.0"]}])[:2] == (1, 0)
    assert "hostpci2" not in pve.vm(201).config and pve.vm(201).config["hostpci0"] == "0000:41:00.0,pcie=1"


def test_a_container_vmid_that_is_a_vm_is_named(pve, play):
    changed, failed, out = play(pve_guest_gpu_containers=[{"vmid": 201}], pve_guest_gpu_vms=[])
    assert (changed, failed) == (0, 1)
    assert "pve_guest_gpu_containers[0]: vmid 201 is a VM (type qemu) on node pve1, not a container" in out


def test_a_gpu_the_host_does_not_have_stops_in_preflight(pve, play):
    before = dict(pve.vm(201).config)
    changed, failed, out = play(pve_guest_gpu_vms=[{"vmid": 201, "gpus": ["0000:02:00.0"]}])
    assert (changed, failed) == (0, 1)
    assert "pve_guest_gpu_vms[0].gpus: given" in out and "0000:02:00.0" in out and "expected GPUs of this host" in out
    assert "preflight | Check the role's variables against its rules" in out
    assert pve.vm(201).config == before


def test_https_without_a_password_says_what_to_use(pve, play):
    changed, failed, out = play(pve_api_password="")
    assert (changed, failed) == (0, 1)
    assert "pve_api_password: given nothing (empty)" in out and "pve_api_backend: local" in out


def test_a_wrong_password_is_refused_naming_its_variable_before_any_change(pve, play):
    before = dict(pve.ct(101).config), dict(pve.vm(201).config)
    changed, failed, out = play(pve_api_password="wrong-canary-3b7e")
    assert (changed, failed) == (0, 1)
    assert "pve_api_password: root@pam could not log in" in out and "login | Try the Proxmox login" in out
    assert "wrong-canary-3b7e" not in out
    assert (pve.ct(101).config, pve.vm(201).config) == before
