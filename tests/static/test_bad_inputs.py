"""Inventory mistakes, as a new user makes them, each a small change to inventory/lab: every one is refused by the
validation play (playbooks/preflight.yml) before the first change on any machine, naming the variable (or, for
broken YAML, the file and the line), and no secret of the inventory appears in the output.

The validation play runs on the controller only, so these runs need no lab machine: each playbook runs against a
copy of inventory/lab with a cold fact cache and every host's SSH port set to 1, so that a run that got past the
validation could not reach any machine either. The inputs that need machines (a wrong Proxmox password, an
inactive service added) are in tests/lab/test_lab.py.
"""

# The table of inputs keeps one input per line, however long.
# ruff: noqa: E501
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from playbook_testlib import run_ansible

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventory" / "lab"
pytestmark = pytest.mark.static

# Secrets planted in the copy, distinctive enough that any appearance in the output is a leak.
PASSWORD = "pw-canary-7f3a9e"
API_KEY = "key-canary-91c2d4"
PREFLIGHT_TASK = "Check every host's variables against the roles and against each other"

# Files of inventory/lab, by short name.
SERVICE = "group_vars/inference_containers/inference_service.yml"
BUILD = "group_vars/inference_guests/source_build.yml"
NCCL = "group_vars/inference_guests/nccl_tuning.yml"
PYENV = "group_vars/inference_guests/python_env.yml"
CUDA = "group_vars/inference_guests/cuda_toolkit.yml"
USERSPACE = "group_vars/inference_guests/nvidia_userspace.yml"
GUEST = "host_vars/lab-ct/guest.yml"
VERSIONS = "group_vars/all/versions.yml"
PROXMOX = "host_vars/lab-pve/proxmox.yml"
LABFILE = "group_vars/all/lab.yml"
HARDWARE = "host_vars/lab-pve/hardware.yml"
SWITCH = "group_vars/pve_hosts/gpu_switch.yml"
API = "group_vars/pve_hosts/pve_api.yml"
GUEST_GPU = "group_vars/pve_hosts/pve_guest_gpu.yml"
HOST_GPU = "group_vars/pve_hosts/pve_host_gpu.yml"


@dataclass
class Case:
    id: str
    file: str
    change: object  # data -> None (edits the file's data in place), or str (the file's new text)
    names: str  # what the refusal must name: the variable, or file:line for broken YAML
    playbook: str = "site.yml"
    extra: list[str] = field(default_factory=list)
    # Changes to other files of the copy that the mistake needs around it: {file: change}.
    also: dict = field(default_factory=dict)


def put(key, value):
    def change(data):
        data[key] = value

    return change


def rename(old, new):
    def change(data):
        data[new] = data.pop(old)

    return change


def service(**fields):
    def change(data):
        data["inference_service_services"][0].update(fields)

    return change


def setting(index, **fields):
    def change(data):
        data["nccl_tuning_settings"][index].update(fields)

    return change


def gpu(index, **fields):
    def change(data):
        data["inferhost_gpus"][index].update(fields)

    return change


def proxmox(**fields):
    def change(data):
        data["inferhost_proxmox"].update(fields)

    return change


def second_service(name):
    def change(data):
        data["inference_service_services"].append({**data["inference_service_services"][0], "name": name})

    return change


