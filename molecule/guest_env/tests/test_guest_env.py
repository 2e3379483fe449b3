"""The guest environment as the roles leave it: uv, the environments, the driver userspace, the CUDA
toolkits and the source-built wheel, checked inside the containers."""

import json
import shlex

SERVE = "/opt/venvs/serve"
PY = f"{SERVE}/bin/python"
VERSIONS = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"


def versions(host, *names):
    return json.loads(host.check_output(shlex.join([PY, "-c", VERSIONS, *names])))


# --- nvidia_userspace and cuda_toolkit -----------------------------------------------------------

DRIVER = "590.48.01"


def is_vm(host):
    # molecule.yml: the trixie instance is the VM variant, the bookworm one the container.
    return host.backend.get_hostname().endswith("-trixie")


def dpkg(host, name):
    """(selection+state, version) of a package, or None when dpkg does not know it."""
    out = host.run(shlex.join(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${Version}", name]))
    if out.rc != 0:
        return None
    state, version = out.stdout.split("|")
    return state.strip(), version


def test_the_driver_is_the_pinned_version_and_held(host):
    packages = ["nvidia-open"] if is_vm(host) else ["libnvidia-compute", "nvidia-utils"]
    for name in packages:
        assert dpkg(host, name) == ("hi", f"{DRIVER}-1"), name
    assert dpkg(host, f"nvidia-driver-pinning-{DRIVER}") == ("ii", f"{DRIVER}-1")


def test_the_pin_wins_over_the_newer_driver_in_the_repository(host):
    # The stand-in repository also has 595.45.04; apt's candidate must stay the pinned version.
    policy = host.check_output("apt-cache policy libnvidia-compute")
    assert "595.45.04-1" in policy and f"Candidate: {DRIVER}-1" in policy


def test_the_container_has_no_kernel_module_and_the_vm_has_dkms(host):
    dkms = dpkg(host, "nvidia-dkms-open")
    if is_vm(host):
        assert dkms == ("ii", f"{DRIVER}-1")
    else:
        assert dkms is None or dkms[0][1] != "i"  # nvidia-utils recommends it: not installed
        assert dpkg(host, "nvidia-open") is None


def test_the_userspace_tools_are_the_drivers_version(host):
    assert f"Driver Version: {DRIVER}" in host.check_output("nvidia-smi")


def test_cuda_toolkits_side_by_side_with_13_0_the_default(host):
    assert "release 12.8, V12.8.93" in host.check_output("/usr/local/cuda-12.8/bin/nvcc --version")
    assert "release 13.0, V13.0.88" in host.check_output("/usr/local/cuda-13.0/bin/nvcc --version")
    assert host.file("/usr/local/cuda").linked_to == "/usr/local/cuda-13.0"
    assert "link currently points to /usr/local/cuda-13.0" in host.check_output("update-alternatives --display cuda")


def test_login_shells_find_the_default_nvcc(host):
    assert host.check_output("bash -lc 'command -v nvcc'") == "/usr/local/cuda/bin/nvcc"
    assert host.file("/etc/ld.so.conf.d/inferhost-cuda.conf").contains("^/usr/local/cuda/lib64$")


# --- python_env ----------------------------------------------------------------------------------


def test_uv_is_the_pinned_version(host):
    assert host.check_output("uv --version").split()[1] == "0.13.9"
    assert host.file("/usr/local/bin/uv").linked_to == "/opt/inferhost/uv/bin/uv"


def test_the_environment_has_exactly_the_pinned_versions(host):
    assert versions(host, "pluggy", "iniconfig", "packaging", "pytest", "requests") == {
        "pluggy": "1.5.0",
        "iniconfig": "2.0.0",
        "packaging": "24.2",
        "pytest": "8.3.4",
        "requests": "2.32.3",
    }


def test_no_deps_step_installed_no_dependencies(host):
    # requests depends on idna, urllib3, certifi and charset-normalizer: --no-deps left them out.
    probe = host.run(shlex.join([PY, "-c", "import importlib.metadata as m; m.version('idna')"]))
    assert probe.rc != 0 and "PackageNotFoundError" in probe.stderr


def test_the_spec_is_recorded_in_the_environment(host):
    spec = json.loads(host.file(f"{SERVE}/.inferhost/environment.json").content_string)
    assert spec["name"] == "serve" and [s["name"] for s in spec["steps"]][0] == "pinned base"
    assert host.file(f"{SERVE}/.inferhost/constraints.txt").content_string == "packaging<25\n"
    assert host.file(f"{SERVE}/.inferhost/overrides.txt").content_string == ""


def test_the_environment_uses_the_system_python(host):
    cfg = host.file(f"{SERVE}/pyvenv.cfg").content_string
    assert "home = /usr/bin" in cfg
    assert host.check_output(f"{PY} -c 'import sys; print(sys.base_prefix)'") == "/usr"


# --- source_build --------------------------------------------------------------------------------

CACHE = "/var/cache/inferhost/wheels/demo-ext"
CC_LOG = "/var/log/inferhost-test-cc.log"


def build_dirs(host):
    keys = host.check_output(f"ls -1 {CACHE}").split()
    return {key: json.loads(host.file(f"{CACHE}/{key}/build.json").content_string) for key in keys}


def test_the_installed_extension_carries_the_current_patch(host):
    assert host.check_output(f"{PY} -c 'import demo_ext; print(demo_ext.answer())'") == "42"


def test_each_patch_set_built_once_and_no_cache_hit_started_a_compiler(host):
    # prepare built with patch answer-40 against iniconfig 2.0.0 (the nightly torch's part), then against
    # 2.1.0 (a rebuild), then 2.0.0 again (a cache hit, prepare checks the count); converge built answer-42.
    # The idempotence and --check runs that followed found everything in the cache and compiled nothing.
    compiles = [line for line in host.file(CC_LOG).content_string.splitlines() if " -c src/native.c " in line]
    assert len(compiles) == 3
    builds = build_dirs(host)
    patches = sorted(b["key_inputs"]["patches"][0]["name"] for b in builds.values())
    assert patches == ["answer-40", "answer-40", "answer-42"]


def test_a_new_nightly_kept_the_previous_wheel_and_both_name_what_they_linked(host):
    # Each linked package as "<version> files-sha256:<digest of its installed files>".
    linked = sorted(
        b["key_inputs"]["linked_packages"]["iniconfig"].split()[0]
        for b in build_dirs(host).values()
        if b["key_inputs"]["patches"][0]["name"] == "answer-40"
    )
    assert linked == ["2.0.0", "2.1.0"]
    for key, build in build_dirs(host).items():
        assert host.check_output(f"ls {CACHE}/{key}/*.whl"), build


def test_the_installed_wheel_is_the_one_of_the_current_key(host):
    current = [key for key, b in build_dirs(host).items() if b["key_inputs"]["patches"][0]["name"] == "answer-42"]
    assert len(current) == 1
    wheel = host.check_output(f"ls {CACHE}/{current[0]}/*.whl")
    direct_url = host.check_output(
        f"cat {SERVE}/lib/python3*/site-packages/inferhost_demo_ext-1.0.dist-info/direct_url.json"
    )
    assert json.loads(direct_url)["url"] == f"file://{wheel}"


def test_the_computed_job_count_reached_the_build(host):
    build = next(b for b in build_dirs(host).values() if b["key_inputs"]["patches"][0]["name"] == "answer-42")
    plan = build["parallelism"]
    seen = json.loads(host.check_output(f"{PY} -c 'import demo_ext, json; print(json.dumps(demo_ext.BUILD))'"))
    assert seen["MAX_JOBS"] == str(plan["jobs"]) and seen["NVCC_THREADS"] == str(plan["threads"])
    # The formula, from the figures the plan recorded: memory first, then cores, then the cap of 3.
    by_memory = int((plan["available_gb"] - 1) // (1 * plan["threads"]))
    assert plan["jobs"] == min(by_memory, plan["cpus"] // plan["threads"], 3) >= 1
    assert seen["CC"] == "/usr/local/bin/cc-logged" and seen["DEMO_FLAG"] == "-DSTANDIN=1"


def test_cuda_home_came_from_the_build_data_not_the_path(host):
    # /usr/local/cuda (and the PATH of login shells) is 13.0; the build names 12.8.
    seen = json.loads(host.check_output(f"{PY} -c 'import demo_ext, json; print(json.dumps(demo_ext.BUILD))'"))
    assert seen["CUDA_HOME"] == "/usr/local/cuda-12.8"
    build = next(b for b in build_dirs(host).values() if b["key_inputs"]["patches"][0]["name"] == "answer-42")
    assert build["key_inputs"]["cuda_version"] == "12.8.93"


def test_the_key_holds_the_compiler_and_the_build_packages_versions(host):
    # CC is the logging front end, which runs gcc: the key holds gcc's own version line. CXX is unset:
    # g++, by its version line, or named as not found (molecule.yml installs gcc alone).
    build = next(b for b in build_dirs(host).values() if b["key_inputs"]["patches"][0]["name"] == "answer-42")
    inputs = build["key_inputs"]
    assert inputs["compilers"]["CC"] == host.check_output("gcc --version").splitlines()[0].strip()
    gxx = host.run("g++ --version")
    assert inputs["compilers"]["CXX"] == (gxx.stdout.splitlines()[0].strip() if gxx.rc == 0 else "g++: not found")
    numa = dpkg(host, "libnuma-dev")
    assert inputs["system_packages"]["libnuma-dev"].startswith(numa[1] + " ")
    assert inputs["system_packages"]["libibverbs-dev"] == "not installed"


def test_every_key_of_a_name_built_under_the_names_lock(host):
    # One build per name at a time, whatever its key: the lock is the name's, hidden from the key listing.
    assert host.file(f"{CACHE}/.build.lock").is_file
    assert ".build.lock" not in build_dirs(host)


def test_each_build_left_its_log(host):
    for key in build_dirs(host):
        log = host.file(f"{CACHE}/{key}/build.log").content_string
        assert "# command: /usr/local/bin/uv build --wheel --no-build-isolation" in log
        assert "# env MAX_JOBS=" in log and "# finished after" in log and ": ok" in log.splitlines()[-1]


def test_the_wheel_was_installed_without_its_dependencies(host):
    probe = host.run(
        shlex.join([PY, "-c", "import importlib.metadata as m; m.version('inferhost-demo-missing-dependency')"])
    )
    assert probe.rc != 0


def test_the_source_checkout_carries_exactly_the_patch_set(host):
    src = "/var/lib/inferhost/source-build/src/demo-ext"
    assert host.check_output(f"git -C {src} status --porcelain --untracked-files=no").split() == ["M", "src/native.c"]
    assert "#define ANSWER 42" in host.file(f"{src}/src/native.c").content_string
