"""The stand-in apt repository that molecule serves in place of NVIDIA's: names, versions, signature."""

import gzip
import shutil
import subprocess

import pytest
from pve_testlib import standin_repo

pytestmark = pytest.mark.skipif(
    not (shutil.which("dpkg-deb") and shutil.which("gpg")), reason="needs dpkg-deb and gpg (Debian's dpkg, gnupg)"
)


def test_nvidia_stand_ins_carry_nvidias_names_and_versions():
    pkgs = standin_repo.nvidia_packages(["590.48.01", "595.45.04"], ["6.8.12-9-pve"])
    names = {(p["name"], p["version"]) for p in pkgs}
    for version in ("590.48.01", "595.45.04"):
        for name in ("nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-persistenced", "nvidia-modprobe"):
            assert (name, f"{version}-1") in names
        assert (f"nvidia-driver-pinning-{version}", f"{version}-1") in names
    assert ("proxmox-headers-6.8.12-9-pve", "1.0-1") in names
    pin = next(p for p in pkgs if p["name"] == "nvidia-driver-pinning-590.48.01")
    ((path, item),) = pin["files"].items()
    # apt ignores preferences.d files with another extension than .pref (apt_preferences(5)).
    assert path.endswith(".pref") and "Pin: version 590.48.01-*" in item["content"]


def test_the_repository_is_indexed_signed_and_built_once(tmp_path):
    spec = {"nvidia": {"driver_versions": ["590.48.01"], "kernels": []}}
    out = tmp_path / "repo"
    assert standin_repo.build(str(out), spec) is True
    packages = gzip.decompress((out / "Packages.gz").read_bytes()).decode()
    assert "Package: nvidia-modprobe\nVersion: 590.48.01-1" in packages
    assert "Filename: ./nvidia-modprobe_590.48.01-1_amd64.deb" in packages
    keyring = tmp_path / "key.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(out / "standin.asc")], check=True)
    subprocess.run(["gpgv", "--keyring", str(keyring), str(out / "InRelease")], check=True, capture_output=True)
    assert standin_repo.build(str(out), spec) is False, "same spec: nothing rebuilt"
