"""The GPU guard the units run before start, after start and after stop (real /proc, stand-in nodes)."""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest
from inference_refdata import ROLE

from inferhost.sim import ENGINE_DIR

STANDIN = ENGINE_DIR / "openai_standin.py"


def load_guard():
    loader = importlib.machinery.SourceFileLoader("inferhost_gpu_guard", str(ROLE / "files/inferhost-gpu-guard"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


GUARD = load_guard()
UNIT = "inference-test.service"


@pytest.fixture
def nodes(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / name).write_text("")
    sysfs = tmp_path / "sys"
    for bdf, driver in (("0000:01:00.0", "nvidia"), ("0000:02:00.0", "vfio-pci")):
        (sysfs / "bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
        device = sysfs / "bus/pci/devices" / bdf
        device.mkdir(parents=True)
        (device / "driver").symlink_to(f"../../drivers/{driver}")
    return dev, sysfs


@pytest.fixture
def holder():
    procs = []

    def start(path, marker=None):
        env = {k: v for k, v in os.environ.items() if k != GUARD.MARKER}
        if marker:
            env[GUARD.MARKER] = marker
        with open(path, "rb") as handle:
            proc = subprocess.Popen(["sleep", "300"], stdin=handle, env=env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def guard(command, dev, sysfs, *extra):
    argv = [command, "--unit", UNIT, "--device", str(dev / "nvidia0"), "--device", str(dev / "nvidia1")]
    argv += ["--control", str(dev / "nvidiactl"), "--sysfs", str(sysfs), "--nvidia-smi", "", "--kill-timeout", "2"]
    return GUARD.main(argv + list(extra))


def test_free_gpus_pass(nodes, capsys):
    dev, sysfs = nodes
    assert guard("check", dev, sysfs, "--pci", "0000:01:00.0") == 0
    assert "GPUs - are free and bound to nvidia" in capsys.readouterr().out


def test_gpu_given_to_the_vm_is_refused(nodes, capsys):
    dev, sysfs = nodes
    assert guard("check", dev, sysfs, "--pci", "0000:02:00.0") == 1
    assert "GPU 0000:02:00.0 is bound to vfio-pci (given to the VM)" in capsys.readouterr().out


def test_missing_device_node_is_refused(nodes, capsys):
    dev, sysfs = nodes
    (dev / "nvidiactl").unlink()
    assert guard("check", dev, sysfs) == 1
    assert f"device node {dev / 'nvidiactl'} is missing" in capsys.readouterr().out


def test_foreign_holder_is_refused_and_left_alone(nodes, holder, capsys):
    dev, sysfs = nodes
    proc = holder(dev / "nvidia1", marker="inference-other.service")
    assert guard("check", dev, sysfs) == 1
    out = capsys.readouterr().out
    assert f"pid {proc.pid} (sleep: sleep 300;" in out
    assert "unit inference-other.service) holds" in out
    assert "nothing was stopped" in out
    assert proc.poll() is None


def test_own_leftover_is_terminated_and_start_proceeds(nodes, holder, capsys):
    dev, sysfs = nodes
    proc = holder(dev / "nvidia0", marker=UNIT)
    assert guard("check", dev, sysfs) == 0
    assert proc.wait(timeout=5) == -15
    assert f"leftover of {UNIT}: pid {proc.pid}" in capsys.readouterr().out


def test_wait_free_times_out_while_a_holder_stays(nodes, holder, capsys):
    dev, sysfs = nodes
    holder(dev / "nvidia0")
    assert guard("wait-free", dev, sysfs, "--timeout", "0.5") == 1
    assert "still held after 0.5 s" in capsys.readouterr().out


def test_wait_free_returns_once_released(nodes, holder):
    dev, sysfs = nodes
    proc = holder(dev / "nvidia0")
    proc.kill()
    proc.wait()
    assert guard("wait-free", dev, sysfs, "--timeout", "5") == 0


def test_terminate_escalates_to_sigkill():
    sent = []
    hard = GUARD.terminate([41, 42], 0.3, kill=lambda p, s: sent.append((p, s)), is_alive=lambda p: p == 42)
    assert hard == [42]
    assert (42, 9) in sent and (41, 9) not in sent


def test_memory_check_reads_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 12'\necho '1, 40960'\n")
    smi.chmod(0o755)
    used = GUARD.memory_used(str(smi), [0, 1])
    assert used == {0: 12, 1: 40960}
    assert GUARD.memory_used("no-such-nvidia-smi", [0]) is None


def test_memory_in_use_by_an_invisible_process_is_refused(nodes, tmp_path, capsys):
    dev, sysfs = nodes
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 50000'\n")
    smi.chmod(0o755)
    argv = ["check", "--unit", UNIT, "--device", str(dev / "nvidia0"), "--gpu", "0", "--nvidia-smi", str(smi)]
    assert GUARD.main([*argv, "--wait", "0"]) == 1
    assert "GPU 0: 50000 MiB, more than 1024 MiB" in capsys.readouterr().out


def test_ready_waits_for_health_and_the_model(tmp_path, capsys):
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen(
        [sys.executable, str(STANDIN), "serve", "/m/Model-X", "--port", str(port), "--load-delay", "1"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        url = f"http://127.0.0.1:{port}"
        assert GUARD.main(["ready", "--url", url, "--model", "Model-X", "--interval", "0.2", "--log-every", "0"]) == 0
        out = capsys.readouterr().out
        assert "waiting for Model-X" in out and "Model-X is ready after" in out
        assert GUARD.main(["ready", "--url", url, "--model", "other", "--timeout", "0.5", "--interval", "0.2"]) == 1
        assert "other not ready after 0.5 s (health 200, models 200)" in capsys.readouterr().out
    finally:
        server.kill()
        server.wait()


def test_models_listed():
    assert GUARD.models_listed({"data": [{"id": "a"}, {"id": "b"}]}, "b")
    assert not GUARD.models_listed(json.loads('{"data": []}'), "b")
    assert not GUARD.models_listed(None, "b")


def test_unreadable_environment_is_never_taken_for_a_leftover(tmp_path):
    proc = tmp_path / "proc"
    (proc / "77/fd").mkdir(parents=True)
    (proc / "77/environ").mkdir()  # reading it fails, as another user's environ does without CAP_SYS_PTRACE
    (proc / "77/comm").write_text("python3\n")
    (proc / "77/status").write_text("Name:\tpython3\nUid:\t999\t999\t999\t999\n")
    (proc / "77/cgroup").write_text("0::/system.slice/other.service\n")
    (proc / "77/fd/5").symlink_to("/dev/nvidia0")
    (found,) = GUARD.holders(str(proc), ["/dev/nvidia0"])
    assert not found["environ_readable"] and not GUARD.belongs_to(found, UNIT)
    assert "environment unreadable, so not provably this unit's" in GUARD.describe(found)
    (proc / "77/cgroup").write_text(f"0::/system.slice/{UNIT}\n")
    assert GUARD.belongs_to(GUARD.holders(str(proc), ["/dev/nvidia0"])[0], UNIT)