BUILD_ENTRY = {
    "name": "flash-attn",
    "git": "https://github.com/Dao-AILab/flash-attention.git",
    "ref": "060c9188beec3a8b62b33a3bfa6d5d2d44975fab",
    "target": "/opt/venvs/sglang",
    "gb_per_thread": 5,
}
ENV_ENTRY = {"name": "sglang", "path": "/opt/venvs/sglang", "python": "3.12", "steps": [{"packages": ["sglang"]}]}
CASES = [
    # Misspelt or undeclared names: Ansible would ignore them without a word.
    Case("active-misspelt", SERVICE, rename("inference_service_active", "inference_service_activ"), "inference_service_activ"),
    Case("services-misspelt", SERVICE, rename("inference_service_services", "inference_service_servics"), "inference_service_servics"),
    Case("max-jobs-misspelt", BUILD, rename("source_build_max_jobs", "source_build_maxjobs"), "source_build_maxjobs"),
    Case("iommu-misspelt", HOST_GPU, put("pve_host_gpu_iommu_pasthrough", True), "pve_host_gpu_iommu_pasthrough"),
    Case("gpus-misspelt", HARDWARE, rename("inferhost_gpus", "inferhost_gpu"), "inferhost_gpu"),
    Case("nccl-misspelt", NCCL, rename("nccl_tuning_settings", "nccl_tuning_setting"), "nccl_tuning_setting"),
    Case("project-name-unknown", VERSIONS, put("inferhost_driver_version", "590.48.01"), "inferhost_driver_version"),
    Case("extra-var-misspelt", SWITCH, lambda data: None, "gpu_switch_froce", "playbooks/gpu_switch.yml",
         ["-e", "gpu_switch_to=vm", "-e", "gpu_switch_froce=true"]),  # fmt: skip
    # Services.
    Case("active-unknown", SERVICE, put("inference_service_active", "lab-standn"), "inference_service_active"),
    Case("service-gpus-string", SERVICE, service(gpus="0,1"), "inference_service_services[0].gpus"),
    Case("service-gpus-twice", SERVICE, service(gpus=[0, 0]), "inference_service_services[0].gpus"),
    Case("service-gpus-beyond-host", SERVICE, service(gpus=[0, 8]), "inference_service_services[0].gpus"),
    Case("service-gpus-empty", SERVICE, service(gpus=[]), "inference_service_services[0].gpus"),
    Case("service-engine", SERVICE, service(engine="vllmx"), "inference_service_services"),
    Case("service-tp-does-not-divide", SERVICE, service(tensor_parallel_size=3), "tensor_parallel_size"),
    Case("service-fp8-kv-without-opt-in", SERVICE, service(kv_cache_dtype="fp8"), "inference_service_services[0]"),
    Case("service-port", SERVICE, service(port=70000), "inference_service_services[0].port"),
    Case("service-name-twice", SERVICE, second_service("lab-vllm"), "inference_service_services[1].name"),
    Case("service-known-bad-backend", SERVICE, service(env={"VLLM_ATTENTION_BACKEND": "FLASHINFER"}), "inference_service_services[0]"),
    Case("load-timeout-type", SERVICE, put("inference_service_load_timeout_s", "forty minutes"), "inference_service_load_timeout_s"),
    Case("hardware-type", SERVICE, put("inference_service_hardware", "8 GPUs"), "inference_service_hardware"),
    # Source builds, NCCL, Python environments, CUDA.
    Case("max-jobs-negative", BUILD, put("source_build_max_jobs", -4), "source_build_max_jobs"),
    Case("max-jobs-word", BUILD, put("source_build_max_jobs", "twenty"), "source_build_max_jobs"),
    Case("build-relative-target", BUILD, put("source_build_builds", [{**BUILD_ENTRY, "target": "venvs/sglang"}]), "source_build_builds[0].target"),
    Case("build-missing-ref", BUILD, put("source_build_builds", [{k: v for k, v in BUILD_ENTRY.items() if k != "ref"}]), "source_build_builds"),
    Case("nccl-name", NCCL, setting(0, name="nccl_proto"), "nccl_tuning_settings[0].name"),
    Case("nccl-value", NCCL, setting(1, value="Ring Tree"), "nccl_tuning_settings[1].value"),
    Case("nccl-twice", NCCL, setting(2, name="NCCL_PROTO"), "nccl_tuning_settings[2].name"),
    Case("python-env-relative-path", PYENV, put("python_env_environments", [{**ENV_ENTRY, "path": "venvs/sglang"}]), "python_env_environments[0].path"),
    Case("python-env-audit-choice", PYENV, put("python_env_audit", "maybe"), "python_env_audit"),
    Case("cuda-default-not-listed", CUDA, lambda d: d.update(cuda_toolkit_versions=["12.8"], cuda_toolkit_default="12.4"), "cuda_toolkit_default"),
    Case("cuda-versions-unquoted", VERSIONS, put("inferhost_cuda_versions", [12.8, 13.0]), "inferhost_cuda_versions"),
    Case("service-environment-typo", SERVICE, service(environment="/opt/venvs/vlm"), "inference_service_services[0].environment"),
    Case("build-cuda-home-not-installed", BUILD, put("source_build_builds", [{**BUILD_ENTRY, "cuda_home": "/usr/local/cuda-12.4"}]), "source_build_builds[0].cuda_home"),
    Case("python-version-float", PYENV, lambda d: d["python_env_environments"][0].update(python=3.10), "python_env_environments[0].python"),
    Case("capability-without-dot", SERVICE, lambda d: d["inference_service_hardware"].update(compute_capability="120"), "inference_service_hardware.compute_capability"),
    # Versions, addresses, guests.
    Case("driver-version-short", VERSIONS, put("inferhost_nvidia_driver_version", "590.48"), "inferhost_nvidia_driver_version"),
    Case("guest-driver-not-the-hosts", USERSPACE, put("nvidia_userspace_version", "580.65.06"), "nvidia_userspace_version"),
    Case("gpus-as-string", HARDWARE, put("inferhost_gpus", "0000:01:00.0,0000:02:00.0"), "inferhost_gpus"),
    Case("gpu-address-twice", HARDWARE, gpu(1, address="0000:01:00.0"), "inferhost_gpus[1].address"),
    Case("gpu-address-malformed", HARDWARE, gpu(0, address="01:00"), "inferhost_gpus[0].address"),
    Case("gpu-numa-node", HARDWARE, gpu(2, numa_node="zero"), "inferhost_gpus[2].numa_node"),
    Case("gpu-audio-function", HARDWARE, gpu(0, address="0000:01:00.1"), "inferhost_gpus[0].address"),
    Case("swap-as-word", HARDWARE, put("inferhost_host_has_swap", "no"), "inferhost_host_has_swap"),
    Case("cpu-vendor", HARDWARE, put("inferhost_cpu_vendor", "arm"), "inferhost_cpu_vendor"),
    Case("pve-host-unknown", GUEST, put("inferhost_pve_host", "lab-pv"), "inferhost_pve_host"),
    Case("guest-ids-equal", PROXMOX, proxmox(vm_vmid=101), "inferhost_proxmox.vm_vmid"),
    Case("guest-id-small", PROXMOX, proxmox(container_vmid=42), "inferhost_proxmox.container_vmid"),
    Case("password-empty", LABFILE, lambda d: d["lab_proxmox"].update(password=""), "pve_api_password"),
    Case("removed-name", SWITCH, put("gpu_switch_proxmox_verify_ssl", True), "rename it to pve_api_validate_certs"),
    Case("renamed-switch", HOST_GPU, put("pve_host_gpu_swap_expected", True), "rename it to pve_host_gpu_allow_swap"),
    Case("connection-left-in-proxmox", PROXMOX, proxmox(node="pve1"), "move it to pve_api_node"),
    Case("switch-gpu-not-on-host", SWITCH, put("gpu_switch_gpus", ["0000:01:00.0", "0000:09:00.0"]), "gpu_switch_gpus[1]"),
    Case("switch-gpu-twice", SWITCH, put("gpu_switch_gpus", ["0000:01:00.0", "0000:01:00.0"]), "gpu_switch_gpus[1]"),
    Case("switch-timeouts-type", SWITCH, put("gpu_switch_timeouts", "fast"), "gpu_switch_timeouts"),
    Case("switch-timeouts-partial", SWITCH, put("gpu_switch_timeouts", {"shutdown": 300}), "gpu_switch_timeouts"),
    Case("api-user-not-root", API, put("pve_api_user", "admin@pve"), "pve_api_user"),
    Case("api-node-missing", "host_vars/lab-pve/pve_api.yml", lambda d: d.pop("pve_api_node"), "pve_api_node"),
    Case("vm-gpu-unknown", GUEST_GPU, put("pve_guest_gpu_vms", [{"vmid": "{{ inferhost_proxmox.vm_vmid }}", "gpus": ["0000:42:00.0"]}]), "pve_guest_gpu_vms[0].gpus"),
    Case("ct-vmid-invalid", GUEST_GPU, put("pve_guest_gpu_containers", [{"vmid": 5, "gpus": "all"}]), "pve_guest_gpu_containers[0].vmid"),
    # The wiring (playbooks/group_vars/all/wiring.yml): its site data missing, or a wired variable set where it loses.
    Case("proxmox-ids-missing", PROXMOX, lambda d: d.pop("inferhost_proxmox"), "inferhost_proxmox"),
    Case("wired-in-group-vars-all", VERSIONS, put("gpu_switch_gpus", ["0000:01:00.0"]), "gpu_switch_gpus"),
    Case("bootloader-choice", HOST_GPU, put("pve_host_gpu_bootloader", "lilo"), "pve_host_gpu_bootloader"),
    Case("kernel-args-string", HOST_GPU, put("pve_host_gpu_kernel_args_extra", "pcie_aspm=off"), "pve_host_gpu_kernel_args_extra"),
    Case("module-option-name", HOST_GPU, put("pve_host_gpu_module_options", {"nvidia_uvm": {"uvm disable hmm": 1}}), "pve_host_gpu_module_options.nvidia_uvm"),
    # Broken YAML: the file and the line.
    Case("yaml-flow", BUILD, "---\nsource_build_max_jobs: [20\nsource_build_builds: []\n", f"{BUILD}:3"),
    Case("yaml-indent", HARDWARE, "---\ninferhost_gpus:\n  - {address: \"0000:01:00.0\", numa_node: 0}\n inferhost_cpu_vendor: amd\n", f"{HARDWARE}:4"),
    # The tier playbooks stop the same way.
    Case("host-play-alone", HOST_GPU, put("pve_host_gpu_bootloader", "lilo"), "pve_host_gpu_bootloader", "playbooks/host.yml"),
    Case("container-play-alone", SERVICE, service(gpus="0,1"), "inference_service_services[0].gpus", "playbooks/container.yml"),
    Case("vm-play-alone", BUILD, put("source_build_max_jobs", -4), "source_build_max_jobs", "playbooks/vm.yml"),
]  # fmt: skip


