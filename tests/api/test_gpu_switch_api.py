"""gpu-switch against fakepve: real HTTPS with the fake's CA, real proxmoxer, PVE's schema and task model.

The host side is the kernel model of the simulation wing (inferhost.sim), served over FUSE to the real
command; the Proxmox side is fakepve, which answers like
PVE 9 (UPIDs, config locks, TASK ERROR, root@pam-only devN) and injects faults. Every fault ends either done
or rolled back, never stranded; a killed process (SIGKILL after each sysfs write) is recovered by
`gpu-switch recover`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_switch.errors import EXIT_OK, EXIT_ROLLED_BACK, ApiError
from gpu_switch.pve import PveApi
from gpu_switch_env import CT, ROOT, VM, Env

from inferhost.sim.gpu_host import FakeHost
from inferhost.sim.gpu_kernel import FakeKernel


@pytest.fixture
def make_env(fakepve, fakepve_cafile, tmp_path):
    """Env(**kwargs) on this test's fakepve; whatever it serves is stopped after the test."""
    made = []

    def make(**kwargs):
        made.append(Env(fakepve, fakepve_cafile, tmp_path, **kwargs))
        return made[-1]

    yield make
    for env in made:
        env.close()


@pytest.fixture
def env(make_env):
    return make_env()


def without_digest(config):
    return {k: v for k, v in config.items() if k != "digest"}


