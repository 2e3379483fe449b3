"""The wheel cache key changes with every input that changes the binary, and only with those."""

import pytest
from source_build.buildplan import strip_parallelism
from source_build.cachekey import (
    DPKG_QUERY_FORMAT,
    cache_key,
    compiler_commands,
    compiler_version,
    dpkg_versions,
    key_inputs,
)

BASE = {
    "name": "sgl-kernel",
    "commit": "c86ca12875bbdea8f39267f02a0d55c68ea99d8e",
    "subdirectory": "sgl-kernel",
    "patches": [{"name": "fa3-off", "diff": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"}],
    "environment": {
        "CMAKE_ARGS": "-DSGL_KERNEL_COMPILE_THREADS={threads} -DENABLE_BELOW_SM90=OFF",
        "CMAKE_BUILD_PARALLEL_LEVEL": "{jobs}",
        "CPLUS_INCLUDE_PATH": "{cuda_home}/include/cccl",
    },
    "build_args": ["-Cbuild-dir=build"],
    "build_requirements": {"cmake": "3.31.6", "scikit-build-core": "0.11.5"},
    "linked_packages": {"torch": "2.10.0.dev20251215+cu130"},
    "cuda_version": "13.0.1",
    "python_tag": "cp312",
    "machine": "x86_64",
    "compilers": {"CC": "gcc (Debian 12.2.0-14+deb12u1) 12.2.0", "CXX": "g++ (Debian 12.2.0-14+deb12u1) 12.2.0"},
    "system_packages": {"libibverbs-dev": "not installed", "libnuma-dev": "2.0.16-1 amd64"},
}
# dpkg-query -W -f DPKG_QUERY_FORMAT libnuma-dev libibverbs-dev, before and after apt-get install libibverbs-dev.
NUMA_ONLY = "libnuma-dev\tamd64\tii \t2.0.16-1\n"
WITH_IBVERBS = NUMA_ONLY + "libibverbs-dev\tamd64\tii \t44.0-2\n"


def key(**change):
    args = {**BASE, **change}
    args["environment"] = strip_parallelism(args["environment"])
    return cache_key(key_inputs(**args))


def test_the_key_of_known_inputs_is_pinned():
    # BASE with its parallelism placeholders blanked: the first 20 hex digits of the sha256 of key_inputs' canonical
    # JSON, computed once (each other input gives another key: the test below). A new value means every cached wheel
    # is rebuilt: change it only on purpose.
    assert key() == "020cf3f8617201909478"


@pytest.mark.parametrize(
    "change",
    [
        {"commit": "0" * 40},
        {"subdirectory": "other"},
        {"patches": []},
        {"patches": [{"name": "fa3-off", "diff": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+c\n"}]},
        {"linked_packages": {"torch": "2.10.0.dev20251216+cu130"}},
        {"linked_packages": {"torch": "2.10.0.dev20251215+cu128"}},
        {"cuda_version": "12.8.1"},
        {"python_tag": "cp313"},
        {"machine": "aarch64"},
        {"build_requirements": {"cmake": "3.31.7", "scikit-build-core": "0.11.5"}},
        {"build_args": ["-Cbuild-dir=build", "--verbose"]},
        {"environment": {**BASE["environment"], "CMAKE_ARGS": "-DSGL_KERNEL_COMPILE_THREADS={threads}"}},
        {"environment": {**BASE["environment"], "TORCH_CUDA_ARCH_LIST": "12.0a"}},
        {"compilers": {**BASE["compilers"], "CXX": "g++ (Debian 12.2.0-14+deb12u2) 12.2.0"}},
        {"compilers": {**BASE["compilers"], "CC": "clang version 18.1.8"}},
        {"compilers": {**BASE["compilers"], "CUDAHOSTCXX": "g++-12 (Debian 12.2.0-14) 12.2.0"}},
        {"system_packages": {**BASE["system_packages"], "libnuma-dev": "2.0.18-1 amd64"}},
        {"system_packages": {**BASE["system_packages"], "libibverbs-dev": "44.0-2 amd64"}},
        {"salt": "rebuild-2026-02"},
    ],
)
def test_each_binary_input_changes_the_key(change):
    assert key(**change) != key()


def test_parallelism_does_not_change_the_key():
    # Same build, other job counts: the placeholders are blanked before hashing.
    env = {**BASE["environment"], "CMAKE_BUILD_PARALLEL_LEVEL": "{jobs}"}
    assert key(environment=env) == key()
    fewer = key_inputs(**{**BASE, "environment": strip_parallelism(BASE["environment"])})
    assert "{threads}" not in fewer["environment"]["CMAKE_ARGS"]


def test_named_parallelism_variables_are_left_out():
    literal = {**BASE["environment"], "MAX_JOBS": "20"}
    other = {**BASE["environment"], "MAX_JOBS": "8"}
    a = cache_key(key_inputs(**{**BASE, "environment": literal, "parallelism_variables": ["MAX_JOBS"]}))
    b = cache_key(key_inputs(**{**BASE, "environment": other, "parallelism_variables": ["MAX_JOBS"]}))
    assert a == b


def test_patch_order_matters_and_a_missing_final_newline_does_not():
    p1 = {"name": "a", "diff": "one\n"}
    p2 = {"name": "b", "diff": "two\n"}
    assert key(patches=[p1, p2]) != key(patches=[p2, p1])
    assert key(patches=[{"name": "a", "diff": "one"}]) == key(patches=[{"name": "a", "diff": "one\n"}])


def test_dict_order_does_not_matter():
    reordered = dict(reversed(list(BASE["environment"].items())))
    assert key(environment=reordered) == key()


def test_installing_libibverbs_dev_changes_the_key():
    # mscclpp turns on its InfiniBand transport when it finds libibverbs-dev: another binary, another key.
    names = ["libnuma-dev", "libibverbs-dev"]
    before = dpkg_versions(names, NUMA_ONLY)
    after = dpkg_versions(names, WITH_IBVERBS)
    assert before == {"libibverbs-dev": "not installed", "libnuma-dev": "2.0.16-1 amd64"}
    assert after["libibverbs-dev"] == "44.0-2 amd64"
    assert key(system_packages=before) != key(system_packages=after)
    assert key(system_packages=before) == key(system_packages=dpkg_versions(names, NUMA_ONLY))


def test_the_declared_packages_order_and_repeats_do_not_change_the_key():
    a = dpkg_versions(["libnuma-dev", "libibverbs-dev"], WITH_IBVERBS)
    b = dpkg_versions(["libibverbs-dev", "libnuma-dev", "libibverbs-dev"], WITH_IBVERBS)
    assert list(a) == list(b) == ["libibverbs-dev", "libnuma-dev"]
    assert key(system_packages=a) == key(system_packages=b)
    reordered = dict(reversed(list(BASE["compilers"].items())))
    assert key(compilers=reordered) == key()


def test_removed_packages_count_as_not_installed_and_arches_are_listed():
    out = (
        "libnuma-dev\tamd64\trc \t2.0.16-1\n"  # removed, configuration files left
        "libibverbs-dev\tamd64\tii \t44.0-2\n"
        "libibverbs-dev\ti386\tii \t44.0-2\n"
        "garbage line\n"
    )
    got = dpkg_versions(["libnuma-dev", "libibverbs-dev"], out)
    assert got == {"libibverbs-dev": "44.0-2 amd64, 44.0-2 i386", "libnuma-dev": "not installed"}
    assert dpkg_versions([], out) == {}
    assert "${Version}" in DPKG_QUERY_FORMAT and DPKG_QUERY_FORMAT.count("\t") == 3


def test_compilers_are_the_ones_the_build_environment_names():
    assert compiler_commands({}) == {"CC": "gcc", "CXX": "g++"}
    assert compiler_commands({"CC": "/usr/local/bin/cc-logged", "CXX": "", "MAX_JOBS": "4"}) == {
        "CC": "/usr/local/bin/cc-logged",
        "CXX": "g++",
    }
    assert compiler_commands({"CUDAHOSTCXX": "g++-12", "NVCC_CCBIN": "/usr/bin/g++-12"}) == {
        "CC": "gcc",
        "CUDAHOSTCXX": "g++-12",
        "CXX": "g++",
        "NVCC_CCBIN": "/usr/bin/g++-12",
    }


def test_a_compiler_is_known_by_the_first_line_it_prints():
    out = "\ngcc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n"
    assert compiler_version(out) == "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
    assert compiler_version("", "clang version 18.1.8\n") == "clang version 18.1.8"
    assert compiler_version("") == ""
