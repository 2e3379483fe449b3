"""The detached build job: state, log, lock, wheel hand-over, and the poller's view of it."""

import fcntl
import json
import os
import sys
import threading
import time

import pytest
from source_build import buildjob
from source_build.buildplan import (
    cuda_version,
    expand,
    expand_environment,
    installed_from,
    nvcc_release,
    variables_using,
    wheel_project,
)

BUILD = """
import os, sys, pathlib
print("MAX_JOBS", os.environ.get("MAX_JOBS"))
out = pathlib.Path(sys.argv[1])
if os.environ.get("FAIL"):
    print("error: nvcc died"); sys.exit(2)
for n in range(int(os.environ.get("WHEELS", "1"))):
    (out / f"demo_ext-1.{n}-cp312-cp312-linux_x86_64.whl").write_bytes(b"PK")
"""


def start(job_dir, tmp_path, **env):
    script = tmp_path / "build.py"
    script.write_text(BUILD)
    return buildjob.run(
        str(job_dir),
        argv=[sys.executable, str(script), "{staging}"],
        cwd=str(tmp_path),
        env={**os.environ, "MAX_JOBS": "3", **env},
        info={"key": "k1", "environment_resolved": {"MAX_JOBS": "3"}},
        timeout_s=60,
    )


def sleeper(job_dir, tmp_path, seconds, timeout_s=30):
    argv = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    return buildjob.run(str(job_dir), argv=argv, cwd=str(tmp_path), env=dict(os.environ), info={}, timeout_s=timeout_s)


def test_a_successful_build_leaves_wheel_info_state_and_log(tmp_path):
    job = tmp_path / "cache" / "demo" / "k1"
    state = start(job, tmp_path)
    assert state["status"] == "succeeded" and state["rc"] == 0
    assert buildjob.wheels(str(job)) == ["demo_ext-1.0-cp312-cp312-linux_x86_64.whl"]
    info = json.loads((job / "build.json").read_text())
    assert info["key"] == "k1" and info["wheel"].startswith("demo_ext-1.0")
    log = (job / "build.log").read_text()
    assert "# env MAX_JOBS=3" in log and "MAX_JOBS 3" in log and "# finished after" in log
    assert not (job / ".staging").exists()
    assert buildjob.status(str(job)) == "cached"


def test_a_failed_build_keeps_its_log_and_no_wheel(tmp_path):
    job = tmp_path / "k"
    state = start(job, tmp_path, FAIL="1")
    assert state["status"] == "failed" and state["rc"] == 2 and "status 2" in state["reason"]
    assert buildjob.wheels(str(job)) == []
    assert buildjob.status(str(job)) == "failed"
    assert "error: nvcc died" in buildjob.tail(str(job / "build.log"), 5)[-3]


def test_more_than_one_wheel_is_a_failure(tmp_path):
    state = start(tmp_path / "k", tmp_path, WHEELS="2")
    assert state["status"] == "failed" and "2 wheels" in state["reason"]


def test_a_build_past_its_timeout_is_stopped(tmp_path):
    job = tmp_path / "k"
    state = sleeper(job, tmp_path, 30, timeout_s=1)
    assert state["status"] == "failed" and state["rc"] == 124 and "timeout" in state["reason"]


