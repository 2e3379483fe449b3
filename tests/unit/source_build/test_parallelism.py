"""The build-parallelism formula: memory first, then cores, then the inventory's cap; never an OOM."""

from pathlib import Path

import pytest
import yaml
from source_build.parallelism import (
    ParallelismError,
    arch_count,
    available_bytes,
    cgroup_headroom,
    parse_meminfo,
    plan,
)

GIB = 1024**3
ROOT = Path(__file__).resolve().parents[3]

MEMINFO = """MemTotal:       527981900 kB
MemFree:        400000000 kB
MemAvailable:   503316480 kB
Buffers:          100000 kB
Cached:         90000000 kB
SwapTotal:             0 kB
HugePages_Total:       0
"""


def test_reference_host_flash_attn_is_capped_at_twenty_jobs():
    # 480 GiB available, 16 GB reserve, 5 GB per nvcc thread x 4 threads: memory allows 23, the cap is 20.
    got = plan(available_gb=480, cpus=128, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=16)
    assert got["jobs"] == 20 and got["threads"] == 4 and got["limited_by"] == "cap"
    assert got["peak_gb"] == 400  # FACTS: -j20 x 4 threads ~ 400 GB


def test_memory_bounds_the_jobs_when_it_is_the_smallest():
    got = plan(available_gb=100, cpus=128, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=16)
    assert got == {
        "jobs": 4,  # floor(84 / 20)
        "threads": 4,
        "per_job_gb": 20,
        "budget_gb": 84,
        "peak_gb": 80,
        "arches": None,
        "limited_by": "memory",
    }


@pytest.mark.parametrize(
    ("available", "threads", "gb"),
    [(24, 4, 5), (100, 2, 5), (516, 4, 5), (516, 32, 5), (33, 1, 3.5), (700, 8, 4.5)],
)
def test_peak_never_exceeds_the_budget(available, threads, gb):
    got = plan(available_gb=available, cpus=256, gb_per_thread=gb, threads_per_job=threads, max_jobs=64, reserve_gb=8)
    assert got["jobs"] >= 1
    assert got["jobs"] * got["threads"] * gb <= available - 8


def test_sgl_kernel_default_threads_would_oom_so_memory_limits_it():
    # upstream default: 32 nvcc threads per job; -j20 x 32 ran the reference host out of memory.
    got = plan(available_gb=480, cpus=128, gb_per_thread=5, threads_per_job=32, max_jobs=20, reserve_gb=16)
    assert got["jobs"] == 2 and got["limited_by"] == "memory"


def test_cores_bound_the_jobs_on_a_small_cpu():
    got = plan(available_gb=500, cpus=16, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=16)
    assert got["jobs"] == 4 and got["limited_by"] == "cpus"


def test_threads_are_lowered_before_the_build_is_refused():
    # 14 GB left: one job at 4 threads needs 20 GB; at 2 threads it fits.
    got = plan(available_gb=30, cpus=8, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=16)
    assert got["jobs"] == 1 and got["threads"] == 2


def test_no_room_for_one_thread_is_refused_with_the_numbers():
    with pytest.raises(ParallelismError, match=r"needs 5 GB, 3\.0 GB are left"):
        plan(available_gb=19, cpus=8, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=16)


@pytest.mark.parametrize(
    "bad",
    [
        {"gb_per_thread": 0},
        {"threads_per_job": 0},
        {"max_jobs": 0},
        {"reserve_gb": -1},
    ],
)
def test_nonsense_inputs_are_refused(bad):
    args = {"available_gb": 100, "cpus": 8, "gb_per_thread": 5, "threads_per_job": 4, "max_jobs": 20, "reserve_gb": 8}
    with pytest.raises(ParallelismError):
        plan(**{**args, **bad})


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("120", 1),
        ("80;90;100;120", 4),
        ("8.0 9.0+PTX", 3),
        ("12.0a", 1),
        ("90a;120a", 2),
        ("90a, 120a ;", 2),
        ("120;120", 1),
        ("", 0),
        (None, 0),
    ],
)
def test_arch_lists_are_counted_in_every_spelling(value, count):
    assert arch_count(value) == count


def test_a_single_arch_build_counts_one_thread_per_job():
    # nvcc --threads compiles the arches of a file in parallel: with one arch, 4 threads asked are 1 used.
    # A 64 GB machine with the example's 32 GB reserve: 32 GB / (5 GB x 1) = 6 jobs, not 32 / (5 x 4) = 1.
    got = plan(available_gb=64, cpus=32, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=32, arches=1)
    assert got["jobs"] == 6 and got["threads"] == 1 and got["per_job_gb"] == 5 and got["arches"] == 1
    assert got["limited_by"] == "memory"


def test_more_arches_than_threads_keep_the_threads_asked_for():
    four = plan(available_gb=100, cpus=128, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=16, arches=4)
    unknown = plan(available_gb=100, cpus=128, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=16)
    six = plan(available_gb=100, cpus=128, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=16, arches=6)
    assert four["jobs"] == unknown["jobs"] == six["jobs"] == 4
    assert four["threads"] == unknown["threads"] == six["threads"] == 4


def test_the_arch_count_frees_cores_too():
    # 16 cores: 4 jobs at 4 threads, 16 at one thread (memory allows 96).
    got = plan(available_gb=500, cpus=16, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=16, arches=1)
    assert got["jobs"] == 16 and got["limited_by"] == "cpus"


def test_a_build_of_no_arch_is_refused():
    with pytest.raises(ParallelismError, match="no architecture"):
        plan(available_gb=100, cpus=8, gb_per_thread=5, threads_per_job=4, max_jobs=20, reserve_gb=8, arches=0)


def test_the_example_flash_attn_build_names_its_arch_list():
    # The example's flash-attn builds sm_120 only and says so: its plan counts one thread per job.
    data = yaml.safe_load((ROOT / "inventory/example/group_vars/inference_guests/source_build.yml").read_text())
    build = next(b for b in data["source_build_builds"] if b["name"] == "flash-attn")
    arches = arch_count(build["environment"][build["arch_list_variable"]])
    assert arches == 1
    reserve = data["source_build_memory_reserve_gb"]
    got = plan(
        available_gb=64,
        cpus=64,
        gb_per_thread=build["gb_per_thread"],
        threads_per_job=build["threads_per_job"],
        max_jobs=data["source_build_max_jobs"],
        reserve_gb=reserve,
        arches=arches,
    )
    assert got["jobs"] == 6


def test_meminfo_is_read_in_bytes():
    info = parse_meminfo(MEMINFO)
    assert info["MemAvailable"] == 503316480 * 1024
    assert info["HugePages_Total"] == 0


def test_available_is_memavailable_without_a_cgroup_limit():
    assert available_bytes(MEMINFO, "max", "123") == 503316480 * 1024
    assert available_bytes(MEMINFO) == 503316480 * 1024


def test_a_cgroup_limit_below_the_machine_wins():
    # An LXC guest limited to 64 GiB with 10 GiB in use has 54 GiB, whatever the host has free.
    assert available_bytes(MEMINFO, str(64 * GIB), str(10 * GIB)) == 54 * GIB


def test_cgroup_v1_unlimited_marker_is_no_limit():
    assert cgroup_headroom("9223372036854771712", "1000") is None
    assert cgroup_headroom("", "1") is None
    assert cgroup_headroom(str(8 * GIB), str(9 * GIB)) == 0


def test_old_kernels_without_memavailable_fall_back_to_free_plus_cache():
    assert available_bytes("MemFree: 100 kB\nCached: 50 kB\n") == 150 * 1024
