"""Role source_build's data: what a build machine gets installed, and what the tasks install from it."""

from pathlib import Path

import yaml
from jinja2.nativetypes import NativeEnvironment

ROLE = Path(__file__).resolve().parents[3] / "roles/source_build"
DEFAULTS = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
VARS = yaml.safe_load((ROLE / "vars/main.yml").read_text())
PREREQUISITES = yaml.safe_load((ROLE / "tasks/prerequisites.yml").read_text())


def installed(**variables):
    """The package list the prerequisites task hands to apt, for the defaults overridden by ``variables``."""
    task = next(t for t in PREREQUISITES if "apt_present" in t)
    expression = task["apt_present"]["name"]
    assert expression == "{{ __source_build_system_packages }}"
    # Ansible's unique gives a list, Jinja's a generator.
    return list(
        NativeEnvironment().from_string(VARS["__source_build_system_packages"]).render(**{**DEFAULTS, **variables})
    )


def test_the_builds_upstream_prerequisites_are_installed_by_default():
    packages = installed()
    # sgl-kernel's mscclpp calls find_package(NUMA REQUIRED): without libnuma-dev configure stops.
    assert "libnuma-dev" in packages
    # Compilers and make, checkouts and CMake's FetchContent over HTTPS, Python headers, mscclpp's InfiniBand.
    for name in ("build-essential", "git", "ca-certificates", "python3-dev", "libibverbs-dev"):
        assert name in packages, name


def test_an_inventory_adds_packages_without_repeating_the_defaults():
    packages = installed(source_build_extra_system_packages=["librdmacm-dev", "git"])
    assert packages == [*DEFAULTS["source_build_system_packages"], "librdmacm-dev"]


def test_an_empty_list_installs_nothing_but_the_additions():
    assert installed(source_build_system_packages=[]) == []
    assert installed(source_build_system_packages=[], source_build_extra_system_packages=["gcc"]) == ["gcc"]


def test_the_installed_libraries_a_build_detects_are_in_the_cache_key():
    # A library the builds find when present changes the binary: each one installed is a key input.
    detected = {"libnuma-dev", "libibverbs-dev"}
    assert detected <= set(installed())
    assert detected <= set(DEFAULTS["source_build_key_system_packages"])
