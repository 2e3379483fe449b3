"""The wheel cache key changes with every input that changes the binary, and only with those."""

import pytest
from guest_env.buildplan import strip_parallelism
from guest_env.cachekey import cache_key, key_inputs

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
}


def key(**change):
    args = {**BASE, **change}
    args["environment"] = strip_parallelism(args["environment"])
    return cache_key(key_inputs(**args))


def test_same_inputs_same_key():
    assert key() == key()
    assert len(key()) == 20


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
