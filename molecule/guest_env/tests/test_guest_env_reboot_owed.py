"""The VM's reboot into its installed driver, owed until it is done.

The converge installed the driver 590.48.01 in the VM (the trixie instance) without rebooting it
(nvidia_userspace_reboot is false). A container has no nvidia module of its own: the test mounts a tmpfs over
/sys/module and writes the module's version where the kernel shows it, /sys/module/nvidia/version, the path
the role reads. A later run with another module loaded must say that a reboot is owed (and every run after
it, until the reboot), a --check run with nvidia_userspace_reboot true reports the reboot as a change
without rebooting, and once the installed driver is the loaded one nothing is owed. It runs after
test_guest_env_driver_change.py (file order), on the driver the converge left.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from molecule_play import ROOT, instances, machine

SCENARIO = Path(__file__).resolve().parents[1]
PIN, OLD = "590.48.01", "580.126.09"
VERSION = "/sys/module/nvidia/version"


def run(host, *extra):
    """driver_change.yml at the converge's pin on the VM: {task name: the VM's result} of the run, which must
    succeed; the JSON callback, so that each task's result can be read."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    argv = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], "--limit", host, *extra]
    argv += ["-e", f"nvidia_userspace_version={PIN}", "-e", f"nvidia_userspace_host_driver_version={PIN}"]
    argv.append(str(SCENARIO / "driver_change.yml"))
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    # "nvidia_userspace : verify | ...": the task's name without its role
    tasks = {
        t["task"]["name"].split(" : ", 1)[-1]: t["hosts"][host]
        for play in out["plays"]
        for t in play["tasks"]
        if host in t["hosts"]
    }
    return {"tasks": tasks, "changed": out["stats"][host]["changed"]}


def boot_id(vm):
    return vm.check_output("cat /proc/sys/kernel/random/boot_id")


def load(vm, version):
    """Stand in the module the VM's kernel has loaded."""
    vm.run_expect([0], f"mkdir -p /sys/module/nvidia && echo {version} > {VERSION}")


def owed_message(result):
    report = result["tasks"].get("verify | Report the reboot the VM owes")
    return "" if not report or report.get("skipped") else report["msg"]


@pytest.fixture(scope="module")
def seen(request):
    vm_name = next(h for h in instances(request) if h.endswith("-trixie"))
    vm = machine(vm_name)
    vm.run_expect([0], "mountpoint -q /sys/module || mount -t tmpfs inferhost-standin-module /sys/module")
    try:
        steps = {"boot": boot_id(vm)}
        load(vm, OLD)
        steps["later"] = run(vm_name)
        steps["again"] = run(vm_name)
        steps["check_reboot"] = run(vm_name, "--check", "-e", '{"nvidia_userspace_reboot": true}')
        steps["boot_after_check"] = boot_id(vm)
        load(vm, PIN)  # as after the reboot
        steps["rebooted"] = run(vm_name)
        steps["rebooted_check"] = run(vm_name, "--check", "-e", '{"nvidia_userspace_reboot": true}')
    finally:
        vm.run("umount /sys/module")
    return steps


def test_a_later_run_says_the_vm_owes_a_reboot_into_the_installed_driver(seen):
    for step in ("later", "again"):
        message = owed_message(seen[step])
        assert message.startswith("REBOOT REQUIRED"), (step, seen[step]["tasks"].keys())
        assert f"the driver {PIN} is installed" in message and f"the loaded kernel module is {OLD}" in message
        assert seen[step]["changed"] == 0


def test_check_mode_reports_the_reboot_as_a_change_and_does_not_reboot(seen):
    reboot = seen["check_reboot"]["tasks"]["verify | Reboot the VM into the installed driver"]
    assert reboot["changed"] is True and not reboot.get("skipped")
    assert seen["boot_after_check"] == seen["boot"]
    handler = seen["check_reboot"]["tasks"].get("Reboot the VM to load the new driver", {"skipped": True})
    assert handler.get("skipped", True), "the handler must not reboot a second time"


def test_once_the_installed_driver_is_loaded_nothing_is_owed(seen):
    for step in ("rebooted", "rebooted_check"):
        assert owed_message(seen[step]) == ""
        assert seen[step]["tasks"]["verify | Reboot the VM into the installed driver"].get("skipped") is True
        assert seen[step]["changed"] == 0
