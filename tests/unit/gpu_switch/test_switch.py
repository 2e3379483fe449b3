"""The move: idempotence, whole GPUs and groups, holders, hung writes, rollback, lock, dry run, JSON."""

from __future__ import annotations

import json
import os

import pytest
from gpu_switch import cli
from gpu_switch.errors import EXIT_OK, EXIT_ROLLED_BACK, EXIT_STRANDED, ApiError, Refused
from gpu_switch.journal import HostLock
from gpu_switch_rig import CT, NODES_OF_TWO_GPUS, VM


def mutations(api):
    return [c for c in api.calls if c[0] in ("set_config", "shutdown", "stop", "start")]


def test_round_trip_ct_vm_ct(rig):
    original = rig.drivers()
    out = rig.switcher().move("vm")
    assert out.exit_code == EXIT_OK, out.reason
    assert set(rig.drivers().values()) == {"vfio-pci"}
    assert out.result["owner"] == "vm" and out.result["changed"] is True
    assert out.result["vm"]["status"] == "running" and out.result["container"]["status"] == "stopped"
    assert out.result["vm"]["config"] == {"hostpci0": "0000:01:00,pcie=1", "hostpci1": "0000:02:00,pcie=1"}
    assert rig.host.active == {"nvidia-persistenced.service"}
    out = rig.switcher().move("ct")
    assert out.exit_code == EXIT_OK, out.reason
    assert rig.drivers() == original
    assert out.result["owner"] == "ct"
    assert out.result["container"]["status"] == "running" and out.result["vm"]["status"] == "stopped"
    # The GPU keeps an override for its host driver, so a stray VM start cannot take it from the container.
    assert rig.kernel.override_of(rig.addresses[0]) == "nvidia"
    assert rig.kernel.override_of("0000:01:00.1") is None
    assert not os.path.exists(rig.config.journal_path)
    assert not any("new_id" in path or "/bind" in path for path, _ in rig.kernel.writes)


@pytest.mark.parametrize("target", ["ct", "vm"])
def test_asking_for_where_the_gpus_are_changes_nothing(make_rig, target):
    rig = make_rig(owner=target)
    writes, calls = len(rig.kernel.writes), len(mutations(rig.api))
    out = rig.switcher().move(target)
    assert out.exit_code == EXIT_OK
    assert out.result["changed"] is False and out.result["steps"] == []
    assert len(rig.kernel.writes) == writes and len(mutations(rig.api)) == calls
    assert rig.host.calls == [["systemctl", "is-active", "--quiet", "nvidia-persistenced.service"]]


def test_second_move_is_a_no_op(rig):
    assert rig.switcher().move("vm").exit_code == EXIT_OK
    writes = len(rig.kernel.writes)
    again = rig.switcher().move("vm")
    assert again.result["changed"] is False and len(rig.kernel.writes) == writes


def test_a_stopped_receiver_with_gpus_already_bound_is_only_started(make_rig):
    rig = make_rig(owner="vm")
    rig.api.guests[("qemu", VM)]["status"] = "stopped"
    out = rig.switcher().move("vm")
    assert [s["name"] for s in out.result["steps"]] == ["start-guest"]
    assert out.result["vm"]["status"] == "running" and out.result["changed"] is True


def test_every_function_of_a_gpu_moves_with_it(make_rig):
    rig = make_rig(gpus=2, functions=4)
    out = rig.switcher().move("vm")
    assert out.exit_code == EXIT_OK, out.reason
    assert all(d == "vfio-pci" for d in rig.drivers().values())
    assert len(out.result["gpus"][0]["functions"]) == 4
    out = rig.switcher().move("ct")
    assert out.exit_code == EXIT_OK, out.reason
    assert rig.drivers()["0000:01:00.2"] == "xhci_hcd" and rig.drivers()["0000:01:00.3"] is None


