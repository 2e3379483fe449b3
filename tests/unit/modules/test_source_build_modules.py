"""Modules source_build_plan (on a real checkout: what its key and its job count are made of) and source_build_wait."""

import fcntl
import json
import os
import sys
from pathlib import Path

import pytest
from module_runner import load_module, run_module
from source_build import buildjob

ROOT = Path(__file__).resolve().parents[3]


PLAN = load_module("source_build_plan")
WAIT = load_module("source_build_wait")


def executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def machine(tmp_path, source, monkeypatch):
    """Environments, a fake compiler pair and a fake dpkg-query whose answers a test can change."""
    for env in ("target", "build"):
        (tmp_path / env / "bin").mkdir(parents=True)
        os.symlink(sys.executable, tmp_path / env / "bin" / "python")
    tools = tmp_path / "tools"
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / "cc").write_text("fakecc (Debian 12.2.0-14) 12.2.0\n")
    (versions / "dpkg").write_text("libnuma-dev\tamd64\tii \t2.0.16-1\n")
    executable(tools / "fakecc", f'#!/bin/sh\n[ "$1" = --version ] && cat {versions}/cc\n')
    executable(tools / "fakec++", f'#!/bin/sh\n[ "$1" = --version ] && cat {versions}/cc\n')
    # dpkg-query exits 1 when a package is unknown to it; the plan reads that as not installed.
    executable(tools / "dpkg-query", f"#!/bin/sh\ncat {versions}/dpkg\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    args = {
        "name": "demo",
        "source": str(source),
        "target": str(tmp_path / "target"),
        "build_env": str(tmp_path / "build"),
        "uv": "/usr/local/bin/uv",
        "environment": {"CC": str(tools / "fakecc"), "CXX": str(tools / "fakec++"), "MAX_JOBS": "{jobs}"},
        "gb_per_thread": 5,
        "threads_per_job": 4,
        "max_jobs": 20,
        "reserve_gb": 32,
        "available_gb": 64,
        "key_system_packages": ["libnuma-dev", "libibverbs-dev"],
        "cache_dir": str(tmp_path / "cache"),
    }
    return args, versions


def test_the_key_holds_the_compilers_and_the_declared_packages(machine):
    args, _ = machine
    got = run_module(PLAN, args)
    assert not got.get("failed"), got.get("msg")
    assert got["key_inputs"]["compilers"] == {
        "CC": "fakecc (Debian 12.2.0-14) 12.2.0",
        "CXX": "fakecc (Debian 12.2.0-14) 12.2.0",
    }
    assert got["key_inputs"]["system_packages"] == {
        "libibverbs-dev": "not installed",
        "libnuma-dev": "2.0.16-1 amd64",
    }
    assert run_module(PLAN, args)["key"] == got["key"]


def test_installing_libibverbs_dev_changes_the_key_and_removing_it_restores_it(machine):
    args, versions = machine
    before = run_module(PLAN, args)["key"]
    dpkg = (versions / "dpkg").read_text()
    (versions / "dpkg").write_text(dpkg + "libibverbs-dev\tamd64\tii \t44.0-2\n")
    assert run_module(PLAN, args)["key"] != before
    (versions / "dpkg").write_text(dpkg)
    assert run_module(PLAN, args)["key"] == before


def test_another_compiler_version_changes_the_key(machine):
    args, versions = machine
    before = run_module(PLAN, args)["key"]
    (versions / "cc").write_text("fakecc (Debian 12.2.0-14+deb12u1) 12.2.0\n")
    assert run_module(PLAN, args)["key"] != before


def test_a_compiler_the_build_cannot_find_is_named_in_the_key(machine):
    args, _ = machine
    got = run_module(PLAN, {**args, "environment": {**args["environment"], "CXX": "no-such-c++ -O2"}})
    assert got["key_inputs"]["compilers"]["CXX"] == "no-such-c++ -O2: not found"


def test_a_single_arch_build_plans_one_thread_per_job(machine):
    args, _ = machine
    env = {**args["environment"], "FLASH_ATTN_CUDA_ARCHS": "120", "NVCC_THREADS": "{threads}"}
    got = run_module(PLAN, {**args, "environment": env, "arch_list_variable": "FLASH_ATTN_CUDA_ARCHS"})
    assert not got.get("failed"), got.get("msg")
    # 64 GB - 32 GB reserve = 32 GB; 5 GB per job at one thread: 6 jobs (1 at the 4 threads asked for).
    assert got["parallelism"]["threads"] == 1 and got["parallelism"]["arches"] == 1
    assert got["parallelism"]["jobs"] == min(6, got["parallelism"]["cpus"])
    assert got["environment"]["NVCC_THREADS"] == "1"
    unnamed = run_module(PLAN, {**args, "environment": env})
    assert unnamed["parallelism"]["threads"] == 4 and unnamed["parallelism"]["jobs"] == 1
    assert unnamed["key"] == got["key"]  # parallelism is not in the key


def test_an_arch_list_variable_the_environment_does_not_set_is_refused(machine):
    args, _ = machine
    got = run_module(PLAN, {**args, "arch_list_variable": "FLASH_ATTN_CUDA_ARCHS"})
    assert got["failed"] and "arch_list_variable names FLASH_ATTN_CUDA_ARCHS" in got["msg"]
    empty = {**args["environment"], "FLASH_ATTN_CUDA_ARCHS": ""}
    got = run_module(PLAN, {**args, "environment": empty, "arch_list_variable": "FLASH_ATTN_CUDA_ARCHS"})
    assert got["failed"] and "no architecture" in got["msg"]


def test_waiting_on_a_name_with_no_build_running_is_idle(tmp_path):
    got = run_module(WAIT, {"name_dir": str(tmp_path / "cache" / "flash-attn"), "wait": 0})
    assert not got.get("failed") and got["status"] == "idle" and got["done"] and not got["changed"]


def test_waiting_on_a_name_follows_its_running_build(tmp_path):
    name_dir = tmp_path / "cache" / "flash-attn"
    job = name_dir / "key1"
    job.mkdir(parents=True)
    (job / "state.json").write_text(json.dumps({"status": "running", "started": 1.0}))
    with open(job / "build.lock", "a", encoding="utf-8") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        got = run_module(WAIT, {"name_dir": str(name_dir), "wait": 0})
    assert got["status"] == "running" and not got["done"] and got["key"] == "key1"
    assert buildjob.running_job(str(name_dir)) is None


def test_wait_takes_a_key_or_a_name_not_both(tmp_path):
    both = run_module(WAIT, {"job_dir": str(tmp_path / "a"), "name_dir": str(tmp_path), "wait": 0})
    assert both["failed"] and "mutually exclusive" in both["msg"]
    neither = run_module(WAIT, {"wait": 0})
    assert neither["failed"] and "one of the following is required" in neither["msg"]
