"""The lab takes a real host's road: inventory/lab sets every variable that inventory/example sets, to the same
value, except for addresses, secrets, sizes and stand-in hardware. Each allowed difference is listed here with
its reason; any other difference fails, naming the variable and the host."""

import json
import re
from pathlib import Path

import pytest
import yaml
from playbook_testlib import PLAYBOOK, run_ansible

from inferhost.lab.context import uncomment_second_host, with_second_host
from inferhost.sim import apt_repo

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.static

# Variable -> why the lab's value (or its presence in one inventory only) differs from the example's.
ALLOWED = {
    # Addresses and names.
    "ansible_host": "address: every lab machine is on this machine's loopback",
    "ansible_port": "address: each machine's sshd has its own loopback port",
    "inferhost_pve_host": "name: the lab host is lab-pve, the example's pve1",
    # Secrets.
    "ansible_ssh_private_key_file": "secret: the client key inferhost-lab makes per lab",
    "ansible_ssh_common_args": "secret: the known_hosts file inferhost-lab writes from the machines' host keys",
    "vault_proxmox_password": "secret: a real site keeps it in Vault; the lab's is fakepve's public test password",
    "inference_service_api_key": "secret: the lab's key is not a secret; a site's comes from Vault",
    # Stand-in hardware: what the lab's machines have instead of GPUs, a kernel and NVIDIA's repository.
    "inferhost_gpus": "stand-in hardware: the addresses of the lab host's simulated GPUs (lab_gpus)",
    "inferhost_host_has_swap": "stand-in hardware: the lab host has whatever swap this machine has",
    "nvidia_userspace_repository": "address: the wing's signed stand-in of NVIDIA's repository (lab_standin_repo)",
    "pve_host_gpu_nvidia_repo_url": "address: the wing's signed stand-in of NVIDIA's repository (lab_standin_repo)",
    "pve_host_gpu_nvidia_repo_key_url": "address: the stand-in repository's signing key",
    "nvidia_userspace_check_module": "stand-in hardware: the stand-in DKMS package builds no module for modinfo",
    "inference_service_services": (
        "stand-in hardware: the real vLLM's CPU build with the lab's test checkpoint; SGLang (no CPU build) on the"
        " stand-in engine"
    ),
    "inference_service_active": "stand-in hardware: the service the lab's CPU can run",
    "inference_service_hardware": "stand-in hardware: the lab's GPUs have no memory or bandwidth to state",
    # Sizes and times.
    "gpu_switch_timeouts": "time: fakepve runs PVE's seconds ten times faster",
    "inference_service_load_timeout_s": "time: the test checkpoint loads in seconds, the CPU engine starts in minutes",
    "inference_service_start_margin_s": "time: the test checkpoint loads in seconds",
    "inference_service_wait_interval_s": "time: the test checkpoint loads in seconds",
    "inference_service_restart_sec": "time: tests/lab kills the engine to see systemd bring it back",
    "python_env_environments": (
        "stand-in hardware: vLLM's CPU build on the container's Python (no GPU, no uv-managed Python); none on the"
        " VM, which serves nothing in the lab"
    ),
    "python_env_process_environment": (
        "address: the machines reach PyPI through this machine's CA bundle, and share its uv cache"
    ),
    "source_build_builds": "size: hours-long CUDA builds (molecule/guest_env builds one for real)",
}
# The lab driver's own data (the fake API's guests, image releases, networking), read by no role.
LAB_ONLY = re.compile(r"^lab_")


def hostvars(inventory: str | Path) -> tuple[dict, dict]:
    """An inventory's host variables and listing: inventory/<name>, or the hosts.yml at a path."""
    hosts = inventory if isinstance(inventory, Path) else f"inventory/{inventory}/hosts.yml"
    # Only what the inventory says: no facts cached by an earlier run.
    proc = run_ansible("ansible-inventory", "-i", str(hosts), "--list", check=True)
    listing = json.loads(proc.stdout)
    return listing["_meta"]["hostvars"], listing


def first_host(listing: dict, group: str) -> str:
    return listing[group]["hosts"][0]


@pytest.fixture(scope="module")
def inventories():
    return hostvars("example"), hostvars("lab")


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """inventory/example and inventory/lab with their second host's lines uncommented, as a site uncomments them."""
    tmp = tmp_path_factory.mktemp("clusters")
    return (
        hostvars(with_second_host(ROOT / "inventory" / "example", tmp / "example")),
        hostvars(with_second_host(ROOT / "inventory" / "lab", tmp / "lab")),
    )