def test_a_mixed_iommu_group_is_refused_with_the_reason(rig):
    rig.kernel.add_device(
        "0000:05:00.0", vendor="0x1b21", pci_class="0x0c0330", group=2, native="xhci_hcd", driver="xhci_hcd"
    )
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "IOMMU group 2 of GPU 0000:02:00.0 also holds 0000:05:00.0 (class 0x0c0330, driver xhci_hcd)" in out.reason
    assert "moves to the VM whole or not at all" in out.reason
    assert rig.kernel.writes == [] and mutations(rig.api) == []
    assert out.result["rolled_back"] is True and out.result["owner"] == "ct"


def test_no_iommu_is_refused(rig):
    for group in os.listdir(os.path.join(rig.sysfs, "kernel", "iommu_groups")):
        os.rename(os.path.join(rig.sysfs, "kernel", "iommu_groups", group), os.path.join(rig.tmp, "g" + group))
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK and "the IOMMU is off" in out.reason


def test_holders_outside_the_container_refuse_before_any_change(rig):
    rig.add_process(4242, "/usr/bin/python3 train.py", fds=["/dev/nvidia1"])
    rig.add_process(4243, "python3 in-ct", fds=["/dev/nvidia0"], cgroup="0::/lxc/101/ns/init.scope\n")
    rig.add_process(77, "/usr/bin/nvidia-persistenced", fds=["/dev/nvidiactl"])
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "pid 4242 (/usr/bin/python3 train.py) holds /dev/nvidia1" in out.reason
    assert "4243" not in out.reason and "pid 77" not in out.reason
    assert rig.kernel.writes == [] and mutations(rig.api) == []
    assert out.result["holders"] == [{"pid": 4242, "command": "/usr/bin/python3 train.py", "path": "/dev/nvidia1"}]


def test_holders_left_after_the_guest_stopped_roll_back_and_are_reported(rig):
    def leftover(step):
        if step.name == "stop-service":
            rig.add_process(5150, "/usr/bin/dcgm-exporter --port 9400", fds=["/dev/nvidia0"])

    out = cli.run("to-vm", rig.switcher(after_step=leftover))
    assert out.exit_code == EXIT_ROLLED_BACK
    assert out.result["holders"] == [
        {"pid": 5150, "command": "/usr/bin/dcgm-exporter --port 9400", "path": "/dev/nvidia0"}
    ]
    assert out.result["rolled_back"] is True
    assert rig.api.status("lxc", CT) == "running"
    assert rig.host.active == {"nvidia-persistenced.service"}
    assert set(rig.drivers().values()) == {"nvidia", "snd_hda_intel"}


def test_a_process_holding_a_gpu_through_vfio_stops_the_move_back_to_the_container(make_rig):
    rig = make_rig(owner="vm")
    before = rig.drivers()

    def lingering_qemu(step):
        # The VM's task ended but a process still has GPU 2's VFIO group open: its unbind would block.
        if step.name == "stop-guest":
            rig.add_process(6060, "/usr/bin/kvm -id 999", fds=["/dev/vfio/vfio", "/dev/vfio/2", "/dev/nvidia9"])

    out = cli.run("to-ct", rig.switcher(after_step=lingering_qemu))
    assert out.exit_code == EXIT_ROLLED_BACK
    assert out.result["holders"] == [{"pid": 6060, "command": "/usr/bin/kvm -id 999", "path": "/dev/vfio/2"}]
    assert "check-holders" in [s["name"] for s in out.result["steps"]]
    assert rig.drivers() == before and rig.api.status("qemu", VM) == "running"


def test_another_host_driver_leaves_the_container_config_alone(make_rig):
    # A stand-in host driver (the real-kernel tests use an e1000) has no /dev/nvidia* nodes for devN entries.
    rig = make_rig(owner="vm", gpus=1, functions=1, drivers={"host": "e1000", "passthrough": "vfio-pci"})
    rig.kernel.add_driver("e1000")
    out = rig.switcher().move("ct")
    assert out.exit_code == EXIT_OK, out.reason
    assert rig.drivers() == {rig.addresses[0]: "e1000"} and out.result["owner"] == "ct"
    assert [c for c in rig.api.calls if c[0] == "set_config"] == []
    assert "device-nodes" not in [s["name"] for s in out.result["steps"]]
    assert rig.api.status("lxc", CT) == "running"