def test_a_second_build_of_the_same_key_is_refused_while_one_runs(tmp_path):
    job = tmp_path / "k"
    started = threading.Event()

    def slow():
        started.set()
        sleeper(job, tmp_path, 3)

    thread = threading.Thread(target=slow)
    thread.start()
    started.wait()
    deadline = time.monotonic() + 5
    while not buildjob.is_locked(str(job)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert buildjob.status(str(job)) == "running"
    with pytest.raises(buildjob.JobError, match="already running"):
        sleeper(job, tmp_path, 0)
    report = buildjob.wait(str(job), wait_s=0.2, poll_s=0.05)
    assert report["status"] == "running" and not report["done"] and report["elapsed"] is not None
    thread.join()
    assert buildjob.wait(str(job), wait_s=5)["status"] == "failed"  # no wheel: the fake build made none


def running_in_thread(job, tmp_path, seconds):
    """Start a sleeping build of ``job`` in a thread; return the thread once the build holds its lock."""
    thread = threading.Thread(target=sleeper, args=(job, tmp_path, seconds))
    thread.start()
    deadline = time.monotonic() + 5
    while not buildjob.is_locked(str(job)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert buildjob.status(str(job)) == "running"
    return thread


def test_a_build_of_another_key_is_refused_while_one_of_its_name_runs(tmp_path):
    # A rerun with a changed ref or patch has another key, but the same checkout and build directory.
    name_dir = tmp_path / "cache" / "sgl-kernel"
    first, second = name_dir / "key1", name_dir / "key2"
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "CMakeCache.txt").write_text("the running build's tree\n")
    thread = running_in_thread(first, tmp_path, 3)
    try:
        with pytest.raises(buildjob.JobError, match=r"a build of sgl-kernel is already running in .*key1 \(key key1\)"):
            buildjob.run(
                str(second), argv=["true"], cwd=str(tmp_path), env=dict(os.environ), info={}, timeout_s=30,
                clean_paths=["build"],
            )  # fmt: skip
        # Nothing of the running build was touched; the refused key says why it did not build.
        assert (tmp_path / "build" / "CMakeCache.txt").exists()
        assert buildjob.status(str(first)) == "running"
        assert buildjob.status(str(second)) == "failed"
        assert "key1" in buildjob.read_state(str(second))["reason"]
        assert buildjob.running_job(str(name_dir)) == str(first)
    finally:
        thread.join()
    assert buildjob.running_job(str(name_dir)) is None
    # Once it has ended, the other key builds.
    assert start(second, tmp_path)["status"] == "succeeded"


def test_a_build_holding_only_its_key_lock_still_blocks_its_name(tmp_path):
    # A build started before names had a lock holds its key's lock alone.
    name_dir = tmp_path / "flash-attn"
    old = name_dir / "old"
    old.mkdir(parents=True)
    with open(old / "build.lock", "a", encoding="utf-8") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(buildjob.JobError, match="already running"):
            start(name_dir / "new", tmp_path)
    assert start(name_dir / "new", tmp_path)["status"] == "succeeded"


def test_wait_name_follows_the_running_build_of_the_name_whatever_its_key(tmp_path):
    name_dir = tmp_path / "flash-attn"
    assert buildjob.wait_name(str(name_dir), 0)["status"] == "idle"  # no cache directory yet
    start(name_dir / "done", tmp_path)
    idle = buildjob.wait_name(str(name_dir), 0)
    assert idle["status"] == "idle" and idle["done"] and idle["key"] is None
    thread = running_in_thread(name_dir / "key2", tmp_path, 1)
    try:
        report = buildjob.wait_name(str(name_dir), 0.1, poll_s=0.05)
        assert report["status"] == "running" and not report["done"] and report["key"] == "key2"
        final = buildjob.wait_name(str(name_dir), 10, poll_s=0.05)
    finally:
        thread.join()
    # It ended while followed: its end is reported (the fake build made no wheel).
    assert final["done"] and final["status"] == "failed" and final["key"] == "key2"


def test_the_name_lock_is_hidden_from_a_listing_of_the_keys(tmp_path):
    name_dir = tmp_path / "demo-ext"
    start(name_dir / "k1", tmp_path)
    assert (name_dir / buildjob.NAME_LOCK).exists()
    assert [e for e in os.listdir(name_dir) if not e.startswith(".")] == ["k1"]


def test_wait_reports_tail_and_elapsed_of_a_finished_build(tmp_path):
    job = tmp_path / "k"
    start(job, tmp_path)
    report = buildjob.wait(str(job), wait_s=1)
    assert report["done"] and report["status"] == "cached"
    assert report["tail"][-1].startswith("# finished after")
    assert report["wheel"].endswith(".whl")


def test_a_job_that_died_without_its_end_state_is_lost(tmp_path):
    job = tmp_path / "k"
    job.mkdir()
    (job / "state.json").write_text(json.dumps({"status": "running", "pid": 999999, "started": time.time() - 60}))
    report = buildjob.wait(str(job), wait_s=0)
    assert report["status"] == "lost" and "lost" in report["reason"]


def test_tail_keeps_the_last_state_of_redrawn_progress_lines(tmp_path):
    log = tmp_path / "log"
    log.write_text("a\n[1/9] cc\r[5/9] cc\r[9/9] cc\nz\n")
    assert buildjob.tail(str(log), 2) == ["[9/9] cc", "z"]
    assert buildjob.tail(str(tmp_path / "none")) == []


def test_elapsed_is_human_readable():
    assert buildjob.format_elapsed(59) == "0m59s"
    assert buildjob.format_elapsed(3 * 3600 + 61) == "3h01m01s"


def test_placeholders_expand_and_leave_cmake_variables_alone():
    values = {"jobs": 12, "threads": 2, "cuda_home": "/usr/local/cuda-13.0"}
    env = expand_environment(
        {
            "CPLUS_INCLUDE_PATH": "{cuda_home}/include/cccl${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}",
            "MAX_JOBS": "{jobs}",
        },
        values,
    )
    assert env == {
        "CPLUS_INCLUDE_PATH": "/usr/local/cuda-13.0/include/cccl${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}",
        "MAX_JOBS": "12",
    }
    assert variables_using({"MAX_JOBS": "{jobs}", "X": "1", "CMAKE_ARGS": "-DT={threads}"}) == [
        "CMAKE_ARGS",
        "MAX_JOBS",
    ]
    with pytest.raises(ValueError, match="cuda_home"):
        expand("{cuda_home}/bin", {"cuda_home": ""})


def test_cuda_version_from_version_json_or_txt(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a/version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": "13.0.1"}}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b/version.txt").write_text("CUDA Version 11.0.228\n")
    assert cuda_version(str(tmp_path / "a")) == "13.0.1"
    assert cuda_version(str(tmp_path / "b")) == "11.0.228"
    assert cuda_version(str(tmp_path / "none")) == ""
    assert cuda_version("") == ""


def test_cuda_version_from_nvcc_when_the_toolkit_has_no_version_file(tmp_path):
    # The lent H200's CUDA 13.0 has no version.json: nvcc says which toolkit it is.
    out = (
        "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0\n"
    )
    assert nvcc_release(out) == "13.0.88"
    assert cuda_version(str(tmp_path), lambda: out) == "13.0.88"
    assert cuda_version(str(tmp_path), lambda: "no nvcc here") == ""


def test_installed_from_compares_the_recorded_wheel_path(tmp_path):
    site = tmp_path / "site"
    dist = site / "flash_attn-2.8.3.dist-info"
    dist.mkdir(parents=True)
    wheel = "/var/cache/inferhost/builds/flash-attn/abc/flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl"
    (dist / "direct_url.json").write_text(json.dumps({"url": "file://" + wheel, "archive_info": {}}))
    assert wheel_project(wheel) == "flash-attn"
    assert installed_from(str(site), wheel)
    assert not installed_from(str(site), wheel.replace("/abc/", "/def/"))
    assert not installed_from(str(tmp_path / "none"), wheel)


def test_a_job_not_started_yet_is_starting_within_the_grace_and_absent_after(tmp_path):
    """The role follows a build it has just started detached: no trace of it yet is no end, for a while."""
    job = tmp_path / "demo" / "k1"
    now = [0.0]

    def clock():
        return now[0]

    def sleep(seconds):
        now[0] += seconds

    report = buildjob.wait(str(job), wait_s=5, poll_s=1, clock=clock, sleep=sleep, start_grace_s=30)
    assert report["status"] == "starting" and report["done"] is False and now[0] == 5
    report = buildjob.wait(str(job), wait_s=60, poll_s=1, clock=clock, sleep=sleep, start_grace_s=10)
    assert report["status"] == "absent" and report["done"] is True and now[0] == 15
    assert buildjob.wait(str(job), wait_s=60, poll_s=1, clock=clock, sleep=sleep)["status"] == "absent"
