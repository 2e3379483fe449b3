"""The ABI guard: pinned packages must still be installed at their versions (and CUDA builds)."""

import pytest
from python_env.pins import (
    check,
    describe,
    installed_versions,
    parse_requirement,
    pins_from_requirements,
    version_matches,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("torch==2.10.0.dev20251215+cu130", ("torch", "2.10.0.dev20251215+cu130")),
        ("Flashinfer_Python == 0.6.3", ("flashinfer-python", "0.6.3")),
        ("sglang[all]==0.5.8 ; python_version >= '3.10'", ("sglang", "0.5.8")),
        ("numpy>=1.26,<2.3", ("numpy", None)),
        ("numpy==1.26.4,!=1.26.3", ("numpy", None)),
        ("einops", ("einops", None)),
        ("pkg @ file:///tmp/pkg.whl", ("pkg", None)),
        ("pkg===1.0-weird", ("pkg", "1.0-weird")),
    ],
)
def test_requirements_give_pins_only_for_exact_versions(text, expected):
    assert parse_requirement(text) == expected


@pytest.mark.parametrize(
    ("pin", "installed", "ok"),
    [
        ("2.10.0.dev20251215+cu130", "2.10.0.dev20251215+cu130", True),
        ("2.10.0.dev20251215+cu130", "2.10.0.dev20251215+cu128", False),  # another CUDA build
        ("2.10.0.dev20251215+cu130", "2.9.1+cu130", False),  # dragged back to a release
        ("2.10.0.dev20251215", "2.10.0.dev20251215+cu130", True),  # no label pinned: any label
        ("2.1", "2.1.0", True),
        ("2.1.0", "2.1", True),
        ("2.1", "2.1.1", False),
        ("2.*", "2.9.1+cu130", True),
        ("2.9.*", "2.10.0", False),
        ("1.0rc1", "1.0", False),
        ("1.0", None, False),
    ],
)
def test_version_matching(pin, installed, ok):
    assert version_matches(pin, installed) is ok


def test_a_dragged_dependency_is_named_with_both_versions():
    pins = pins_from_requirements(["pluggy==1.0.0", "pytest==8.3.4", "iniconfig"])
    installed = {"pluggy": "1.6.0", "pytest": "8.3.4", "iniconfig": "2.0.0"}
    violations = check(pins, installed)
    assert violations == [{"name": "pluggy", "pinned": "1.0.0", "installed": "1.6.0"}]
    assert describe(violations) == ["pluggy: the spec pins 1.0.0, installed is 1.6.0"]


def test_a_removed_pinned_package_is_a_violation():
    assert describe(check({"torch": "2.9.1"}, {})) == ["torch: the spec pins 2.9.1, but it is not installed"]


def test_installed_versions_come_from_dist_info(venv):
    _, site = venv
    assert installed_versions(str(site)) == {"vllm": "0.11.0", "torch": "2.10.0.dev20251215+cu130"}
    assert installed_versions(str(site / "nope")) == {}
