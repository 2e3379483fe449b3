"""The Ansible front ends (module and playbooks/gpu_switch.yml) through real ansible-playbook runs on localhost,
against fakepve and the kernel model served over FUSE (Env.serve): check mode plans without changing,
a run moves, a second run changes nothing, a bad -e value fails before any change, the password stays hidden."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from gpu_switch_env import ROOT, Env


@pytest.fixture
def setup(fakepve, fakepve_cafile, tmp_path, monkeypatch):
    env = Env(fakepve, fakepve_cafile, tmp_path)
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    _, environ = env.serve(config_dir / "config.yml")
    for name in ("PATH", "INFERHOST_SIM_HOST_STATE"):  # the module starts the stand-in systemctl
        monkeypatch.setenv(name, environ[name])
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "children": {
                        "pve_hosts": {
                            "hosts": {
                                "localhost": {
                                    "ansible_connection": "local",
                                    "ansible_python_interpreter": sys.executable,
                                }
                            }
                        }
                    }
                }
            }
        )
    )
    yield env, str(inventory), str(config_dir)
    env.close()


def playbook(inventory, *args):
    environ = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_NOCOLOR": "1",
    }
    proc = subprocess.run(
        ["ansible-playbook", "-i", inventory, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=environ,
        check=False,
    )
    return proc


def task_result(proc, name):
    text = proc.stdout
    data = json.loads(text[text.index("\n{\n") + 1 :] if not text.startswith("{") else text)
    for play in data["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == name:
                return task["hosts"]["localhost"]
    raise AssertionError(f"no task {name!r} in {proc.stdout[-2000:]}")


MOVE = "Move the GPUs to the requested guest"


def test_playbook_check_mode_then_move_then_no_change(setup):
    env, inventory, config_dir = setup
    args = ["playbooks/gpu_switch.yml", "-e", "gpu_switch_to=vm", "-e", f"gpu_switch_config_dir={config_dir}"]
    proc = playbook(inventory, *args, "--check", "--diff")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    result = task_result(proc, MOVE)
    assert result["changed"] is True and result["dry_run"] is True
    assert [s["state"] for s in result["steps"]] == ["planned"] * len(result["steps"])
    assert set(result["diff"]["after"]["drivers"].values()) == {"vfio-pci"}
    assert set(env.drivers().values()) == {"nvidia", "snd_hda_intel"} and env.ct.status == "running"

    proc = playbook(inventory, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    result = task_result(proc, MOVE)
    assert result["changed"] is True and result["owner"] == "vm"
    assert set(env.drivers().values()) == {"vfio-pci"} and env.vm.status == "running"

    proc = playbook(inventory, *args)
    assert proc.returncode == 0
    assert task_result(proc, MOVE)["changed"] is False


def test_a_bad_side_fails_before_any_change(setup):
    env, inventory, config_dir = setup
    proc = playbook(
        inventory,
        "playbooks/gpu_switch.yml",
        "-e",
        "gpu_switch_to=sideways",
        "-e",
        f"gpu_switch_config_dir={config_dir}",
    )
    assert proc.returncode != 0
    assert "Pass -e gpu_switch_to=vm or -e gpu_switch_to=ct (got sideways)" in proc.stdout
    assert MOVE not in proc.stdout
    assert env.kernel.writes == [] and env.pve.tasklog == []


def test_a_misspelt_parameter_fails_before_any_change(setup):
    """The move runs no role, so no role variable is required; a misspelt name is still refused."""
    env, inventory, config_dir = setup
    proc = playbook(
        inventory,
        "playbooks/gpu_switch.yml",
        "-e",
        "gpu_switch_to=vm",
        "-e",
        "gpu_switch_froce=true",
        "-e",
        f"gpu_switch_config_dir={config_dir}",
    )
    assert proc.returncode != 0
    assert "gpu_switch_froce" in proc.stdout and "rename it to gpu_switch_force" in proc.stdout
    assert MOVE not in proc.stdout
    assert env.kernel.writes == [] and env.pve.tasklog == []


def test_module_failure_carries_the_reason_and_hides_the_password(setup):
    env, inventory, config_dir = setup
    env.vm.start_error = "QEMU exited with code 1"
    task = {
        "hosts": "pve_hosts",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Move",
                "gpu_switch": {"command": "to-vm", "config": f"{config_dir}/config.yml", "proxmox_password": "secret"},
            }
        ],
    }
    play = env.tmp / "play.yml"
    play.write_text(json.dumps([task]))
    proc = playbook(inventory, str(play), "-vvv")
    assert proc.returncode != 0
    result = task_result(proc, "Move")
    assert result["rc"] == 1 and result["rolled_back"] is True
    assert result["msg"].startswith("to-vm failed and was rolled back: start VM 201: task failed: QEMU exited")
    assert "secret" not in proc.stdout.replace("password_file", "") and env.owner_consistent()


def test_module_attaches_the_hookscripts_idempotently(setup):
    env, inventory, config_dir = setup
    task = {
        "hosts": "pve_hosts",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Hooks",
                "gpu_switch": {
                    "command": "hookscripts",
                    "config": f"{config_dir}/config.yml",
                    "hookscript": "local:snippets/gpu-switch-hook.py",
                },
            }
        ],
    }
    play = env.tmp / "hooks.yml"
    play.write_text(json.dumps([task]))
    first = task_result(playbook(inventory, str(play)), "Hooks")
    assert first["changed"] is True and len(first["changes"]) == 3
    assert "snippets" in env.pve.storages["local"]["content"]
    assert env.ct.config["hookscript"] == env.vm.config["hookscript"] == "local:snippets/gpu-switch-hook.py"
    assert task_result(playbook(inventory, str(play)), "Hooks")["changed"] is False
