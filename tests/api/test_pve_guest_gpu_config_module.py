"""API contract of pve_guest_gpu_config: every call it makes, against fakepve (PVE 9 schema and permissions).

fakepve is strict about devN formats and root@pam-only options, and accepts malformed hostpciN strings;
the module validates those itself (tests/unit/module_utils/test_pve_guest_gpu_config.py).
"""

import pytest
from pve_testlib import api_args, load_module, run_module

MODULE = load_module("pve_guest_gpu_config")
NVIDIA = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
CT_CONFIG = {
    "hostname": "inference-ct",
    "memory": 65536,
    "cores": 32,
    "net0": "name=eth0,bridge=vmbr0,ip=dhcp",
    "mp0": "/srv/models,mp=/srv/models",
    "features": "nesting=1",
    "dev0": "/dev/dri/renderD128,gid=104",
    "unprivileged": 0,
}
VM_CONFIG = {
    "machine": "q35",
    "bios": "ovmf",
    "memory": "262144",
    "cores": 64,
    "scsi0": "local-lvm:vm-201-disk-0,size=200G",
    "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
    "hostpci0": "0000:41:00.0,pcie=1",  # a NIC passed through by hand: not the module's
}


@pytest.fixture
def pve(fakepve):
    fakepve.add_ct(101, "inference-ct", node="pve1", status="stopped", config=dict(CT_CONFIG))
    fakepve.add_vm(201, "inference-vm", node="pve1", status="stopped", config=dict(VM_CONFIG))
    return fakepve


@pytest.fixture
def args(pve, fakepve_cafile):
    def make(**kw):
        return api_args(pve, fakepve_cafile, **{"api_user": "root@pam", **kw})

    return make


def ct_args(args, paths=NVIDIA, **kw):
    return args(vmid=101, type="lxc", devices=[{"path": p} for p in paths], **kw)


def vm_args(args, slots=("0000:01:00", "0000:81:00"), **kw):
    return args(vmid=201, type="qemu", hostpci=[{"host": s} for s in slots], **kw)


# --- container: devN ----------------------------------------------------------------------------------


def test_container_gets_a_devn_entry_per_node_after_the_existing_ones(pve, args):
    result = run_module(MODULE, ct_args(args))
    assert result["changed"] is True, result
    config = pve.ct(101).config
    assert {k: config[k] for k in config if k.startswith("dev")} == {
        "dev0": "/dev/dri/renderD128,gid=104",
        "dev1": "/dev/nvidia0",
        "dev2": "/dev/nvidia1",
        "dev3": "/dev/nvidiactl",
        "dev4": "/dev/nvidia-uvm",
        "dev5": "/dev/nvidia-uvm-tools",
    }
    assert result["entries"] == {f"dev{i + 1}": p for i, p in enumerate(NVIDIA)}


def test_every_other_config_line_is_untouched(pve, args):
    before = {k: v for k, v in pve.ct(101).config.items() if not k.startswith("dev")}
    run_module(MODULE, ct_args(args))
    after = {k: v for k, v in pve.ct(101).config.items() if not k.startswith("dev")}
    assert after == before
    assert pve.ct(101).config["dev0"] == "/dev/dri/renderD128,gid=104"


def test_second_run_changes_nothing_and_writes_nothing(pve, args):
    run_module(MODULE, ct_args(args))
    writes = len([r for r in pve.requests if r[0] == "PUT"])
    again = run_module(MODULE, ct_args(args))
    assert again["changed"] is False
    assert len([r for r in pve.requests if r[0] == "PUT"]) == writes


def test_the_apis_spelling_of_the_same_entry_is_not_a_change(pve, args):
    pve.ct(101).config["dev3"] = "path=/dev/nvidia0,deny-write=0"
    result = run_module(MODULE, ct_args(args, paths=["/dev/nvidia0"]))
    assert result["changed"] is False, result["updates"]
    assert result["entries"] == {"dev3": "path=/dev/nvidia0,deny-write=0"}