def test_a_hung_write_marks_the_gpu_needs_reboot_and_exits_3(rig):
    rig.kernel.hang("bus/pci/drivers/nvidia/unbind", "0000:02:00.0")
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_STRANDED
    assert out.result["needs_reboot"] == ["0000:02:00.0"]
    assert out.result["rolled_back"] is False
    assert "0000:02:00.0 needs a host reboot" in out.reason and "NOT fully rolled back" in out.reason
    # The other GPU went back; nothing that would open the stuck GPU was started again.
    assert rig.drivers()["0000:01:00.0"] == "nvidia" and rig.drivers()["0000:01:00.1"] == "snd_hda_intel"
    assert rig.api.status("lxc", CT) == "stopped" and rig.host.active == set()
    states = {s.get("address"): s["state"] for s in out.result["steps"] if s["name"] == "rebind"}
    assert states == {"0000:01:00.0": "undone", "0000:02:00.0": "hung"}
    # The journal keeps the mark: no new move, and recover says reboot, until the boot id changes.
    again = cli.run("to-ct", rig.switcher())
    assert again.exit_code == EXIT_ROLLED_BACK and "run gpu-switch recover first" in again.reason
    same_boot = rig.switcher().recover()
    assert same_boot.exit_code == EXIT_STRANDED and "needs a host reboot" in same_boot.reason
    rig.kernel.reboot("22222222-0000-0000-0000-000000000000")
    rig.api.guests[("lxc", CT)]["status"] = "stopped"
    after = rig.switcher().recover()
    assert after.exit_code == EXIT_OK, after.reason
    assert after.result["recovery"]["decision"] == "undo" and after.result["recovery"]["same_boot"] is False
    assert after.result["owner"] == "ct" and rig.api.status("lxc", CT) == "running"
    assert rig.host.active == {"nvidia-persistenced.service"}
    assert not os.path.exists(rig.config.journal_path)


def test_failure_mid_move_rolls_back_to_where_the_gpus_were(rig):
    before = {b: (rig.kernel.driver_of(b), rig.kernel.override_of(b)) for b in rig.functions()}
    vm_config = dict(rig.api.guests[("qemu", VM)]["config"])
    rig.api.fail_start[("qemu", VM)] = "start failed: QEMU exited with code 1"
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK
    assert out.result["rolled_back"] is True
    assert "start VM 201: task failed: start failed: QEMU exited with code 1" in out.result["error"]
    assert out.reason.startswith("to-vm failed and was rolled back")
    assert {b: (rig.kernel.driver_of(b), rig.kernel.override_of(b)) for b in rig.functions()} == before
    assert rig.api.guests[("qemu", VM)]["config"] == vm_config  # the hostpci entries were taken out again
    assert rig.api.status("lxc", CT) == "running" and rig.api.status("qemu", VM) == "stopped"
    assert rig.host.active == {"nvidia-persistenced.service"}
    assert [s["state"] for s in out.result["steps"]] == [
        "undone",
        "undone",
        "done",
        "undone",
        "undone",
        "undone",
        "undone",
        "undone",
    ]
    assert not os.path.exists(rig.config.journal_path)


def test_a_rebind_failure_on_the_second_gpu_rolls_back_the_first(rig):
    # The second GPU's audio function will not bind to vfio-pci.
    rig.kernel.meta["devices"]["0000:02:00.1"]["native"] = "snd_hda_intel"
    rig.kernel._save()
    original = rig.kernel._apply

    def refuse(rel, real, value):
        if rel.endswith("drivers_probe") and value == "0000:02:00.1" and rig.kernel.override_of(value) == "vfio-pci":
            return None  # the probe "succeeds" and binds nothing, as with a missing driver
        return original(rel, real, value)

    rig.kernel._apply = refuse
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "0000:02:00.1: bound to no driver after drivers_probe, expected vfio-pci" in out.reason
    assert set(rig.drivers().values()) == {"nvidia", "snd_hda_intel"}
    assert rig.api.status("lxc", CT) == "running"