def test_round_trip_ct_vm_ct_with_8_gpus_of_2_functions(fakepve, fakepve_cafile, tmp_path):
    env = Env(fakepve, fakepve_cafile, tmp_path, gpus=8)
    ct_before, vm_before = dict(env.ct.config), dict(env.vm.config)
    out = env.run("to-vm")
    assert out.exit_code == EXIT_OK, out.reason
    assert set(env.drivers().values()) == {"vfio-pci"} and len(env.drivers()) == 16
    assert (env.vm.status, env.ct.status) == ("running", "stopped")
    added = {f"hostpci{n}": f"0000:{n + 1:02x}:00,pcie=1" for n in range(8)}
    assert env.vm.config == {**vm_before, **added}  # every other line kept
    assert out.result["vm"]["config"] == added and out.result["owner"] == "vm"
    assert [g["numa_node"] for g in out.result["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]

    out = env.run("to-ct")
    assert out.exit_code == EXIT_OK, out.reason
    assert env.owner_consistent() and env.ct.config == ct_before
    assert env.host.active == {"nvidia-persistenced.service"}
    assert env.tasks() == [
        ("vzshutdown", "101", "OK"),
        ("qmstart", "201", "OK"),
        ("qmshutdown", "201", "OK"),
        ("vzstart", "101", "OK"),
    ]
    again = env.run("to-ct")
    assert again.exit_code == EXIT_OK and again.result["changed"] is False and len(env.tasks()) == 4


def test_container_gets_its_dev_entries_written_through_the_api(fakepve, fakepve_cafile, tmp_path):
    env = Env(fakepve, fakepve_cafile, tmp_path, gpus=8, owner="vm")
    before = dict(env.ct.config)
    out = env.run("to-ct")
    assert out.exit_code == EXIT_OK, out.reason
    nodes = [f"/dev/nvidia{n}" for n in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert {k: v for k, v in env.ct.config.items() if k.startswith("dev")} == {
        f"dev{n}": p for n, p in enumerate(nodes)
    }
    assert {k: v for k, v in env.ct.config.items() if not k.startswith("dev")} == before
    assert env.owner_consistent()


def test_slow_container_shutdown_is_refused_without_force(env):
    env.ct.shutdown_secs = 500  # longer than the 60 s we give it
    out = env.run("to-vm")
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "CT 101 did not shut down within 60 s (container did not stop)" in out.reason
    assert "--force" in out.reason
    assert env.ct.status == "running" and set(env.drivers().values()) == {"nvidia", "snd_hda_intel"}
    assert env.kernel.writes == []
    out = env.run("to-vm", force=True)
    assert out.exit_code == EXIT_OK, out.reason
    assert ("vzstop", "101", "OK") in env.tasks() and env.owner_consistent()


def test_slow_vm_shutdown_with_force_stops_it(fakepve, fakepve_cafile, tmp_path):
    env = Env(fakepve, fakepve_cafile, tmp_path, owner="vm")
    env.vm.shutdown_secs = 500
    out = env.run("to-ct")
    assert out.exit_code == EXIT_ROLLED_BACK and "VM quit/powerdown failed - got timeout" in out.reason
    assert env.vm.status == "running"
    out = env.run("to-ct", force=True, timeout=10)
    assert out.exit_code == EXIT_OK, out.reason
    assert ("qmstop", "201", "OK") in env.tasks() and env.owner_consistent()


def test_a_giving_guest_locked_by_a_backup_is_left_alone(env):
    env.ct.lock = "backup"  # vzdump is running
    out = env.run("to-vm", force=True)
    assert out.exit_code == EXIT_ROLLED_BACK and "CT is locked (backup)" in out.reason
    assert env.ct.status == "running" and set(env.drivers().values()) == {"nvidia", "snd_hda_intel"}


@pytest.mark.parametrize("lock", ["backup", "config-lock"])
def test_a_locked_receiver_config_rolls_the_move_back(env, lock):
    if lock == "backup":
        env.pve.snapshot_lock(VM, "backup")
        expected = "VM is locked (backup)"
    else:
        env.vm.lock_holder = "scenario"  # another task holds /var/lock/qemu-server/lock-201.conf
        expected = "can't lock file '/var/lock/qemu-server/lock-201.conf' - got timeout"
    vm_before = dict(env.vm.config)
    out = env.run("to-vm")
    assert out.exit_code == EXIT_ROLLED_BACK and expected in out.reason
    assert out.result["rolled_back"] is True
    assert env.owner_consistent() and env.vm.config == vm_before
    assert env.tasks()[-1] == ("vzstart", "101", "OK")


def test_vm_start_ending_in_task_error_rolls_back(env):
    env.vm.start_error = "start failed: QEMU exited with code 1"
    vm_before = dict(env.vm.config)
    out = env.run("to-vm")
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "start VM 201: task failed: start failed: QEMU exited with code 1" in out.reason
    assert env.owner_consistent() and env.vm.config == vm_before  # the hostpci entries were taken out again
    assert env.kernel.override_of(env.addresses[0]) is None  # exactly as before, override included
    assert env.tasks() == [
        ("vzshutdown", "101", "OK"),
        ("qmstart", "201", "start failed: QEMU exited with code 1"),
        ("vzstart", "101", "OK"),
    ]


def test_a_start_that_pve_fails_by_name_rolls_back(env):
    env.pve.fail("POST", f"/nodes/pve1/qemu/{VM}/status/start", 500, "VM 201 already running")
    out = env.run("to-vm")
    assert out.exit_code == EXIT_ROLLED_BACK and "already running" in out.reason
    assert env.owner_consistent()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_flaky_network_ends_done_or_rolled_back_never_stranded(env, seed):
    env.pve.flaky_network(drop_rate=0.3, seed=seed)
    for target in ("vm", "ct", "vm"):
        out = env.run(f"to-{target}")
        assert out.exit_code in (EXIT_OK, EXIT_ROLLED_BACK), out.reason
        assert env.owner_consistent(), (out.reason, env.drivers(), env.ct.status, env.vm.status)
        assert not os.path.exists(env.config.journal_path)
        if out.exit_code == EXIT_OK:
            assert out.result["owner"] == target


def test_hanging_requests_time_out_and_are_retried(env):
    env.data["proxmox"]["timeout"] = 0.5
    env.pve.flaky_network(hang_rate=0.2, hang_secs=2, seed=5)
    out = env.run("to-vm")
    assert out.exit_code in (EXIT_OK, EXIT_ROLLED_BACK), out.reason
    assert env.owner_consistent()


def test_an_api_token_is_refused_before_any_change_and_the_reason_is_root_pam(env):
    env.pve.apitokens["root@pam!gpuswitch"] = "tokensecret"
    env.data["proxmox"]["token_name"] = "gpuswitch"
    (env.tmp / "password").write_text("tokensecret\n")
    out = env.run("to-vm")
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "only for root@pam" in out.reason and "root@pam!gpuswitch is not root@pam" in out.reason
    assert env.tasks() == [] and env.kernel.writes == []


def test_proxmox_itself_refuses_dev_entries_to_a_token(env):
    env.pve.apitokens["root@pam!gpuswitch"] = "tokensecret"
    env.pve.grant("root@pam!gpuswitch", "/vms", "VM.Config.Options")  # any grant turns permission checks on
    env.data["proxmox"]["token_name"] = "gpuswitch"
    api = PveApi(env.config.proxmox, "tokensecret", sleep=lambda s: None)
    with pytest.raises(ApiError) as err:
        api.set_config("lxc", CT, {"dev9": "/dev/nvidia-caps/nvidia-cap1"})
    assert err.value.status == 403
    assert "configuring device passthrough is only allowed for root@pam" in err.value.reason


def test_a_token_works_when_every_entry_is_already_there(env):
    env.vm.config.update({f"hostpci{n}": f"{a[:-2]},pcie=1" for n, a in enumerate(env.addresses)})
    env.pve.apitokens["root@pam!gpuswitch"] = "tokensecret"
    env.data["proxmox"]["token_name"] = "gpuswitch"
    (env.tmp / "password").write_text("tokensecret\n")
    for target in ("vm", "ct"):
        out = env.run(f"to-{target}")
        assert out.exit_code == EXIT_OK, out.reason
        assert env.owner_consistent()


def test_tls_is_verified_against_the_ca_file(env):
    assert env.run("status").exit_code == EXIT_OK
    env.data["proxmox"]["ca_file"] = None  # the fake's self-signed certificate is not in the system CAs
    out = env.run("status")
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "TLS verification of 127.0.0.1" in out.reason and "set proxmox.ca_file" in out.reason
    assert out.result["owner"] == "ct"  # the host side is still reported


def test_the_command_line_end_to_end_with_json(env):
    path, environ = env.serve()
    argv = [sys.executable, str(ROOT / "bin" / "gpu-switch"), "--config", path, "--json"]
    proc = subprocess.run([*argv, "to-vm"], capture_output=True, text=True, env=environ, check=False)
    assert proc.returncode == EXIT_OK, proc.stderr
    result = json.loads(proc.stdout)
    assert result["owner"] == "vm" and result["changed"] is True and result["vm"]["status"] == "running"
    proc = subprocess.run([*argv, "status"], capture_output=True, text=True, env=environ, check=False)
    assert json.loads(proc.stdout)["owner"] == "vm"
    env.vm.start_error = "boom"
    env.vm.status = "stopped"
    proc = subprocess.run([*argv, "to-vm"], capture_output=True, text=True, env=environ, check=False)
    assert proc.returncode == EXIT_ROLLED_BACK
    assert proc.stderr.splitlines()[-1].startswith("gpu-switch: to-vm failed and was rolled back: start VM 201")


@pytest.mark.parametrize("write", [1, 3, 5, 9])
@pytest.mark.parametrize("origin", ["ct", "vm"])
def test_sigkill_mid_move_then_recover(make_env, origin, write):
    """The real command, killed by SIGKILL right after sysfs write n, then `gpu-switch recover` (the unit tests
    kill an in-process move after every single write; this proves the same with a real process death)."""
    target = "vm" if origin == "ct" else "ct"
    env = make_env(owner=origin)
    path, environ = env.serve()
    argv = [sys.executable, str(ROOT / "bin" / "gpu-switch"), "--config", path, "--json"]
    env.kernel.crash_after(write)
    proc = subprocess.run([*argv, f"to-{target}"], capture_output=True, text=True, env=environ, check=False)
    assert proc.returncode == -9, proc.stderr
    journal = json.loads(Path(env.config.journal_path).read_text())
    assert journal["write"]["address"] in env.drivers()
    env.kernel.crash_after(None)
    proc = subprocess.run([*argv, "recover"], capture_output=True, text=True, env=environ, check=False)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert json.loads(proc.stdout)["recovery"]["decision"] == "undo"
    env.kernel = FakeKernel.open(env.kernel.root, env.kernel.proc, env.kernel.dev)
    assert env.owner_consistent(), (env.drivers(), env.ct.status, env.vm.status)
    assert FakeHost.for_tree(env.kernel.root).active == {"nvidia-persistenced.service"}
    assert not os.path.exists(env.config.journal_path)
