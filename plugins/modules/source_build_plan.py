#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.python_env.pins import installed_versions, normalize_name
from ansible.module_utils.python_env.records import find_site_packages, fingerprint
from ansible.module_utils.source_build import buildjob, cachekey, parallelism
from ansible.module_utils.source_build.buildplan import (
    cuda_version,
    expand_environment,
    installed_from,
    strip_parallelism,
)

DOCUMENTATION = r"""
module: source_build_plan
short_description: Plan a cached source build - cache key, job count, environment, cache and install state
description:
  - Computes everything a source build needs before it starts, and changes nothing.
  - The wheel cache key covers every input that changes the binary (commit, patch set, environment,
    build arguments, resolved build requirements, versions of the linked packages such as torch with its
    CUDA build, CUDA version, Python tag, machine, the host compilers' versions, the versions of the
    system packages in O(key_system_packages)); parallelism is left out.
  - The job count comes from the memory left on the machine (the smaller of MemAvailable and the
    cgroup's headroom, swap never counted), the measured GB per compiler thread, the cores and a cap.
  - Reports whether the cache already holds the wheel, whether a build of this key is running, and
    whether the target environment has exactly this wheel installed.
options:
  name:
    description: Name of the build (a directory name under O(cache_dir)).
    type: str
    required: true
  source:
    description: The git work tree, patched.
    type: path
    required: true
  subdirectory:
    description: Directory of the Python project inside O(source).
    type: str
    default: ""
  patches:
    description: The patch set (name, diff), for the key.
    type: list
    elements: dict
    default: []
  target:
    description: Root of the virtual environment the wheel is for.
    type: path
    required: true
  build_env:
    description: Root of the build environment (build requirements, and the target's packages through a .pth).
    type: path
    required: true
  uv:
    description: Path of the uv binary that runs the build.
    type: path
    required: true
  cuda_home:
    description: CUDA toolkit root for the build (C(CUDA_HOME)); empty for builds without CUDA.
    type: path
    default: ""
  environment:
    description:
      - Build variables. Values may use C({jobs}), C({threads}), C({cuda_home}), C({site_packages}),
        C({build_env}) and C({src}); C({jobs}) and C({threads}) are filled from the plan and kept out of the key.
    type: dict
    default: {}
  process_environment:
    description: Variables for the build process that do not change the binary (proxies, certificates); not in the key.
    type: dict
    default: {}
  parallelism_variables:
    description: Names of variables in O(environment) that only set parallelism; left out of the key.
    type: list
    elements: str
    default: []
  build_args:
    description: Extra arguments to C(uv build) (for example C(-Cbuild-dir=build)).
    type: list
    elements: str
    default: []
  linked_packages:
    description: Packages of the target environment the binary links against (their versions go into the key).
    type: list
    elements: str
    default: []
  gb_per_thread:
    description: Peak memory of one compiler thread, in GB.
    type: float
    required: true
  threads_per_job:
    description: Compiler threads per job (nvcc C(--threads)).
    type: int
    default: 1
  arch_list_variable:
    description:
      - Name of the variable in O(environment) that lists the device architectures the build compiles
        (C(FLASH_ATTN_CUDA_ARCHS) for flash-attn). nvcc runs one C(--threads) thread per architecture, so
        the threads per job are lowered to the number of architectures listed, and the memory estimate with
        them. Empty when the build does not say; then every thread of O(threads_per_job) is counted.
    type: str
    default: ""
  max_jobs:
    description: Upper bound of the job count.
    type: int
    required: true
  reserve_gb:
    description: Memory left to everything else while the build runs, in GB.
    type: float
    default: 16
  available_gb:
    description: Memory to plan with instead of measuring it (for a build started later, or tests).
    type: float
  key_system_packages:
    description:
      - Debian packages whose versions go into the key (C(not installed) for those that are not), read with
        C(dpkg-query). A build that detects a library when it is present (mscclpp and C(libibverbs-dev))
        builds another binary once it is installed.
      - The host compilers' versions are always in the key - C(CC), C(CXX) (C(gcc), C(g++) when the
        build's environment does not set them), C(CUDAHOSTCXX) and C(NVCC_CCBIN) when it does - as each
        one's C(--version) names itself.
    type: list
    elements: str
    default: []
  cache_dir:
    description: Root of the wheel cache.
    type: path
    required: true
  salt:
    description: Free text in the key, to force a rebuild.
    type: str
    default: ""
extends_documentation_fragment:
  - attributes.read_only
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Plan the flash-attn build
  source_build_plan:
    name: flash-attn
    source: /var/lib/inferhost/source-build/src/flash-attn
    target: /opt/venvs/sglang
    build_env: /var/lib/inferhost/source-build/env/flash-attn
    uv: /usr/local/bin/uv
    cuda_home: /usr/local/cuda-13.0
    environment:
      FLASH_ATTN_CUDA_ARCHS: "120"
      MAX_JOBS: "{jobs}"
      NVCC_THREADS: "{threads}"
    linked_packages: [torch]
    key_system_packages: [libnuma-dev, libibverbs-dev]
    gb_per_thread: 5
    threads_per_job: 4
    arch_list_variable: FLASH_ATTN_CUDA_ARCHS
    max_jobs: 20
    cache_dir: /var/cache/inferhost/wheels
  register: plan
"""

