"""The stand-in apt repository served in place of NVIDIA's: names, versions, pinning, signature."""

import gzip
import os
import shutil
import subprocess
import sys

import pytest

from inferhost.sim import apt_repo, gpu_kernel

pytestmark = pytest.mark.skipif(
    not (shutil.which("dpkg-deb") and shutil.which("gpg")), reason="needs dpkg-deb and gpg (Debian's dpkg, gnupg)"
)

HOST = ("nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-persistenced", "nvidia-modprobe")
GUEST = ("libnvidia-compute", "nvidia-utils", "nvidia-dkms-open", "nvidia-open")


def _by_name(pkgs):
    return {p["name"]: p for p in pkgs}


def test_host_stand_ins_carry_nvidias_debian_names_and_versions():
    pkgs = apt_repo.nvidia_packages(["590.48.01", "595.45.04"], ["6.8.12-9-pve"])
    names = {(p["name"], p["version"]) for p in pkgs}
    for version in ("590.48.01", "595.45.04"):
        for name in HOST:
            assert (name, f"{version}-1") in names
        assert (f"nvidia-driver-pinning-{version}", f"{version}-1") in names
    assert ("proxmox-headers-6.8.12-9-pve", "1.0-1") in names


def test_guest_stand_ins_carry_nvidias_ubuntu_names_and_the_kernel_module_is_only_recommended():
    pkgs = apt_repo.guest_packages(["590.48.01"])
    by_name = _by_name(pkgs)
    assert set(GUEST) <= set(by_name)
    assert by_name["nvidia-utils"]["depends"] == "libnvidia-compute (= 590.48.01-1)"
    assert by_name["nvidia-utils"]["recommends"] == "nvidia-dkms-open (= 590.48.01-1)"
    assert not any(name.startswith("linux-headers-") for name in by_name)


def test_guest_kernels_get_headers_where_dkms_looks_for_them():
    headers = _by_name(apt_repo.guest_packages(["590.48.01"], ["6.8.0-51-generic"]))["linux-headers-6.8.0-51-generic"]
    assert headers["links"] == {"/usr/lib/modules/6.8.0-51-generic/build": "/usr/src/linux-headers-6.8.0-51-generic"}


def test_every_pinning_package_excludes_the_others_and_ships_the_one_preferences_file():
    pins = apt_repo.pinning_packages(["590.48.01", "590.44.01", "595.45.04"])
    by_name = _by_name(pins)
    # One per version, and one per branch at the branch's newest version.
    assert by_name["nvidia-driver-pinning-590"]["version"] == "590.48.01-1"
    assert by_name["nvidia-driver-pinning-595"]["version"] == "595.45.04-1"
    assert "Pin: version 590.*" in by_name["nvidia-driver-pinning-590"]["files"][apt_repo.PIN_FILE]["content"]
    for pin in pins:
        assert pin["provides"] == pin["conflicts"] == pin["replaces"] == "nvidia-driver-pinning", pin["name"]
        ((path, item),) = pin["files"].items()
        # apt ignores preferences.d files with another extension than .pref (apt_preferences(5)).
        assert path == apt_repo.PIN_FILE and path.endswith(".pref")
        assert "Pin-Priority: 1000" in item["content"]
    version_pin = by_name["nvidia-driver-pinning-595.45.04"]["files"][apt_repo.PIN_FILE]["content"]
    assert "Pin: version 595.45.04-*" in version_pin


def test_cuda_toolkits_register_the_cuda_alternative():
    (toolkit,) = apt_repo.cuda_packages([{"short": "13.0", "full": "13.0.88", "priority": 130}])
    assert toolkit["name"] == "cuda-toolkit-13-0" and toolkit["version"] == "13.0.88-1"
    assert "update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-13.0 130" in toolkit["postinst"]
    assert "release 13.0, V13.0.88" in toolkit["files"]["/usr/local/cuda-13.0/bin/nvcc"]["content"]