def _differences(ex_host: str, ex_vars: dict, lab_host: str, lab_vars: dict) -> list[str]:
    problems = []
    for name in sorted(set(ex_vars) | set(lab_vars)):
        if name in ALLOWED or LAB_ONLY.match(name):
            continue
        if name not in lab_vars:
            problems.append(f"{name}: set in the example ({ex_host}), not in the lab")
        elif name not in ex_vars:
            problems.append(f"{name}: set in the lab ({lab_host}), not in the example")
        elif ex_vars[name] != lab_vars[name]:
            problems.append(f"{name}: example {ex_vars[name]!r}, lab {lab_vars[name]!r}")
    return problems


@pytest.mark.parametrize("group", ["pve_hosts", "inference_containers", "inference_vms"])
def test_the_lab_sets_what_the_example_sets(inventories, group):
    (example, example_listing), (lab, lab_listing) = inventories
    ex_host, lab_host = first_host(example_listing, group), first_host(lab_listing, group)
    problems = _differences(ex_host, example[ex_host], lab_host, lab[lab_host])
    assert not problems, f"inventory/lab differs from inventory/example on {group}:\n" + "\n".join(problems)


@pytest.mark.parametrize("group", ["pve_hosts", "inference_containers", "inference_vms"])
def test_the_labs_second_host_sets_what_the_examples_second_host_sets(clusters, group):
    """Both inventories with their second host uncommented: the lab's second host of each group against the
    example's, with the same allowed differences as the first."""
    (example, example_listing), (lab, lab_listing) = clusters
    ex_hosts, lab_hosts = sorted(example_listing[group]["hosts"]), sorted(lab_listing[group]["hosts"])
    assert len(ex_hosts) == len(lab_hosts) == 2, (ex_hosts, lab_hosts)
    problems = _differences(ex_hosts[1], example[ex_hosts[1]], lab_hosts[1], lab[lab_hosts[1]])
    assert not problems, f"the lab's second host differs from the example's on {group}:\n" + "\n".join(problems)


def test_every_allowed_difference_is_still_a_difference(inventories):
    """An entry of ALLOWED that no longer differs is a hole: it would let a future difference through."""
    (example, example_listing), (lab, lab_listing) = inventories
    pairs = [
        (example[first_host(example_listing, g)], lab[first_host(lab_listing, g)])
        for g in ("pve_hosts", "inference_containers", "inference_vms")
    ]
    stale = [name for name in ALLOWED if all(ex.get(name, None) == lb.get(name, None) for ex, lb in pairs)]
    assert not stale, f"no longer differ, remove from ALLOWED: {stale}"


def test_no_role_or_playbook_reads_the_lab_driver_data():
    used = []
    for path in [*ROOT.glob("roles/**/*.yml"), *ROOT.glob("playbooks/**/*.yml"), ROOT / "site.yml"]:
        if re.search(r"\blab_[a-z]", path.read_text()):
            used.append(str(path.relative_to(ROOT)))
    assert not used, f"the lab driver's variables (lab_*) are read by: {used}"


def test_the_fake_api_serves_the_guests_the_inventory_names(clusters):
    """Each lab host's node on the fake API (lab_node) has the inventory's node name and guest ids, and the hosts
    reach the one API where a PVE host reaches its own, as the same user."""
    _, (lab, lab_listing) = clusters
    hosts = sorted(lab_listing["pve_hosts"]["hosts"])
    for host in hosts:
        hv = lab[host]
        node, px = hv["lab_node"], hv["inferhost_proxmox"]
        assert (node["name"], node["container"]["vmid"], node["vm"]["vmid"]) == (
            hv["pve_api_node"],
            px["container_vmid"],
            px["vm_vmid"],
        ), host
        fake = hv["lab_proxmox"]
        assert (fake["host"], fake["port"], fake["user"]) == (
            hv["pve_api_host"],
            hv["pve_api_port"],
            hv["pve_api_user"],
        )
    assert len({lab[h]["lab_node"]["name"] for h in hosts}) == len(hosts) == 2


