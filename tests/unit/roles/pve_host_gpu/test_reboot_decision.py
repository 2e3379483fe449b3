"""pve_host_gpu never reboots the machine that runs the play: the local_target_reason filter, and the role's
reboot decision run by ansible-playbook on this machine over ansible.builtin.local.

Nothing here can reboot this machine: the play runs reboot_decision.yml alone, which decides and reports but
holds no reboot task (the first test checks that), never reboot.yml.
"""

import json
import os
import subprocess
import sys

import pytest
import yaml
from local_target import connection_is_local, local_target_reason
from pve_testlib import ROOT

DECISION = ROOT / "roles/pve_host_gpu/tasks/reboot_decision.yml"
BOOT_ID = "0f5c7e4e-8d0a-4c55-9d8e-3a1f2b7c6d54"


# Task keywords the decision file uses; every other key of a task names its module.
KEYWORDS = {"name", "vars", "when", "register", "failed_when", "changed_when", "check_mode", "loop", "loop_control"}
READ_ONLY = {"ansible.builtin.slurp", "ansible.builtin.set_fact", "ansible.builtin.debug"}


def test_the_decision_file_only_reads_and_decides():
    tasks = yaml.safe_load(DECISION.read_text())
    modules = {key for task in tasks for key in task if key not in KEYWORDS}
    assert modules <= READ_ONLY, f"{DECISION.name} may not reboot, run commands or include: {modules - READ_ONLY}"


@pytest.mark.parametrize(
    "connection",
    [
        "local",
        "ansible.builtin.local",
        "ansible.legacy.local",
        "chroot",
        "community.general.chroot",
        "ansible.legacy.chroot",
        " Ansible.Builtin.Local ",
    ],
)
def test_every_spelling_of_a_local_connection_is_local(connection):
    assert connection_is_local(connection)
    assert f"the connection {connection} runs the tasks on the controller itself" == local_target_reason(connection)


@pytest.mark.parametrize("connection", ["ssh", "ansible.builtin.ssh", "paramiko", "containers.podman.podman", "", None])
def test_remote_connections_are_not_local(connection):
    assert not connection_is_local(connection)
    assert local_target_reason(connection, "pve1.example.org", BOOT_ID, BOOT_ID.replace("0f", "1e")) == ""


@pytest.mark.parametrize("address", ["localhost", "LOCALHOST", "127.0.0.1", "127.0.1.1", "::1", "[::1]"])
def test_a_loopback_address_is_the_controller(address):
    assert local_target_reason("ssh", address) == f"the host address {address} is the controller itself"


def test_the_controllers_own_kernel_is_the_controller():
    assert local_target_reason("ssh", "192.0.2.10", BOOT_ID + "\n", BOOT_ID) == (
        f"the host runs the controller's own kernel (boot id {BOOT_ID})"
    )
    # An unreadable boot id on either side proves nothing.
    assert local_target_reason("ssh", "192.0.2.10", "", "") == ""


def test_a_reboot_over_ansible_builtin_local_is_refused_with_the_reason(tmp_path):
    marker = tmp_path / "reboot-required"
    marker.write_text("# reasons since the last boot\nNVIDIA driver 590.48.01 installed\n")
    # Not "localhost": the host name must not give the connection away.
    inventory = {
        "all": {
            "hosts": {
                "pve-under-test": {
                    "ansible_connection": "ansible.builtin.local",
                    "ansible_python_interpreter": sys.executable,
                }
            }
        }
    }
    play = [
        {
            "name": "Decide on a reboot the inventory allows",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Run the role's reboot decision",
                    "ansible.builtin.include_role": {"name": "pve_host_gpu", "tasks_from": "reboot_decision"},
                    "vars": {
                        "pve_host_gpu_reboot": True,
                        "pve_host_gpu_reboot_marker": str(marker),
                        "__pve_host_gpu_live": True,
                        "__pve_host_gpu_state_reasons": ["the running kernel command line lacks iommu=pt"],
                    },
                }
            ],
        }
    ]
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_FORCE_COLOR": "0"}
    argv = ["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    tasks = json.loads(proc.stdout)["plays"][0]["tasks"]
    # Task names as the json callback gives them: "pve_host_gpu : reboot_decision | ...".
    results = {t["task"]["name"].split(" : ", 1)[-1]: t["hosts"]["pve-under-test"] for t in tasks}
    assert not [name for name in results if name.startswith("reboot |")], "only the decision ran"

    decision = results["reboot_decision | Decide whether to reboot now"]["ansible_facts"]
    assert decision["__pve_host_gpu_reboot_now"] is False
    assert decision["__pve_host_gpu_local_reason"].startswith("the connection ansible.builtin.local ")

    report = results["reboot_decision | Report that a reboot is required"]["msg"]
    assert report[0] == "REBOOT REQUIRED on pve-under-test (pve_host_gpu_reboot is True, kernel access full):"
    assert report[1:3] == ["NVIDIA driver 590.48.01 installed", "the running kernel command line lacks iommu=pt"]
    assert report[3] == (
        "Not rebooting although pve_host_gpu_reboot is true: the connection ansible.builtin.local runs the tasks "
        "on the controller itself, and a reboot would stop the play halfway. Reboot pve-under-test by hand, or "
        "run the play from another machine."
    )