def test_an_undo_that_fails_exits_3_and_says_what_to_do(rig):
    rig.api.fail_start[("qemu", VM)] = "boom"

    def api_down(step):
        if step.name == "guest-config":
            rig.api.fail_start[("lxc", CT)] = "CT start failed"

    out = cli.run("to-vm", rig.switcher(after_step=api_down))
    assert out.exit_code == EXIT_STRANDED
    assert "undo stop-guest" in out.reason and "run gpu-switch recover" in out.reason
    assert out.result["rolled_back"] is False
    assert os.path.exists(rig.config.journal_path)
    rig.api.fail_start.clear()
    fixed = rig.switcher().recover()
    assert fixed.exit_code == EXIT_OK, fixed.reason
    assert fixed.result["owner"] == "ct" and rig.api.status("lxc", CT) == "running"


def test_the_lock_refuses_a_concurrent_move(rig):
    with HostLock(rig.config.lock_path):
        out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK and "another gpu-switch is running" in out.reason
    assert rig.kernel.writes == []

    seen = []

    def second(step):
        if step.name == "rebind" and not seen:
            seen.append(cli.run("to-ct", rig.switcher()))

    assert rig.switcher(after_step=second).move("vm").exit_code == EXIT_OK
    assert seen[0].exit_code == EXIT_ROLLED_BACK and "another gpu-switch is running" in seen[0].reason


def test_status_reports_the_lock_and_the_state(rig):
    with HostLock(rig.config.lock_path):
        out = rig.switcher().status()
    assert out.result["busy"] is True and out.result["owner"] == "ct"


def test_dry_run_changes_nothing(rig):
    out = rig.switcher().move("vm", dry_run=True)
    assert out.exit_code == EXIT_OK
    assert rig.kernel.writes == [] and mutations(rig.api) == [] and rig.host.active == {"nvidia-persistenced.service"}
    assert out.result["dry_run"] is True and out.result["changed"] is False and out.result["would_change"] is True
    assert [s["name"] for s in out.result["steps"]] == [
        "stop-guest",
        "stop-service",
        "check-holders",
        "rebind",
        "rebind",
        "start-service",
        "guest-config",
        "start-guest",
    ]
    assert all(s["state"] == "planned" for s in out.result["steps"])
    assert not os.path.exists(rig.config.journal_path) and not os.path.exists(rig.config.lock_path)


def test_slow_shutdown_refuses_without_force_and_stops_with_it(rig):
    rig.api.slow_shutdown.add(("lxc", CT))
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "CT 101 did not shut down within 120 s (container did not stop)" in out.reason
    assert "--force" in out.reason
    assert rig.kernel.writes == [] and rig.api.status("lxc", CT) == "running"
    out = rig.switcher().move("vm", force=True, shutdown_timeout=5)
    assert out.exit_code == EXIT_OK, out.reason
    assert ("stop", "lxc", CT, {}) in rig.api.calls
    assert ("shutdown", "lxc", CT, {"timeout": 5}) in rig.api.calls


def test_a_running_receiver_without_the_gpus_is_refused(rig):
    rig.api.guests[("qemu", VM)]["status"] = "running"
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK and "VM 201 is running without the GPUs" in out.reason
    assert rig.kernel.writes == []


def test_an_api_token_is_refused_before_any_change_with_the_root_pam_reason(make_rig):
    rig = make_rig(proxmox={"node": "pve1", "password_file": "/tmp/x", "token_name": "gpuswitch"})
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "only for root@pam" in out.reason and "the API token root@pam!gpuswitch is not root@pam" in out.reason
    assert rig.kernel.writes == []