def test_the_stand_in_repository_serves_the_pins(inventories):
    """The lab's NVIDIA repository has the driver and the CUDA toolkits that the lab inventory pins."""
    _, (lab, lab_listing) = inventories
    hv = lab[first_host(lab_listing, "inference_containers")]
    repo = hv["lab_standin_repo"]
    # The pin, then the next driver (tests/lab's driver change).
    assert repo["driver_versions"][0] == hv["inferhost_nvidia_driver_version"] and len(repo["driver_versions"]) == 2
    assert [t["short"] for t in repo["cuda"]] == hv["inferhost_cuda_versions"]
    uris = hv["nvidia_userspace_repository"]["uris"]
    assert uris == f"file://{repo['path']}/" and hv["nvidia_userspace_repository"]["signed_by"].startswith(repo["path"])
    host = lab[first_host(lab_listing, "pve_hosts")]
    assert host["pve_host_gpu_nvidia_repo_url"] == uris
    assert host["pve_host_gpu_nvidia_repo_key_url"] == f"file://{repo['path']}/standin.asc"


def test_the_stand_in_driver_builds_no_module():
    """nvidia_userspace_check_module's reason: no stand-in guest package ships or builds an nvidia.ko."""
    for pkg in apt_repo.guest_packages(["590.48.01"]):
        assert not any(path.endswith(".ko") for path in pkg.get("files", {})), pkg["name"]
        assert ".ko" not in pkg.get("postinst", ""), pkg["name"]


def test_only_the_tagged_comments_are_uncommented():
    """The second host's lines are commented YAML tagged at their end; other comments stay as they are."""
    text = "a:\n  # b: 1   # second host\n  # a comment\n  #   c: 2 # second host\n  d: 3 # second host\n"
    assert (
        uncomment_second_host(text)
        == "a:\n  b: 1   # second host\n  # a comment\n    c: 2 # second host\n  d: 3 # second host\n"
    )


def test_the_example_as_a_two_host_cluster_passes_the_validation_play(tmp_path):
    """inventory/example with its second host uncommented: each host with its own guests, node name and GPUs, every
    guest naming its host; the validation play accepts it, and the wiring gives each host its own guests."""
    hosts = with_second_host(ROOT / "inventory" / "example", tmp_path / "site")
    listing = yaml.safe_load(hosts.read_text())["all"]["children"]
    assert sorted(listing["pve_hosts"]["hosts"]) == ["pve1", "pve2"]
    assert sorted(listing["inference_containers"]["hosts"]) == ["inference-ct", "inference-ct2"]
    proc = run_ansible(
        PLAYBOOK, "-i", str(hosts), "playbooks/preflight.yml", "-v", "-e", "vault_proxmox_password=pw-1234"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = re.search(r"The inventory of (.*?) is consistent", " ".join(proc.stdout.split()))
    assert checked and {"pve1", "pve2", "inference-ct2", "inference-vm2"} <= set(checked.group(1).split(", "))
    proc = run_ansible("ansible-inventory", "-i", str(hosts), "--playbook-dir", "playbooks", "--list", check=True)
    hv = json.loads(proc.stdout)["_meta"]["hostvars"]
    ids = {
        h: (hv[h]["inferhost_proxmox"]["container_vmid"], hv[h]["inferhost_proxmox"]["vm_vmid"])
        for h in ("pve1", "pve2")
    }
    assert ids["pve1"] != ids["pve2"] and not set(ids["pve1"]) & set(ids["pve2"])
    assert (hv["pve1"]["pve_api_node"], hv["pve2"]["pve_api_node"]) == ("pve1", "pve2")
    assert (hv["inference-ct"]["inferhost_pve_host"], hv["inference-ct2"]["inferhost_pve_host"]) == ("pve1", "pve2")
    # The model across both hosts is one service of both containers, the head first.
    spanning = [s for s in hv["inference-ct2"]["inference_service_services"] if s.get("nodes")]
    assert [s["nodes"] for s in spanning] == [["inference-ct", "inference-ct2"]]
    # A move on one host of the cluster reaches that host alone.
    proc = run_ansible(
        PLAYBOOK,
        "-i",
        str(hosts),
        "playbooks/gpu_switch.yml",
        "--list-hosts",
        "-e",
        "gpu_switch_hosts=pve2",
        check=True,
    )
    move = next(block for block in proc.stdout.split("play #") if ": Move the GPUs" in block)
    moves = [move.split("hosts (", 1)[1].split(":", 1)[1].split()]
    assert moves == [["pve2"]], proc.stdout
