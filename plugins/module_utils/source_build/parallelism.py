"""How many compiler jobs a source build may run at once without running the machine out of memory.

CUDA builds are bound by memory, not by cores: one nvcc process compiling a template-heavy kernel
with ``--threads N`` holds roughly N times a per-thread cost (flash-attn measured 3-5 GB per nvcc
thread; 20 jobs x 4 threads came to ~400 GB). On a machine without swap, too many jobs end in the
OOM killer hours into a build, so the job count is derived from memory first:

    threads = min(threads per job, arches built)   (threads per job when the arch count is unknown)
    budget  = available memory - reserve
    per_job = GB per nvcc thread x threads
    jobs    = min(floor(budget / per_job), cpus // threads, cap)

nvcc's ``--threads`` compiles the architectures of one file in parallel, one thread per architecture:
a build of one arch runs one thread per job whatever it asks for, so counting the threads it asked for
would reserve memory (and cores) that no compiler uses. Lowering the threads to the arch count, and
passing that lower value to the build, keeps the estimate true even if the count were wrong.

``available`` is the smaller of the kernel's MemAvailable and the cgroup's remaining limit (an LXC
guest or a systemd slice may be limited below the machine). Swap is never counted: a build that
swaps runs for days instead of hours. If not even one job fits, the threads per job are lowered; if
one thread does not fit either, the build is refused with the numbers, before it starts.
"""

from __future__ import annotations

import re

GIB = 1024**3


class ParallelismError(ValueError):
    """Not even one compiler job fits in the memory that is left."""


_ARCH_SEPARATORS = re.compile(r"[;,\s]+")


def arch_count(value):
    """How many device architectures an arch list makes nvcc compile, one per ``--threads`` thread.

    Accepts the spellings builds use: ``120`` and ``80;90;100;120`` (FLASH_ATTN_CUDA_ARCHS), ``8.0 9.0+PTX``
    and ``12.0a`` (TORCH_CUDA_ARCH_LIST), ``90a;120a`` (CMAKE_CUDA_ARCHITECTURES), separated by ``;``, ``,``
    or blanks. An entry with ``+PTX`` counts twice (machine code and PTX are two targets); the same entry
    twice counts once. Returns 0 for an empty list.
    """
    seen = set()
    count = 0
    for entry in _ARCH_SEPARATORS.split(str(value or "").strip()):
        if not entry or entry.lower() in seen:
            continue
        seen.add(entry.lower())
        count += 2 if entry.upper().endswith("+PTX") else 1
    return count


def parse_meminfo(text):
    """/proc/meminfo as a dict of bytes (values given in kB there)."""
    values = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        factor = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
        values[key.strip()] = int(parts[0]) * factor
    return values


def cgroup_headroom(limit_text, usage_text):
    """Bytes left below a cgroup memory limit, or None when the cgroup is unlimited or unknown.

    cgroup v2 writes ``max`` for no limit; cgroup v1 writes a huge number (page-rounded LONG_MAX).
    """
    if limit_text is None or usage_text is None:
        return None
    limit_text, usage_text = limit_text.strip(), usage_text.strip()
    if not limit_text or limit_text == "max" or not limit_text.isdigit() or not usage_text.isdigit():
        return None
    limit = int(limit_text)
    if limit >= 2**60:
        return None
    return max(0, limit - int(usage_text))


def available_bytes(meminfo_text, cgroup_limit_text=None, cgroup_usage_text=None):
    """Memory a build can use now: MemAvailable, lowered to the cgroup's headroom when that is smaller."""
    info = parse_meminfo(meminfo_text)
    # Kernels before 3.14 have no MemAvailable: free plus page cache is the closest estimate.
    available = info.get("MemAvailable", info.get("MemFree", 0) + info.get("Cached", 0))
    headroom = cgroup_headroom(cgroup_limit_text, cgroup_usage_text)
    if headroom is not None:
        available = min(available, headroom)
    return available


def plan(*, available_gb, cpus, gb_per_thread, threads_per_job, max_jobs, reserve_gb, arches=None):
    """The job count and threads per job for a build; see the module docstring for the formula.

    ``arches`` is the number of device architectures the build compiles (see arch_count), or None when
    the build does not say: then every thread it asks for is counted.

    Returns a dict: jobs, threads, per_job_gb, budget_gb, peak_gb (jobs x per_job_gb), arches, and
    limited_by (``memory``, ``cpus`` or ``cap``: which bound set the job count).
    """
    if gb_per_thread <= 0:
        raise ParallelismError(f"gb_per_thread must be positive, got {gb_per_thread}")
    if threads_per_job < 1:
        raise ParallelismError(f"threads_per_job must be at least 1, got {threads_per_job}")
    if max_jobs < 1:
        raise ParallelismError(f"max_jobs must be at least 1, got {max_jobs}")
    if reserve_gb < 0:
        raise ParallelismError(f"reserve_gb must not be negative, got {reserve_gb}")
    if arches is not None and arches < 1:
        raise ParallelismError(f"the build compiles no architecture (arch count {arches})")
    budget = available_gb - reserve_gb
    threads = threads_per_job if arches is None else min(threads_per_job, arches)
    if budget < gb_per_thread * threads:
        # Not even one job at the requested threads: fewer threads per job before giving up.
        threads = int(budget // gb_per_thread) if budget > 0 else 0
        if threads < 1:
            raise ParallelismError(
                f"not enough memory for one compiler job: one nvcc thread needs {gb_per_thread:g} GB, "
                f"{max(budget, 0):.1f} GB are left ({available_gb:.1f} GB available minus a {reserve_gb:g} GB "
                "reserve). Free memory, lower the reserve, or build on a larger machine; swap is not counted."
            )
    per_job = gb_per_thread * threads
    bounds = {
        "memory": int(budget // per_job),
        "cpus": max(1, int(cpus) // threads),
        "cap": int(max_jobs),
    }
    limited_by = min(bounds, key=lambda name: (bounds[name], ["cap", "memory", "cpus"].index(name)))
    jobs = bounds[limited_by]
    return {
        "jobs": jobs,
        "threads": threads,
        "per_job_gb": round(per_job, 3),
        "budget_gb": round(budget, 3),
        "peak_gb": round(jobs * per_job, 3),
        "arches": arches,
        "limited_by": limited_by,
    }
