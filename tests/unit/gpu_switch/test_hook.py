"""The pre-start hookscript: a guest whose GPUs sit on the other side's driver does not start."""

from __future__ import annotations

import json
import os

from gpu_switch import hook
from gpu_switch_rig import CT, VM


def test_the_vm_does_not_start_while_the_gpus_are_on_the_host_driver(rig):
    reason = hook.check(rig.config, VM, "pre-start")
    assert "0000:01:00.0 (nvidia)" in reason and "gpu-switch to-vm" in reason
    assert hook.check(rig.config, CT, "pre-start") is None
    assert hook.check(rig.config, VM, "post-stop") is None and hook.check(rig.config, 999, "pre-start") is None


def test_the_container_does_not_start_while_the_gpus_are_on_vfio(rig):
    assert rig.switcher().move("vm").exit_code == 0
    assert hook.check(rig.config, VM, "pre-start") is None
    assert "bound to the VM's driver; move them with gpu-switch to-ct" in hook.check(rig.config, CT, "pre-start")


def test_a_gpu_that_needs_a_reboot_blocks_both_guests(rig):
    os.makedirs(os.path.dirname(rig.config.journal_path), exist_ok=True)
    with open(rig.config.journal_path, "w") as fh:
        json.dump({"needs_reboot": ["0000:02:00.0"], "boot_id": "11111111-2222-3333-4444-555555555555"}, fh)
    assert "needs a host reboot" in hook.check(rig.config, CT, "pre-start")


def test_main_fails_closed_and_says_why(rig, monkeypatch, capsys):
    monkeypatch.setenv("GPU_SWITCH_CONFIG", rig.write_config())
    assert hook.main([str(VM), "pre-start"]) == 1
    assert capsys.readouterr().err.startswith("gpu-switch hook: refusing to start VM 201: GPU functions")
    assert hook.main([str(CT), "pre-start"]) == 0
    assert hook.main([str(VM), "post-start"]) == 0
    monkeypatch.setenv("GPU_SWITCH_CONFIG", str(rig.tmp / "missing.yml"))
    assert hook.main([str(CT), "pre-start"]) == 1
    assert "cannot check the GPUs (config" in capsys.readouterr().err
    assert hook.main(["x"]) == 2