def test_a_403_from_proxmox_is_explained_and_rolled_back(rig):
    rig.api.fail_set_config[("qemu", VM)] = ApiError("update the config of VM 201: Permission check failed", 403)
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "Permission check failed" in out.reason and "only for root@pam" in out.reason
    assert set(rig.drivers().values()) == {"nvidia", "snd_hda_intel"}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"hostpci0": "0000:01:00;junk,pcie=1"}, "VM 201 hostpci0 is malformed"),
        ({"hostpci3": "host=0000:01:00.0,pcie=1"}, "hostpci3 passes only some functions of GPU 0000:01:00.0"),
        ({"machine": "pc-i440fx-9.0"}, "needs q35"),
    ],
)
def test_vm_config_problems_refuse_before_any_change(rig, config, message):
    rig.api.guests[("qemu", VM)]["config"].update(config)
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK and message in out.reason
    assert rig.kernel.writes == []


def test_existing_vm_entries_are_kept_and_only_missing_ones_added(rig):
    rig.api.guests[("qemu", VM)]["config"].update(
        {"hostpci0": "0000:01:00,pcie=1,x-vga=1", "net0": "virtio,bridge=vmbr0"}
    )
    assert rig.switcher().move("vm").exit_code == EXIT_OK
    config = rig.api.guests[("qemu", VM)]["config"]
    assert config["hostpci0"] == "0000:01:00,pcie=1,x-vga=1" and config["hostpci1"] == "0000:02:00,pcie=1"
    assert config["net0"] == "virtio,bridge=vmbr0" and config["scsi0"] == "local-lvm:vm-201-disk-0"


def test_container_gets_every_nvidia_node_and_keeps_its_other_lines(make_rig):
    rig = make_rig(owner="vm")
    rig.make_node("nvidia-caps/nvidia-cap1")
    rig.make_node("dri/renderD128")
    rig.api.guests[("lxc", CT)]["config"].update({"dev0": "/dev/dri/renderD128", "mp0": "/srv/models,mp=/models"})
    out = rig.switcher().move("ct")
    assert out.exit_code == EXIT_OK, out.reason
    config = rig.api.guests[("lxc", CT)]["config"]
    assert config["dev0"] == "/dev/dri/renderD128" and config["mp0"] == "/srv/models,mp=/models"
    assert sorted(v for k, v in config.items() if k.startswith("dev") and "nvidia" in v) == sorted(NODES_OF_TWO_GPUS)
    assert ["nvidia-modprobe", "-c", "0"] in rig.host.calls and ["nvidia-modprobe", "-u", "-c", "0"] in rig.host.calls
    before = dict(config)
    rig.api.guests[("lxc", CT)]["status"] = "stopped"
    again = rig.switcher().move("ct")
    assert rig.api.guests[("lxc", CT)]["config"] == before
    assert [s["name"] for s in again.result["steps"]] == ["start-guest"]


def test_parallel_rebinding_gives_the_same_result(make_rig):
    rig = make_rig(gpus=8, parallel=True)
    out = rig.switcher().move("vm")
    assert out.exit_code == EXIT_OK, out.reason
    assert set(rig.drivers().values()) == {"vfio-pci"}
    assert rig.switcher().move("ct").exit_code == EXIT_OK
    assert set(rig.drivers().values()) == {"nvidia", "snd_hda_intel"}


def test_parallel_hang_marks_only_the_stuck_gpu(make_rig):
    rig = make_rig(gpus=4, parallel=True)
    rig.kernel.hang("bus/pci/drivers/nvidia/unbind", "0000:03:00.0")
    out = cli.run("to-vm", rig.switcher())
    assert out.exit_code == EXIT_STRANDED and out.result["needs_reboot"] == ["0000:03:00.0"]
    others = {b: d for b, d in rig.drivers().items() if not b.startswith("0000:03")}
    assert set(others.values()) == {"nvidia", "snd_hda_intel"}


