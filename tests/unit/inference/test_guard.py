"""The GPU guard the units run before start, after start and after stop (real /proc, stand-in nodes)."""

import os
import subprocess
import sys
import time

import pytest
from gpu_switch.holders import Holder
from inference import guard
from localhost import free_port, wait_listening

from inferhost.sim import ENGINE_DIR

STANDIN = ENGINE_DIR / "openai_standin.py"
UNIT = "inference-test.service"


@pytest.fixture
def nodes(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / name).write_text("")
    sysfs = tmp_path / "sys"
    for address, driver in (("0000:01:00.0", "nvidia"), ("0000:02:00.0", "vfio-pci")):
        (sysfs / "bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
        device = sysfs / "bus/pci/devices" / address
        device.mkdir(parents=True)
        (device / "driver").symlink_to(f"../../drivers/{driver}")
    return dev, sysfs


@pytest.fixture
def holder():
    procs = []

    def start(path, marker=None):
        env = {k: v for k, v in os.environ.items() if k != guard.MARKER}
        if marker:
            env[guard.MARKER] = marker
        with open(path, "rb") as handle:
            proc = subprocess.Popen(["sleep", "300"], stdin=handle, env=env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def run(command, dev, sysfs, *extra):
    argv = [command, "--unit", UNIT, "--device", str(dev / "nvidia0"), "--device", str(dev / "nvidia1")]
    argv += ["--control", str(dev / "nvidiactl"), "--sysfs", str(sysfs), "--nvidia-smi", "", "--kill-timeout", "2"]
    return guard.main(argv + list(extra))


def test_free_gpus_pass(nodes, capsys):
    dev, sysfs = nodes
    assert run("check", dev, sysfs, "--pci", "0000:01:00.0") == 0
    assert "GPUs - are free and bound to nvidia" in capsys.readouterr().out


def test_gpu_given_to_the_vm_is_refused(nodes, capsys):
    dev, sysfs = nodes
    assert run("check", dev, sysfs, "--pci", "0000:02:00.0") == 1
    assert "GPU 0000:02:00.0 is bound to vfio-pci (given to the VM)" in capsys.readouterr().out


def test_missing_device_node_is_refused(nodes, capsys):
    dev, sysfs = nodes
    (dev / "nvidiactl").unlink()
    assert run("check", dev, sysfs) == 1
    assert f"device node {dev / 'nvidiactl'} is missing" in capsys.readouterr().out


def test_foreign_holder_is_refused_and_left_alone(nodes, holder, capsys):
    dev, sysfs = nodes
    proc = holder(dev / "nvidia1", marker="inference-other.service")
    assert run("check", dev, sysfs) == 1
    out = capsys.readouterr().out
    assert f"pid {proc.pid} (sleep 300; uid {os.getuid()}; unit inference-other.service) holds {dev / 'nvidia1'}" in out
    assert "nothing was stopped" in out
    assert proc.poll() is None


def test_holder_through_another_path_to_the_node_is_found(nodes, holder, tmp_path, capsys):
    dev, sysfs = nodes
    (tmp_path / "alias").symlink_to(dev)
    proc = holder(tmp_path / "alias" / "nvidia0")
    assert run("check", tmp_path / "alias", sysfs) == 1
    assert f"pid {proc.pid} (sleep 300;" in capsys.readouterr().out


def test_own_leftover_is_terminated_and_start_proceeds(nodes, holder, capsys):
    dev, sysfs = nodes
    proc = holder(dev / "nvidia0", marker=UNIT)
    assert run("check", dev, sysfs) == 0
    assert proc.wait(timeout=5) == -15
    assert f"leftover of {UNIT}: pid {proc.pid}" in capsys.readouterr().out


def test_wait_free_times_out_while_a_holder_stays(nodes, holder, capsys):
    dev, sysfs = nodes
    holder(dev / "nvidia0")
    assert run("wait-free", dev, sysfs, "--timeout", "0.5") == 1
    assert "still held after 0.5 s" in capsys.readouterr().out


def test_wait_free_returns_once_released(nodes, holder):
    dev, sysfs = nodes
    proc = holder(dev / "nvidia0")
    proc.kill()
    proc.wait()
    assert run("wait-free", dev, sysfs, "--timeout", "5") == 0


def test_terminate_escalates_to_sigkill():
    sent = []
    hard = guard.terminate([41, 42], 0.3, kill=lambda p, s: sent.append((p, s)), is_alive=lambda p: p == 42)
    assert hard == [42]
    assert (42, 9) in sent and (41, 9) not in sent


def test_memory_check_reads_nvidia_smi(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 12'\necho '1, 40960'\n")
    smi.chmod(0o755)
    used = guard.memory_used(str(smi), [0, 1])
    assert used == {0: 12, 1: 40960}
    assert guard.memory_used("no-such-nvidia-smi", [0]) is None


def test_memory_in_use_by_an_invisible_process_is_refused(nodes, tmp_path, capsys):
    dev, _ = nodes
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 50000'\n")
    smi.chmod(0o755)
    argv = ["check", "--unit", UNIT, "--device", str(dev / "nvidia0"), "--gpu", "0", "--nvidia-smi", str(smi)]
    assert guard.main([*argv, "--wait", "0"]) == 1
    assert "GPU 0: 50000 MiB, more than 1024 MiB" in capsys.readouterr().out


def test_ready_waits_for_health_and_the_model_with_the_units_key(monkeypatch, capsys):
    port = free_port()
    argv = [sys.executable, str(STANDIN), "serve", "/m/Model-X", "--port", str(port), "--load-delay", "1"]
    server = subprocess.Popen([*argv, "--api-key", "k1"], stdout=subprocess.DEVNULL)
    try:
        wait_listening(port)
        url = f"http://127.0.0.1:{port}"
        ready = ["ready", "--url", url, "--interval", "0.2", "--timeout", "0.5", "--model"]
        monkeypatch.setenv("INFERHOST_API_KEY", "k1")  # the unit's secret environment file
        assert guard.main([*ready[:-3], "--log-every", "0", "--model", "Model-X"]) == 0
        out = capsys.readouterr().out
        assert "waiting for Model-X: 0 s, health 503, models 503" in out and "Model-X is ready after" in out
        assert guard.main([*ready, "other"]) == 1
        assert "other not ready after 0.5 s (health 200, models 200)" in capsys.readouterr().out
        monkeypatch.delenv("INFERHOST_API_KEY")
        assert guard.main([*ready, "Model-X"]) == 1
        assert "Model-X not ready after 0.5 s (health 200, models 401)" in capsys.readouterr().out
    finally:
        server.kill()
        server.wait()


def fake_process(proc, pid, cgroup, environ_readable=True, environ=b""):
    base = proc / str(pid)
    (base / "fd").mkdir(parents=True)
    if environ_readable:
        (base / "environ").write_bytes(environ)
    else:
        (base / "environ").mkdir()  # reading it fails, as another user's environ does without CAP_SYS_PTRACE
    (base / "cmdline").write_bytes(b"python3\0-m\0vllm\0")
    (base / "status").write_text("Name:\tpython3\nUid:\t999\t999\t999\t999\n")
    (base / "cgroup").write_text(cgroup)
    (base / "fd/5").symlink_to("/dev/nvidia0")
    return Holder(pid=pid, command="python3 -m vllm", path="/dev/nvidia0")


def test_unreadable_environment_is_never_taken_for_a_leftover(tmp_path):
    proc = tmp_path / "proc"
    fake_process(proc, 77, "0::/system.slice/other.service\n", environ_readable=False)
    (found,) = guard.holders(str(proc), ["/dev/nvidia0"])
    assert (found.pid, found.uid, found.environ_readable) == (77, "999", False)
    assert not found.belongs_to(UNIT)
    assert str(found) == (
        "pid 77 (python3 -m vllm; uid 999; environment unreadable, so not provably this unit's) holds /dev/nvidia0"
    )
    (proc / "77/cgroup").write_text(f"0::/system.slice/{UNIT}\n")
    assert guard.holders(str(proc), ["/dev/nvidia0"])[0].belongs_to(UNIT)


def test_the_marker_says_whose_a_holder_is(tmp_path):
    proc = tmp_path / "proc"
    environ = b"PATH=/usr/bin\0INFERHOST_UNIT=" + UNIT.encode() + b"\0"
    held = guard.ownership(str(proc), fake_process(proc, 78, "0::/user.slice\n", environ=environ))
    assert held.marker == UNIT and held.belongs_to(UNIT) and not held.belongs_to("inference-other.service")
    assert f"; unit {UNIT}) holds" in str(held)
    plain = guard.ownership(str(proc), fake_process(proc, 79, "0::/user.slice\n", environ=b"PATH=/usr/bin\0"))
    assert plain.marker == "" and not plain.belongs_to(UNIT) and "; no inference unit) holds" in str(plain)


def test_ready_stops_waiting_when_the_engine_has_exited(monkeypatch, capsys):
    """An engine that died while loading never serves: the wait ends there, not at its timeout."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setenv("MAINPID", str(gone.pid))
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    assert guard.main(["ready", "--url", url, "--model", "M", "--interval", "0.1", "--timeout", "30"]) == 1
    assert time.monotonic() - start < 10
    assert f"the engine (pid {gone.pid}) exited after 0 s without serving M" in capsys.readouterr().out
    monkeypatch.setenv("MAINPID", str(os.getpid()))  # alive: the wait goes on to its timeout
    assert guard.main(["ready", "--url", url, "--model", "M", "--interval", "0.1", "--timeout", "0.3"]) == 1
    assert "M not ready after 0.3 s" in capsys.readouterr().out
