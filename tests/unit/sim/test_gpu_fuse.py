"""The simulated host's boot (gpu_fuse.boot): once per boot, the model reboots and the driver module loads at
the version of the installed package, as DKMS built it; a restart of the service is no boot."""

from __future__ import annotations

import os
import socket

import pytest

from inferhost.sim import gpu_fuse
from inferhost.sim.gpu_kernel import FakeKernel, build

GPU = "0000:01:00.0"


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A simulated host with one GPU, a dpkg-query that answers from dpkg.txt, and a boot marker on "/run"."""
    build(str(tmp_path), [{"address": GPU, "numa_node": 0}], dev=str(tmp_path / "dev"))
    kernel = FakeKernel.open(str(tmp_path / "sys"), str(tmp_path / "proc"), str(tmp_path / "dev"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    status = tmp_path / "dpkg.txt"
    (bin_dir / "dpkg-query").write_text(f"#!/bin/sh\n[ -s {status} ] || exit 1\ncat {status}\n")
    (bin_dir / "dpkg-query").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return kernel, status, str(tmp_path / "run" / "booted")


def _loaded(kernel):
    path = os.path.join(kernel.root, "module", "nvidia", "version")
    return open(path).read().strip() if os.path.exists(path) else None


def test_a_fresh_host_without_the_driver_boots_with_no_module(host):
    kernel, _, marker = host
    gpu_fuse.boot(kernel, marker, ["nvidia=nvidia-kernel-open-dkms"], fresh=True)
    assert _loaded(kernel) is None and os.path.exists(marker)


def test_a_restart_of_the_service_is_no_boot(host):
    kernel, status, marker = host
    gpu_fuse.boot(kernel, marker, ["nvidia=nvidia-kernel-open-dkms"], fresh=True)
    status.write_text("hi  590.48.01-1")
    gpu_fuse.boot(kernel, marker, ["nvidia=nvidia-kernel-open-dkms"], fresh=False)
    assert _loaded(kernel) is None


@pytest.mark.parametrize(("dpkg", "loaded"), [("hi  595.45.04-1", "595.45.04"), ("rc  590.48.01-1", None)])
def test_a_boot_loads_the_installed_driver_and_probes_every_function_afresh(host, dpkg, loaded):
    """A held package is installed (hi); one removed with its configuration kept (rc) is not."""
    kernel, status, marker = host
    gpu_fuse.boot(kernel, marker, ["nvidia=nvidia-kernel-open-dkms"], fresh=True)
    kernel.write(os.path.join(kernel.root, "bus", "pci", "devices", GPU, "driver_override"), "vfio-pci")
    kernel.write(os.path.join(kernel.root, "bus", "pci", "drivers", "nvidia", "unbind"), GPU)
    status.write_text(dpkg)
    os.unlink(marker)  # what a reboot does to /run
    gpu_fuse.boot(kernel, marker, ["nvidia=nvidia-kernel-open-dkms"], fresh=False)
    assert _loaded(kernel) == loaded
    assert (kernel.override_of(GPU), kernel.driver_of(GPU)) == (None, "nvidia")


def test_ready_is_told_to_systemd_through_its_notify_socket(tmp_path, monkeypatch):
    """Type=notify: the unit is started only once gpu_fuse says so (after the last bind), never before."""
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        gpu_fuse.notify_ready()
        assert server.recv(64) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    gpu_fuse.notify_ready()  # not under systemd: nothing to tell, and no error


def test_a_bind_that_fails_stops_the_filesystem(tmp_path, monkeypatch):
    """No half-bound host: the process ends (SIGTERM to itself) instead of serving without its binds."""
    signals = []
    monkeypatch.setattr(gpu_fuse.os, "kill", lambda pid, sig: signals.append((pid, sig)))
    monkeypatch.setattr(gpu_fuse, "wait_mounted", lambda mount, timeout: None)
    monkeypatch.setattr(gpu_fuse, "notify_ready", lambda: signals.append("ready"))
    gpu_fuse._bind(str(tmp_path), [("sys/bus/pci", str(tmp_path / "no-such-target"))])
    assert signals == [(os.getpid(), gpu_fuse.signal.SIGTERM)]