def test_status_with_the_api_down_still_shows_the_gpus(rig):
    rig.api.down = True
    out = cli.run("status", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK and "unreachable" in out.reason
    assert out.result["owner"] == "ct" and len(out.result["gpus"]) == 2
    assert out.result["container"]["status"] == "unknown"


def test_json_output_has_the_contract_shape(rig, tmp_path):
    code, out, err = rig.cli("--json", "to-vm")
    assert code == EXIT_OK and err == ""
    result = json.loads(out)
    assert {"owner", "gpus", "container", "vm", "changed", "steps"} <= set(result)
    assert result["owner"] == "vm" and result["changed"] is True
    gpu = result["gpus"][0]
    assert set(gpu) == {"address", "iommu_group", "numa_node", "functions"}
    assert gpu["functions"][0] == {"address": "0000:01:00.0", "driver": "vfio-pci"}
    assert set(result["vm"]) == {"vmid", "status", "config"} and result["vm"]["vmid"] == VM
    assert result["container"]["config"]["dev0"] == "/dev/nvidia0"
    assert all({"name", "detail", "state"} <= set(s) for s in result["steps"])
    # A failure adds error and rolled_back, and the reason is the last line on stderr.
    rig.api.fail_start[("lxc", CT)] = "boom"
    code, out, err = rig.cli("--json", "to-ct")
    result = json.loads(out)
    assert code == EXIT_ROLLED_BACK and result["rolled_back"] is True and "boom" in result["error"]
    assert err.splitlines()[-1].startswith("gpu-switch: to-ct failed and was rolled back")


def test_text_output_lists_gpus_guests_and_steps(rig):
    code, text, _ = rig.cli("to-vm", "--dry-run")
    assert code == EXIT_OK
    assert "owner: ct" in text and "gpu 0000:01:00.0  iommu group 1  numa 0" in text
    assert "container 101: running" in text and "planned" in text and "dry run: nothing was changed" in text


def _mapping(mid, slot, node="pve1"):
    return {"id": mid, "map": [f"node={node},path={slot},id=10de:2bb5,subsystem-id=10de:204b,iommugroup=1"]}


def test_an_entry_naming_a_mapping_of_the_gpu_is_kept_and_no_raw_one_added(rig):
    rig.api.mappings = [_mapping("gpu-a", "0000:01:00"), _mapping("gpu-b", "0000:02:00", node="pve2")]
    rig.api.guests[("qemu", VM)]["config"]["hostpci0"] = "mapping=gpu-a,pcie=1"
    assert rig.switcher().move("vm").exit_code == EXIT_OK
    config = rig.api.guests[("qemu", VM)]["config"]
    # gpu-b maps the second GPU on another node only: this node's VM gets it raw (root@pam).
    assert config["hostpci0"] == "mapping=gpu-a,pcie=1" and config["hostpci1"] == "0000:02:00,pcie=1"
    assert "hostpci2" not in config


def test_a_token_adds_the_gpus_by_their_mappings(make_rig):
    rig = make_rig(proxmox={"node": "pve1", "password_file": "/dev/null", "token_name": "gpus", "user": "gs@pve"})
    rig.api.mappings = [_mapping("gpu-a", "0000:01:00"), _mapping("gpu-b", "0000:02:00")]
    assert rig.switcher().move("vm").exit_code == EXIT_OK
    config = rig.api.guests[("qemu", VM)]["config"]
    assert (config["hostpci0"], config["hostpci1"]) == ("mapping=gpu-a,pcie=1", "mapping=gpu-b,pcie=1")
    # Back to the container and to the VM again: the mapped entries pass the GPUs, nothing is added twice.
    assert rig.switcher().move("ct").exit_code == EXIT_OK
    assert rig.switcher().move("vm").exit_code == EXIT_OK
    assert sorted(k for k in rig.api.guests[("qemu", VM)]["config"] if k.startswith("hostpci")) == [
        "hostpci0",
        "hostpci1",
    ]


def test_a_token_without_a_mapping_of_the_gpu_is_refused_before_any_change(make_rig):
    rig = make_rig(proxmox={"node": "pve1", "password_file": "/dev/null", "token_name": "gpus", "user": "gs@pve"})
    rig.api.mappings = [_mapping("gpu-a", "0000:01:00")]
    with pytest.raises(Refused) as refused:
        rig.switcher().move("vm")
    assert "(0000:02:00,pcie=1)" in str(refused.value) and "root@pam" in str(refused.value)
    assert "mapping=gpu-a" not in str(refused.value), "the GPU with a mapping is not what is refused"
    assert rig.kernel.writes == []