def test_check_mode_shows_the_diff_and_writes_nothing(pve, args):
    before = dict(pve.ct(101).config)
    result = run_module(MODULE, ct_args(args), check_mode=True, diff=True)
    assert result["changed"] is True
    assert pve.ct(101).config == before
    assert "dev1: /dev/nvidia0\n" in result["diff"]["after"] and "dev1:" not in result["diff"]["before"]
    assert (
        "hostname: inference-ct\n" in result["diff"]["before"] and "hostname: inference-ct\n" in result["diff"]["after"]
    )
    assert "digest" not in result["diff"]["after"]


def test_a_gpu_taken_off_the_list_leaves_the_container(pve, args):
    run_module(MODULE, ct_args(args))
    result = run_module(MODULE, ct_args(args, paths=["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]))
    assert result["changed"] is True and result["deleted"] == ["dev2", "dev5"]
    config = pve.ct(101).config
    assert sorted(v for k, v in config.items() if k.startswith("dev")) == sorted(
        ["/dev/dri/renderD128,gid=104", "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    )


def test_state_absent_removes_only_the_modules_entries(pve, args):
    run_module(MODULE, ct_args(args))
    result = run_module(MODULE, ct_args(args, state="absent"))
    assert result["changed"] is True
    assert {k: v for k, v in pve.ct(101).config.items() if k.startswith("dev")} == {
        "dev0": "/dev/dri/renderD128,gid=104"
    }


def test_nodes_outside_the_manage_pattern_stay(pve, args):
    # gpu-switch adds /dev/nvidia-caps nodes on a move; the role owns only the kinds it writes.
    pve.ct(101).config["dev7"] = "/dev/nvidia-caps/nvidia-cap1"
    pattern = "^/dev/nvidia[0-9]+$|^(/dev/nvidiactl|/dev/nvidia-uvm|/dev/nvidia-uvm-tools)$"
    result = run_module(MODULE, ct_args(args, manage_pattern=pattern))
    assert result["changed"] is True and result["deleted"] == []
    assert pve.ct(101).config["dev7"] == "/dev/nvidia-caps/nvidia-cap1"
    assert "dev7" not in result["entries"]
    outside = run_module(MODULE, ct_args(args, paths=["/dev/nvidia-modeset"], manage_pattern=pattern))
    assert outside["failed"] and "does not match manage_pattern" in outside["msg"]


def test_options_reach_the_api(pve, args):
    result = run_module(
        MODULE, args(vmid=101, type="lxc", devices=[{"path": "/dev/nvidia-uvm", "mode": "0666", "gid": 44}])
    )
    assert result["changed"] is True
    assert pve.ct(101).config["dev1"] in ("/dev/nvidia-uvm,gid=44,mode=0666", "path=/dev/nvidia-uvm,gid=44,mode=0666")


def test_token_auth_is_refused_with_the_root_pam_explanation(pve, args):
    pve.apitokens["root@pam!ansible"] = "a3f1c9e2"
    pve.grant("audit@pve", "/", "VM.Audit")  # permissions are enforced once any grant exists
    before = dict(pve.ct(101).config)
    token_args = ct_args(args, api_token_id="ansible", api_token_secret="a3f1c9e2")
    del token_args["api_password"]
    result = run_module(MODULE, token_args)
    assert result["failed"] is True
    msg = result["msg"]
    assert "configuring device passthrough is only allowed for root@pam" in msg, msg
    assert "the API token root@pam!ansible" in msg
    assert "never as root@pam" in msg and "api_backend: local" in msg
    assert "a3f1c9e2" not in msg
    assert pve.ct(101).config == before


def test_a_vmid_that_is_a_vm_is_named_with_the_variable(pve, args):
    result = run_module(
        MODULE, args(vmid=201, type="lxc", devices=[{"path": "/dev/nvidia0"}], context="pve_guest_gpu_containers[0]")
    )
    assert result["failed"] is True
    assert result["msg"] == (
        "pve_guest_gpu_containers[0]: vmid 201 is a VM (type qemu) on node pve1, not a container; check the vmid"
    )


def test_a_vmid_that_does_not_exist(pve, args):
    result = run_module(MODULE, args(vmid=999, type="lxc", devices=[{"path": "/dev/nvidia0"}]))
    assert result["failed"] is True and "vmid 999 does not exist in the cluster" in result["msg"]


def test_a_wrong_password_says_who_could_not_log_in(pve, args):
    result = run_module(MODULE, ct_args(args, api_password="wrong"))
    assert (
        result["failed"] is True and "could not log in to the PVE API" in result["msg"] and "root@pam" in result["msg"]
    )
    assert "wrong" not in result["msg"].replace("could not", "")


# --- VM: hostpciN -------------------------------------------------------------------------------------


def test_vm_gets_every_function_of_each_gpu_as_pcie(pve, args):
    result = run_module(MODULE, vm_args(args))
    assert result["changed"] is True, result
    config = pve.vm(201).config
    assert config["hostpci0"] == "0000:41:00.0,pcie=1", "the hand-made NIC entry stays"
    assert config["hostpci1"] == "0000:01:00,pcie=1"
    assert config["hostpci2"] == "0000:81:00,pcie=1"
    for key, value in VM_CONFIG.items():
        if not key.startswith("hostpci"):
            assert str(config[key]) == str(value), key
    assert run_module(MODULE, vm_args(args))["changed"] is False


def test_an_entry_for_one_function_of_a_managed_gpu_becomes_all_functions(pve, args):
    pve.vm(201).config["hostpci3"] = "0000:01:00.0,pcie=1,x-vga=1"
    result = run_module(MODULE, vm_args(args, slots=["0000:01:00"]))
    assert result["changed"] is True
    assert pve.vm(201).config["hostpci3"] == "0000:01:00,pcie=1"
    assert "hostpci1" not in pve.vm(201).config


def test_managed_hosts_removes_a_gpu_no_longer_wanted(pve, args):
    run_module(MODULE, vm_args(args))
    result = run_module(MODULE, vm_args(args, slots=["0000:01:00"], managed_hosts=["0000:01:00", "0000:81:00"]))
    assert result["deleted"] == ["hostpci2"]
    assert "hostpci2" not in pve.vm(201).config and pve.vm(201).config["hostpci0"] == "0000:41:00.0,pcie=1"


def test_a_malformed_existing_entry_for_a_managed_gpu_is_replaced(pve, args):
    pve.vm(201).config["hostpci1"] = "0000:01:00,pcie=maybe"  # fakepve accepts it; PVE would fail at VM start
    result = run_module(MODULE, vm_args(args, slots=["0000:01:00"]))
    assert result["changed"] is True
    assert any("malformed" in str(w) and "replacing it" in str(w) for w in result.get("warnings", [])), result
    assert "hostpci1" not in pve.vm(201).config or pve.vm(201).config["hostpci1"] == "0000:01:00,pcie=1"
    assert "0000:01:00,pcie=1" in pve.vm(201).config.values()


def test_pcie_needs_a_q35_machine(pve, args):
    del pve.vm(201).config["machine"]
    result = run_module(MODULE, vm_args(args, context="pve_guest_gpu_vms[0]"))
    assert result["failed"] is True
    assert result["msg"].startswith("pve_guest_gpu_vms[0]: pcie=1 needs a q35 machine")
    assert "hostpci1" not in pve.vm(201).config


def test_a_running_vm_takes_the_entries_at_its_next_start(pve, args):
    pve.vm(201).status = "running"
    result = run_module(MODULE, vm_args(args))
    assert result["changed"] is True
    assert result["pending"] == ["hostpci1", "hostpci2"]
    again = run_module(MODULE, vm_args(args))
    assert again["changed"] is False, again["updates"]
    assert again["pending"] == ["hostpci1", "hostpci2"]


def test_a_malformed_wanted_address_fails_before_any_call(pve, args):
    calls = len(pve.requests)
    result = run_module(MODULE, vm_args(args, slots=["0000:1:00"], context="pve_guest_gpu_vms[0]"))
    assert result["failed"] is True
    assert result["msg"].startswith("pve_guest_gpu_vms[0]: hostpci[0]: '0000:1:00' is not a PCI address")
    assert len(pve.requests) == calls
