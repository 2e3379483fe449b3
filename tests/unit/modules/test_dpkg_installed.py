"""dpkg_installed: which specifications dpkg has installed as specified (its caller apt_present: tests/unit/action)."""

import shutil

import pytest
from module_runner import load_module, run_module

MODULE = load_module("dpkg_installed")

ROWS = [  # name, architecture, version, dpkg status
    ("libnvidia-compute-590", "amd64", "590.48.01-0ubuntu1", "hi "),
    ("cuda-toolkit-12-8", "amd64", "12.8.1-1", "ii "),
    ("gnupg", "all", "2.2.40-1.1", "ii "),
    ("python3-venv", "amd64", "3.11.2-1+b1", "rc "),  # removed, its configuration left
    ("git", "amd64", "1:2.39.5-0+deb12u2", "iU "),  # unpacked, not configured
    ("libc6", "amd64", "2.36-9", "ii "),
    ("libc6", "i386", "2.36-9", "ii "),
    ("dpkg", "amd64", "1.21.22", "iiR"),  # reinstall required
]
DPKG = "\n".join("\t".join(row) for row in ROWS)
INSTALLED = MODULE.parse_dpkg(DPKG)


@pytest.mark.parametrize(
    "spec",
    [
        "cuda-toolkit-12-8",
        "libnvidia-compute-590=590.48.01*",  # held counts as installed
        "libnvidia-compute-590=590.48.01-0ubuntu1",
        "gnupg:amd64",  # an arch-all package is every architecture's
        "libc6:i386",
    ],
)
def test_installed_as_specified(spec):
    assert MODULE.missing_specs([spec], INSTALLED) == []


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("libnvidia-compute-590=595.45.04*", "another version is installed"),
        ("libnvidia-compute-590=590.48.01", "an exact version without * is the whole string"),
        ("python3-venv", "only its configuration files are left"),
        ("git", "unpacked but not configured"),
        ("dpkg", "dpkg flags it for reinstallation"),
        ("nvidia-utils-590", "not known to dpkg"),
        ("libc6:arm64", "another architecture"),
        ("gcc>=12", "a version comparison is apt's to read"),
        ("./local.deb", "a path is apt's to read"),
    ],
)
def test_missing(spec, why):
    assert MODULE.missing_specs([spec], INSTALLED) == [spec], why


def test_the_module_asks_the_real_dpkg():
    if not shutil.which("dpkg-query"):
        pytest.skip("no dpkg on this machine")
    result = run_module(MODULE, {"name": ["dpkg", "inferhost-no-such-package", "dpkg=0.0.0-none"]}, check_mode=True)
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["missing"] == ["inferhost-no-such-package", "dpkg=0.0.0-none"]
    assert set(result["installed"]) == {"dpkg"}


def test_held_are_the_packages_whose_selection_is_hold():
    """Only "h" as the wanted state holds: "ii" is installed and free to move."""
    assert MODULE.parse_held(DPKG) == ["libnvidia-compute-590"]
    assert MODULE.parse_held(DPKG.replace("ii ", "hi ", 1)) == ["cuda-toolkit-12-8", "libnvidia-compute-590"]