def _copy_inventory(target: Path, case: Case) -> Path:
    inventory = target / "inventory"
    shutil.copytree(LAB, inventory)
    # Distinctive secrets, so that a leak is found wherever it appears.
    lab = yaml.safe_load((inventory / LABFILE).read_text())
    lab["lab_proxmox"]["password"] = PASSWORD
    (inventory / LABFILE).write_text(yaml.safe_dump(lab, sort_keys=False))
    services = yaml.safe_load((inventory / SERVICE).read_text())
    services["inference_service_api_key"] = API_KEY
    (inventory / SERVICE).write_text(yaml.safe_dump(services, sort_keys=False))
    for file, change in [*case.also.items(), (case.file, case.change)]:
        path = inventory / file
        if isinstance(change, str):
            path.write_text(change)
        else:
            # A file the lab's inventory does not have (its values come from the wiring) starts empty.
            data = yaml.safe_load(path.read_text()) if path.exists() else {}
            change(data)
            path.write_text(yaml.safe_dump(data, sort_keys=False))
    # ansible_dir-relative paths of inventory/lab (the lab's SSH key) point at this copy's parent.
    return inventory


def _run(case: Case, workdir: Path) -> dict:
    inventory = _copy_inventory(workdir, case)
    env = {
        **os.environ,
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(workdir / "facts"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    env.pop("PROXMOX_PASSWORD", None)
    argv = ["ansible-playbook", "-i", str(inventory / "hosts.yml"), case.playbook, "-e", "ansible_port=1", *case.extra]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    output = proc.stdout + proc.stderr
    return {
        "rc": proc.returncode,
        "output": output.replace(str(inventory) + "/", ""),
        "seconds": time.monotonic() - start,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case, a few at a time (each run is mostly Ansible's start-up)."""
    base = tmp_path_factory.mktemp("bad-inputs")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {case.id: pool.submit(_run, case, base / case.id) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


def test_the_suite_has_at_least_forty_inputs():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_before_any_change_naming_the_variable(runs, case):
    run = runs[case.id]
    out = run["output"]
    assert run["rc"] != 0, f"{case.id} was not refused:\n{out[-3000:]}"
    # Nothing ran on any machine: the only task that ran is the validation on the controller (none at all when
    # the YAML is broken), and no host reports a change.
    tasks = re.findall(r"^TASK \[(.*?)\]", out, re.M)
    assert set(tasks) <= {PREFLIGHT_TASK}, f"{case.id}: tasks ran past the validation: {tasks}\n{out[-3000:]}"
    assert not re.search(r"changed=[1-9]", out), out[-3000:]
    assert "UNREACHABLE" not in out, out[-3000:]
    # The refusal names the variable (or the file and the line).
    assert case.names in out, f"{case.id}: the refusal does not name {case.names}:\n{out[-3000:]}"
    # No secret of the inventory in the output.
    for secret in (PASSWORD, API_KEY):
        assert secret not in out, f"{case.id}: a secret appears in the output"


def test_a_misspelt_variable_is_refused_with_the_closest_name(runs):
    out = runs["active-misspelt"]["output"]
    assert "inference_service_activ" in out and "rename it to inference_service_active" in out
    assert "group_vars/inference_containers/inference_service.yml: inference_service_activ" in out


def test_a_string_for_the_gpus_is_named_as_such(runs):
    out = runs["service-gpus-string"]["output"]
    assert "a string is not a list" in out
    out = runs["gpus-as-string"]["output"]
    assert "inferhost_gpus" in out and "a string" in out and "has no attribute 'address'" not in out


@pytest.mark.parametrize(
    ("case", "fix"),
    [
        ("kernel-args-string", "Fix: pve_host_gpu_kernel_args_extra: [pcie_aspm=off]."),
        (
            "switch-timeouts-partial",
            "Fix: gpu_switch_timeouts: {shutdown: 300, task: 600, sysfs_write: 15, command: 60}.",
        ),
        ("python-version-float", 'Fix: python: "3.10".'),
        ("capability-without-dot", 'Fix: compute_capability: "12.0".'),
        ("gpu-audio-function", 'Fix: address: "0000:01:00.0".'),
        ("service-environment-typo", "Fix: environment: /opt/venvs/vllm."),
        ("build-cuda-home-not-installed", "Fix: cuda_home: /usr/local/cuda-"),
    ],
)
def test_a_yaml_trap_or_a_cross_reference_is_refused_with_the_line_to_write(runs, case, fix):
    """The mistakes Ansible would take without a word (its argument spec check converts them) or that the roles
    would refuse only after earlier roles had changed the guest: the one problem names the variable the user
    wrote and gives the line to write."""
    out = runs[case]["output"]
    assert "The inventory has 1 problem;" in out, out[-3000:]
    assert fix in out, out[-3000:]


def test_the_unmodified_lab_inventory_passes(tmp_path):
    """The validation itself refuses nothing in inventory/lab (the copy with the planted secrets)."""
    case = Case("unmodified", SERVICE, lambda data: None, "")
    inventory = _copy_inventory(tmp_path, case)
    proc = run_ansible("ansible-playbook", "-i", str(inventory / "hosts.yml"), "playbooks/preflight.yml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