RETURN = r"""
key:
  description: The cache key.
  returned: always
  type: str
key_inputs:
  description: What the key was computed from.
  returned: always
  type: dict
job_dir:
  description: Directory of this key in the cache (wheel, log, state).
  returned: always
  type: str
status:
  description: cached, running, failed, lost or absent.
  returned: always
  type: str
wheel:
  description: Path of the cached wheel, when cached.
  returned: always
  type: str
installed:
  description: Whether the target environment has this very wheel installed.
  returned: always
  type: bool
parallelism:
  description: jobs, threads, per_job_gb, budget_gb, peak_gb, arches, limited_by, available_gb, cpus.
  returned: always
  type: dict
argv:
  description: The build command; C({staging}) is replaced by the job.
  returned: always
  type: list
  elements: str
cwd:
  description: Directory the build runs in.
  returned: always
  type: str
environment:
  description: The complete process environment of the build.
  returned: always
  type: dict
"""


PROBE = (
    "import json, platform, sys, sysconfig; "
    "print(json.dumps({'tag': 'cp%d%d' % sys.version_info[:2], 'abi': sysconfig.get_config_var('SOABI') or '', "
    "'machine': platform.machine(), 'purelib': sysconfig.get_path('purelib')}))"
)
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def read(path):
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def measure_available_gb():
    """MemAvailable, lowered to this process's cgroup headroom (v2, then v1)."""
    limit = usage = None
    cgroup = read("/proc/self/cgroup") or ""
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            base = "/sys/fs/cgroup" + parts[2].rstrip("/")
            limit, usage = read(base + "/memory.max"), read(base + "/memory.current")
    if limit is None:
        limit = read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        usage = read("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    return parallelism.available_bytes(read("/proc/meminfo") or "", limit, usage) / parallelism.GIB


def probe_python(module, python):
    try:
        out = subprocess.run([python, "-I", "-c", PROBE], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        module.fail_json(msg=f"cannot run {python}: {err}")
    return json.loads(out)


def git_head(module, source):
    rc, out, err = module.run_command(["git", "-C", source, "rev-parse", "HEAD"])
    if rc != 0:
        module.fail_json(msg=f"{source}: not a git checkout ({err.strip()})")
    return out.strip()


def compiler_versions(module, env):
    """{variable: version line} of the build's host compilers, found on the build's PATH."""
    versions = {}
    for variable, command in cachekey.compiler_commands(env).items():
        argv = shlex.split(command)
        found = shutil.which(argv[0], path=env.get("PATH")) if argv else None
        if not found:
            versions[variable] = f"{command}: not found"
            continue
        rc, out, err = module.run_command([found, *argv[1:], "--version"], environ_update=env)
        line = cachekey.compiler_version(out, err)
        versions[variable] = line if rc == 0 and line else f"{command}: --version failed (rc {rc})"
    return versions


def system_package_versions(module, names):
    """{package: version or "not installed"} of the declared Debian packages."""
    names = cachekey.key_package_names(names)
    if not names:
        return {}
    dpkg_query = module.get_bin_path("dpkg-query")
    if not dpkg_query:
        module.fail_json(
            msg="key_system_packages needs dpkg-query (Debian or Ubuntu) to read package versions; "
            "this machine has none (set source_build_key_system_packages to [] on other systems)"
        )
    argv = [dpkg_query, "-W", "-f", cachekey.DPKG_QUERY_FORMAT, "--", *names]
    rc, out, err = module.run_command(argv, expand_user_and_vars=False)
    # rc 1: some package is unknown to dpkg, which dpkg_versions reports as not installed.
    if rc not in (0, 1):
        module.fail_json(msg=f"dpkg-query failed (rc {rc}): {err.strip()}")
    return cachekey.dpkg_versions(names, out)


def build_environment(module, p, jobs, target_site):
    """(the data's variables expanded, the build's complete process environment)."""
    values = {
        "jobs": jobs["jobs"],
        "threads": jobs["threads"],
        "cuda_home": p["cuda_home"],
        "site_packages": target_site,
        "build_env": p["build_env"],
        "src": p["source"],
    }
    try:
        data_env = expand_environment(p["environment"], values)
    except ValueError as err:
        module.fail_json(msg=f"{p['name']}: {err}")
    path = os.path.join(p["build_env"], "bin")
    env = {"HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    if p["cuda_home"]:
        path += ":" + os.path.join(p["cuda_home"], "bin")
        env.update(
            CUDA_HOME=p["cuda_home"], CUDA_PATH=p["cuda_home"], CUDACXX=os.path.join(p["cuda_home"], "bin", "nvcc")
        )
    env["PATH"] = f"{path}:{BASE_PATH}"
    env.update({k: str(v) for k, v in p["process_environment"].items()})
    env.update(data_env)
    env["VIRTUAL_ENV"] = p["build_env"]
    return data_env, env


def plan_parallelism(module, p):
    """The job count and threads per job, from the memory left, the cores, the cap and the arches built."""
    arches = None
    variable = p["arch_list_variable"]
    if variable:
        if variable not in p["environment"]:
            module.fail_json(
                msg=f"{p['name']}: arch_list_variable names {variable}, which the build's environment does not set; "
                "set it there (the build's own default list is unknown here) or leave arch_list_variable out"
            )
        arches = parallelism.arch_count(p["environment"][variable])
    available = p["available_gb"] if p["available_gb"] is not None else measure_available_gb()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        jobs = parallelism.plan(
            available_gb=available,
            cpus=cpus,
            gb_per_thread=p["gb_per_thread"],
            threads_per_job=p["threads_per_job"],
            max_jobs=p["max_jobs"],
            reserve_gb=p["reserve_gb"],
            arches=arches,
        )
    except parallelism.ParallelismError as err:
        module.fail_json(msg=f"{p['name']}: {err}")
    jobs.update(available_gb=round(available, 1), cpus=cpus)
    return jobs


def plan_key(module, p, python, linked, env):
    """The wheel cache key and the inputs it is computed from, with the commit and CUDA version among them."""
    build_site = find_site_packages(p["build_env"]) or ""
    commit = git_head(module, p["source"])
    nvcc = os.path.join(p["cuda_home"], "bin", "nvcc") if p["cuda_home"] else ""
    cuda = cuda_version(
        p["cuda_home"], lambda: module.run_command([nvcc, "--version"])[1] if os.path.exists(nvcc) else ""
    )
    inputs = cachekey.key_inputs(
        name=p["name"],
        commit=commit,
        subdirectory=p["subdirectory"],
        patches=p["patches"],
        environment=strip_parallelism(p["environment"]),
        parallelism_variables=p["parallelism_variables"],
        build_args=p["build_args"],
        build_requirements=installed_versions(build_site),
        linked_packages={name: f"{version} files-sha256:{digest[:16]}" for name, (version, digest) in linked.items()},
        cuda_version=cuda,
        python_tag=python["abi"] or python["tag"],
        machine=python["machine"],
        compilers=compiler_versions(module, env),
        system_packages=system_package_versions(module, p["key_system_packages"]),
        salt=p["salt"],
    )
    return {"key": cachekey.cache_key(inputs), "key_inputs": inputs, "commit": commit, "cuda_version": cuda}


def cache_state(job_dir, target_site):
    """The key's state in the cache, its wheel when cached, and whether the target has exactly that wheel."""
    state = buildjob.status(job_dir)
    found = buildjob.wheels(job_dir)
    wheel = os.path.join(job_dir, found[0]) if state == "cached" else ""
    return {"status": state, "wheel": wheel, "installed": bool(wheel) and installed_from(target_site, wheel)}


def build_command(p, build_python):
    """The build's argv; the job replaces ``{staging}`` with its output directory."""
    argv = [p["uv"], "build", "--wheel", "--no-build-isolation", "--python", build_python, "--out-dir", "{staging}"]
    return argv + p["build_args"] + ["."]


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "source": {"type": "path", "required": True},
            "subdirectory": {"type": "str", "default": ""},
            "patches": {"type": "list", "elements": "dict", "default": []},
            "target": {"type": "path", "required": True},
            "build_env": {"type": "path", "required": True},
            "uv": {"type": "path", "required": True},
            "cuda_home": {"type": "path", "default": ""},
            "environment": {"type": "dict", "default": {}},
            "process_environment": {"type": "dict", "default": {}},
            "parallelism_variables": {"type": "list", "elements": "str", "default": []},
            "build_args": {"type": "list", "elements": "str", "default": []},
            "linked_packages": {"type": "list", "elements": "str", "default": []},
            "gb_per_thread": {"type": "float", "required": True},
            "threads_per_job": {"type": "int", "default": 1},
            "arch_list_variable": {"type": "str", "default": ""},
            "max_jobs": {"type": "int", "required": True},
            "reserve_gb": {"type": "float", "default": 16},
            "available_gb": {"type": "float"},
            "key_system_packages": {"type": "list", "elements": "str", "default": []},
            "cache_dir": {"type": "path", "required": True},
            "salt": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    target_python = os.path.join(p["target"], "bin", "python")
    build_python = os.path.join(p["build_env"], "bin", "python")
    for path, what in ((target_python, "target environment"), (build_python, "build environment")):
        if not os.path.exists(path):
            module.fail_json(msg=f"the {what} has no interpreter at {path}")
    if p["cuda_home"] and not os.path.isdir(p["cuda_home"]):
        module.fail_json(msg=f"{p['name']}: cuda_home {p['cuda_home']} does not exist (install the toolkit first)")

    python = probe_python(module, target_python)
    target_site = python["purelib"]
    # Version and content digest: PyPI's torch 2.11.0 is a CUDA 13.0 build without a +cu130 label.
    linked = {normalize_name(n): fingerprint(target_site, n) for n in p["linked_packages"]}
    missing = [n for n in p["linked_packages"] if linked[normalize_name(n)] is None]
    if missing:
        module.fail_json(
            msg=f"{p['name']}: {', '.join(missing)} not installed in {p['target']}; the build links against it"
        )

    jobs = plan_parallelism(module, p)
    data_env, env = build_environment(module, p, jobs, target_site)

    key = plan_key(module, p, python, linked, env)
    job_dir = os.path.join(p["cache_dir"], p["name"], key["key"])
    module.exit_json(
        changed=False,
        **key,
        job_dir=job_dir,
        **cache_state(job_dir, target_site),
        parallelism=jobs,
        argv=build_command(p, build_python),
        cwd=os.path.normpath(os.path.join(p["source"], p["subdirectory"])),
        environment=env,
        environment_data=data_env,
        target_site_packages=target_site,
    )


if __name__ == "__main__":
    main()