def test_the_repository_is_indexed_signed_and_built_once(tmp_path):
    spec = {"nvidia": {"driver_versions": ["590.48.01"], "kernels": []}, "guest": {"driver_versions": ["590.48.01"]}}
    out = tmp_path / "repo"
    assert apt_repo.build(str(out), spec) is True
    packages = gzip.decompress((out / "Packages.gz").read_bytes()).decode()
    assert "Package: nvidia-modprobe\nVersion: 590.48.01-1" in packages
    assert "Filename: ./nvidia-modprobe_590.48.01-1_amd64.deb" in packages
    assert "Package: nvidia-utils\nVersion: 590.48.01-1" in packages
    excludes = "Conflicts: nvidia-driver-pinning\nReplaces: nvidia-driver-pinning\nProvides: nvidia-driver-pinning"
    assert excludes in packages
    keyring = tmp_path / "key.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(out / "standin.asc")], check=True)
    subprocess.run(["gpgv", "--keyring", str(keyring), str(out / "InRelease")], check=True, capture_output=True)
    assert apt_repo.build(str(out), spec) is False, "same spec: nothing rebuilt"


def _guest_smi(tmp_path, *argv):
    script = tmp_path / "nvidia-smi"
    script.write_text(apt_repo.GUEST_SMI.replace("@VERSION@", "590.48.01"))
    env = {**os.environ, "STANDIN_ROOT": str(tmp_path)}
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, env=env, check=False)
    return done.returncode, done.stdout + done.stderr


def test_the_guests_nvidia_smi_answers_for_the_gpus_this_machine_has_nodes_for(tmp_path):
    """What the guard and inference_gpu_facts ask: the GPUs on nvidia whose /dev/nvidiaN this machine has (a
    container's come from its devN entries), by PCI order, with none of their memory in use."""
    gpu_kernel.build(str(tmp_path), 3)
    query = ["--query-gpu=index,pci.bus_id,driver_version,memory.used", "--format=csv,noheader,nounits"]
    assert _guest_smi(tmp_path, *query) == (
        0,
        "0, 00000000:01:00.0, 590.48.01, 0\n1, 00000000:02:00.0, 590.48.01, 0\n2, 00000000:03:00.0, 590.48.01, 0\n",
    )
    (tmp_path / "dev" / "nvidia0").unlink()
    assert _guest_smi(tmp_path, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", "0,1") == (
        0,
        "1, 0\n",
    )
    assert _guest_smi(tmp_path, "--query-gpu=index", "--format=csv,noheader", "-i", "0") == (
        6,
        "No devices were found\n",
    )
    assert _guest_smi(tmp_path, "--query-gpu=memory.used", "--format=csv") == (0, "memory.used\n0 MiB\n0 MiB\n")
    assert _guest_smi(tmp_path, "--query-gpu=index,power.draw") == (
        2,
        'Field "power.draw" is not a valid field to query.\n',
    )
    assert _guest_smi(tmp_path) == (0, "NVIDIA-SMI stand-in  Driver Version: 590.48.01\n")


def test_the_guests_nvidia_smi_leaves_out_a_gpu_given_to_the_vm_and_keeps_the_others_indices(tmp_path):
    gpu_kernel.build(str(tmp_path), 3)
    kernel = gpu_kernel.FakeKernel.open(*(str(tmp_path / d) for d in ("sys", "proc", "dev")))
    kernel.write(str(tmp_path / "sys/bus/pci/drivers/nvidia/unbind"), "0000:02:00.0")
    kernel.write(str(tmp_path / "sys/bus/pci/devices/0000:02:00.0/driver_override"), "vfio-pci")
    kernel.write(str(tmp_path / "sys/bus/pci/drivers/vfio-pci/bind"), "0000:02:00.0")
    (tmp_path / "dev" / "nvidia1").touch()  # a node left behind does not make the GPU this machine's
    assert _guest_smi(tmp_path, "--query-gpu=index,pci.bus_id", "--format=csv,noheader") == (
        0,
        "0, 00000000:01:00.0\n2, 00000000:03:00.0\n",
    )
