"""cuda_toolkit_probe: what each toolkit's version.json and nvcc say, against the version it is installed as."""

import json

import pytest
from module_runner import load_module, run_module

MODULE = load_module("cuda_toolkit_probe")


def toolkit(prefix, version, recorded="same", release="same"):
    """A toolkit tree under prefix: version.json recording `recorded`, an nvcc printing `release` (None: absent)."""
    root = prefix / f"cuda-{version}"
    (root / "bin").mkdir(parents=True)
    if recorded is not None:
        recorded = f"{version}.1" if recorded == "same" else recorded
        (root / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": recorded}}))
    if release is not None:
        release = version if release == "same" else release
        nvcc = root / "bin" / "nvcc"
        nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.41'\n")
        nvcc.chmod(0o755)


def probe(prefix, versions):
    return run_module(MODULE, {"versions": versions, "prefix": str(prefix)})


def test_sound_toolkits_have_no_problems(tmp_path):
    toolkit(tmp_path, "12.8")
    toolkit(tmp_path, "13.0", recorded="13.0")
    result = probe(tmp_path, ["12.8", "13.0"])
    assert result["problems"] == [] and result["changed"] is False
    assert [(t["version"], t["recorded"], t["nvcc"]) for t in result["toolkits"]] == [
        ("12.8", "12.8.1", "12.8"),
        ("13.0", "13.0", "13.0"),
    ]


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"recorded": None}, "version.json is missing"),
        ({"recorded": "12.80.1"}, "records version 12.80.1, not 12.8"),  # not a prefix match of the text
        ({"release": "12.6"}, "reports release 12.6, not 12.8"),
        ({"release": None}, "bin/nvcc is missing"),
    ],
)
def test_a_toolkit_that_is_not_its_version_is_named(tmp_path, kwargs, problem):
    toolkit(tmp_path, "12.8", **kwargs)
    toolkit(tmp_path, "13.0")
    result = probe(tmp_path, ["12.8", "13.0"])
    assert len(result["problems"]) == 1 and problem in result["problems"][0]
    assert result["problems"][0].startswith(str(tmp_path / "cuda-12.8"))


def test_a_toolkit_that_is_not_there_at_all_has_both_problems(tmp_path):
    result = probe(tmp_path, ["12.8"])
    assert len(result["problems"]) == 2 and result["toolkits"][0]["recorded"] is None


def test_a_version_json_without_a_version_is_a_problem(tmp_path):
    toolkit(tmp_path, "12.8")
    (tmp_path / "cuda-12.8" / "version.json").write_text("{}")
    assert "records no cuda version" in probe(tmp_path, ["12.8"])["problems"][0]


GROUP = "auto\n/usr/local/cuda\n\n/usr/local/cuda-12.8\n128\n/usr/local/cuda-13.0\n130\n\n"
# A group with one secondary link: each path is followed by its priority and the secondary's target.
GROUP_WITH_SECONDARY = (
    "manual\n/usr/local/cuda\nnvcc\n/usr/bin/nvcc\n\n"
    "/usr/local/cuda-12.8\n128\n/usr/local/cuda-12.8/bin/nvcc\n/usr/local/cuda-13.0\n130\n/usr/local/cuda-13.0/bin/nvcc\n\n"
)


@pytest.mark.parametrize("text", [GROUP, GROUP_WITH_SECONDARY], ids=["plain", "secondary link"])
def test_the_alternatives_group_is_read_with_its_priorities_and_value(tmp_path, text):
    admin, alt = tmp_path / "admin", tmp_path / "alt"
    admin.mkdir()
    alt.mkdir()
    (admin / "cuda").write_text(text)
    (alt / "cuda").symlink_to("/usr/local/cuda-13.0")
    result = run_module(
        MODULE,
        {"versions": [], "prefix": str(tmp_path), "alternative": "cuda", "admin_dir": str(admin), "alt_dir": str(alt)},
    )
    assert result["alternative"] == {
        "value": "/usr/local/cuda-13.0",
        "priorities": {"/usr/local/cuda-12.8": 128, "/usr/local/cuda-13.0": 130},
    }


def test_a_group_dpkg_does_not_have_reads_as_empty(tmp_path):
    result = run_module(
        MODULE, {"versions": [], "alternative": "cuda", "admin_dir": str(tmp_path), "alt_dir": str(tmp_path)}
    )
    assert result["alternative"] == {"value": None, "priorities": {}}
    assert run_module(MODULE, {"versions": []})["alternative"] == {}
