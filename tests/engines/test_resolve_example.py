"""The example inventory's Python environments resolve from the real package index, as python_env installs them.

Each environment of inventory/example is resolved with inferhost.envresolve: one ``uv pip compile`` per step, with
the step's indexes, prerelease and --no-deps and the environment's overrides, constraints and exclusions, for the
guests' platform and the environment's Python, with the uv the role installs. Nothing is installed; uv's cache
keeps the package metadata, so a rerun asks the index only whether its pages changed. A pin the index no longer
holds (a removed nightly) or two pins that cannot live together fail here, naming the environment, the step and
the requirement, instead of at a site's first deployment.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from inferhost import envresolve

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventory" / "example" / "hosts.yml"
SOURCE_BUILDS = ROOT / "inventory" / "example" / "group_vars" / "inference_guests" / "source_build.yml"


@pytest.fixture(scope="module")
def verdicts():
    """{environment name: (its data, its verdict)} for every distinct environment of the example's hosts."""
    results = {}
    for target in envresolve.inventory_targets(str(INVENTORY)):
        assert envresolve.uv_version(str(envresolve.BOOTSTRAP_UV)) == target.uv_version
        verdict = envresolve.resolve_environment(
            target.environment,
            uv=str(envresolve.BOOTSTRAP_UV),
            env=envresolve.process_environment(target.process_environment),
        )
        results[target.environment["name"]] = (target.environment, verdict)
    return results


def test_the_example_has_the_sglang_and_the_vllm_environment(verdicts):
    assert set(verdicts) == {"sglang", "vllm"}


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_every_step_of_the_environment_resolves(verdicts, name):
    environment, verdict = verdicts[name]
    assert verdict.ok, verdict.summary()
    assert [step.step for step in verdict.steps] == [step["name"] for step in environment["steps"]]


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_the_environment_ends_with_every_exact_pin_of_its_steps_and_overrides(verdicts, name):
    # What the role's ABI guard checks after the last step: a resolution that moved a pin would fail there.
    environment, verdict = verdicts[name]
    pins = [p for step in environment["steps"] for p in step["packages"] if "==" in p]
    pins += [p for p in environment.get("overrides") or [] if "==" in p]
    assert pins
    for pin in pins:
        package = envresolve.requirement_name(pin)
        specifier = SpecifierSet(pin[len(re.match(r"[A-Za-z0-9._-]+", pin).group(0)) :].split(";")[0].strip())
        assert package in verdict.resolved, f"{name}: {pin} is not in the resolution"
        assert Version(verdict.resolved[package]) in specifier, f"{name}: {pin} resolved to {verdict.resolved[package]}"


def test_the_source_builds_cuda_is_the_cuda_of_their_targets_torch(verdicts):
    # flash-attn and sgl-kernel are compiled with the toolkit of their cuda_home against the target's torch: that
    # torch's CUDA libraries must be of the same major.minor.
    builds = yaml.safe_load(SOURCE_BUILDS.read_text())["source_build_builds"]
    by_path = {environment["path"]: verdict for environment, verdict in verdicts.values()}
    assert builds
    for build in builds:
        toolkit = re.search(r"cuda-([0-9]+\.[0-9]+)$", build["cuda_home"]).group(1)
        resolved = by_path[build["target"]].resolved
        runtime = resolved.get("nvidia-cuda-runtime") or resolved.get(f"nvidia-cuda-runtime-cu{toolkit.split('.')[0]}")
        assert runtime, f"{build['name']}: no CUDA runtime among {build['target']}'s packages"
        assert runtime.startswith(f"{toolkit}."), f"{build['name']}: CUDA {toolkit} against torch's runtime {runtime}"
