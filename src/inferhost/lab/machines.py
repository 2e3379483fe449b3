"""The podman machines that are the lab's host and guests: their base images, how each is run (its mounts, its
published sshd, the host's simulated GPUs and the container's read-only view of them), the container's device
nodes from its devN entries, each guest's machine on or off as the fake API has the guest, the host's reboot,
and their removal. Every machine is a container named CONTAINER_PREFIX + its inventory name.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import time
from pathlib import Path

# pve_power reads devN entries with gpu_switch's parser: plugins/module_utils is on the path from the package's
# __init__.
from inferhost.sim import pve_power

from .api import api_client, guest_machines, lab_node
from .context import (
    CONTAINER_PREFIX,
    ENGINE_INDEX,
    ROOT,
    STANDIN_REPO,
    STATE,
    UV_CACHE,
    Lab,
    LabError,
    pve_host,
    pve_hosts,
)
from .playbooks import playbook
from .ssh import prepare_ssh, ssh_endpoint, ssh_volumes, wait_for_ssh

SIM_GPUS = ROOT / "src" / "inferhost" / "sim" / "gpus.yml"
# The wing's stand-in for the kernel's cgroup-empty notice, for machines whose systemd runs in legacy cgroup mode.
CGROUP_NOTIFY = ROOT / "src" / "inferhost" / "sim" / "cgroup_notify.sh"
CGROUP_NOTIFY_UNIT = CGROUP_NOTIFY.with_name("inferhost-lab-cgroup-notify.service")
# ansible.cfg's fact_caching_connection: the facts every run caches about each machine.
FACT_CACHE = ROOT / ".cache" / "facts"
# Where a Proxmox VE node keeps its cluster's CA: the lab host gets the fake API's certificate there.
PVE_CA = "/etc/pve/pve-root-ca.pem"


def podman(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "containers.conf"))}
    proc = subprocess.run(["podman", *argv], capture_output=True, text=True, env=env, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"podman {' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def build_images(lab: Lab) -> str:
    releases = sorted({v["lab_image_release"] for v in lab.hosts.values()})
    proc = subprocess.run([str(ROOT / "scripts" / "build-images.sh"), *releases], text=True, check=False)
    if proc.returncode != 0:
        raise LabError("building the base images failed (see above)")
    return ", ".join(releases)


def machine_running(host: str) -> bool:
    return (
        podman("container", "inspect", "--format", "{{.State.Running}}", CONTAINER_PREFIX + host).stdout.strip()
        == "true"
    )


def gpu_tree(host: str) -> Path:
    """Where a lab host's simulated GPUs keep their tree (its /var/lib/inferhost-sim): on this machine, so that
    its containers see the host's PCI devices, as an LXC container sees its host's."""
    return STATE / "gpu-tree" / host


def _machine_argv(lab: Lab, host: str, hv: dict) -> list[str]:
    """podman run's arguments for one lab machine."""
    argv = ["run", "-d", "--name", CONTAINER_PREFIX + host, "--hostname", host, "--systemd", "always"]
    argv += [*ssh_volumes(host), "-v", f"{STANDIN_REPO}:{hv['lab_standin_repo']['path']}:ro"]
    if hv.get("lab_host_network"):
        argv += ["--network", "host"]
    else:
        address, port = ssh_endpoint(hv)
        argv += ["--network", hv["lab_network"]["name"], "--ip", hv["lab_address"], "-p", f"{address}:{port}:22"]
    command = ["/sbin/init"]
    if host in lab.groups.get("pve_hosts", []):
        # A Proxmox VE node has its cluster's CA; the lab host has the fake API's certificate there.
        argv += ["-v", f"{STATE / 'fakepve.crt'}:{PVE_CA}:ro"]
        # Its GPUs are simulated over FUSE (install_gpus), mounted where a host's sysfs has them.
        gpu_tree(host).mkdir(parents=True, exist_ok=True)
        argv += ["--device", "/dev/fuse", "--cap-add", "SYS_ADMIN", "-v", f"{gpu_tree(host)}:/var/lib/inferhost-sim"]
    if host in lab.groups.get("inference_containers", []) + lab.groups.get("inference_vms", []):
        argv += guest_shares(hv)
    if host in lab.groups.get("inference_containers", []):
        # The host's PCI devices, read-only, as LXC shows them; device nodes come from its devN entries at each
        # start, made before its init runs (pve_power.pass_devices).
        tree = gpu_tree(hv["inferhost_pve_host"]) / "sys"
        for sub in ("bus/pci", "devices/pci0000:00"):
            argv += ["--mount", f'type=bind,src={tree / sub},"dst=/sys/{sub}",ro']
        command = ["/bin/sh", "-c", pve_power.PRESTART_WAIT]
        # An LXC container shares its host's /dev/shm (half its memory); podman's default is 64 MB, too small
        # for the engine's shared-memory queues.
        argv += ["--shm-size", "2g"]
    return [*argv, f"localhost/debian-systemd:{hv['lab_image_release']}", *command]


def controller_ca_bundle() -> Path:
    """The CA bundle this machine trusts (SSL_CERT_FILE, else OpenSSL's default file)."""
    return Path(os.environ.get("SSL_CERT_FILE") or ssl.get_default_verify_paths().openssl_cafile)


def guest_shares(hv: dict) -> list[str]:
    """podman run's -v arguments that give a lab guest the stand-in engine index, this machine's CA bundle and the
    uv cache it shares with this machine (lab_engine_index, lab_shared)."""
    UV_CACHE.mkdir(parents=True, exist_ok=True)
    ENGINE_INDEX.mkdir(parents=True, exist_ok=True)
    shared = hv["lab_shared"]
    return [
        *("-v", f"{ENGINE_INDEX}:{hv['lab_engine_index']['path']}:ro"),
        *("-v", f"{controller_ca_bundle()}:{shared['ca_bundle']}:ro"),
        *("-v", f"{UV_CACHE}:{shared['uv_cache']}"),
    ]


def start_machine(lab: Lab, host: str) -> None:
    """podman start of an existing machine; a container's gets the device nodes of its devN entries first."""
    name = CONTAINER_PREFIX + host
    podman("start", name)
    if host in lab.groups.get("inference_containers", []):
        pass_api_devices(lab, host)


def pass_api_devices(lab: Lab, host: str) -> None:
    """The container's device nodes from its devN entries in the API, as PVE makes them at its start."""
    vmid = next(v for v, h in guest_machines(lab).items() if h == host)
    pve = lab.hosts[host]["inferhost_pve_host"]
    config = api_client(lab, pve).config("lxc", vmid)
    node = CONTAINER_PREFIX + pve

    def run(*argv):
        return podman(*argv, check=False)

    try:
        pve_power.pass_devices(CONTAINER_PREFIX + host, pve_power.read_devices(node, config, run), run)
    except pve_power.TaskError as exc:
        raise LabError(f"{host}: {exc}") from exc


def ensure_network(lab: Lab) -> None:
    """The guests' network (lab_network), with the subnet their fixed addresses are on."""
    network = next(iter(lab.hosts.values()))["lab_network"]
    if podman("network", "exists", network["name"], check=False).returncode != 0:
        podman("network", "create", "--subnet", network["subnet"], network["name"])


def remove_network(lab: Lab) -> None:
    podman("network", "rm", "-f", next(iter(lab.hosts.values()))["lab_network"]["name"], check=False)


def start_containers(lab: Lab) -> str:
    """The lab's machines: the Proxmox hosts with their simulated GPUs first, then the guests, which see them."""
    prepare_ssh(lab)
    ensure_network(lab)
    hosts = pve_hosts(lab)
    started = _start_machines(lab, hosts)
    install_gpus(lab)  # the host machine's hardware, before anything looks at it (a no-op when in place)
    started += _start_machines(lab, [h for h in sorted(lab.hosts) if h not in hosts])
    return "started " + ", ".join(started) if started else "already running"


def _start_machines(lab: Lab, hosts: list[str]) -> list[str]:
    started = []
    for host in hosts:
        name = CONTAINER_PREFIX + host
        state = podman("container", "inspect", "--format", "{{.State.Status}}", name, check=False)
        # A machine that exists is kept. A host's that is off starts; a guest's stays as it is: power_machines
        # gives it the API's power state (a start of a container whose GPUs the VM holds would fail here).
        if state.returncode == 0 and state.stdout.strip() in {"running", "exited", "stopped"}:
            if state.stdout.strip() != "running" and host in lab.groups.get("pve_hosts", []):
                podman("start", name)
            continue
        podman("rm", "-f", name, check=False)
        podman(*_machine_argv(lab, host, lab.hosts[host]))
        if host in lab.groups.get("inference_containers", []):
            pass_api_devices(lab, host)
        started.append(host)
    for host in hosts:
        if machine_running(host):
            wait_for_systemd(CONTAINER_PREFIX + host)
            wait_for_ssh(host, lab.hosts[host])
    for host in started:
        # The images carry no package lists, as a freshly installed machine has them.
        proc = podman("exec", CONTAINER_PREFIX + host, "apt-get", "update", "-qq", check=False)
        if proc.returncode != 0:
            raise LabError(f"{host}: apt-get update failed: {proc.stderr.strip()[-500:]}")
        install_cgroup_notify(CONTAINER_PREFIX + host)
    return started


def install_cgroup_notify(name: str) -> None:
    """The wing's stand-in for the kernel's cgroup-empty notice (src/inferhost/sim/cgroup_notify.sh), enabled in
    machine `name`: it runs where the machine's systemd is in legacy cgroup mode, and nowhere else."""
    podman("cp", str(CGROUP_NOTIFY), f"{name}:/usr/local/sbin/inferhost-lab-cgroup-notify")
    podman("cp", str(CGROUP_NOTIFY_UNIT), f"{name}:/etc/systemd/system/{CGROUP_NOTIFY_UNIT.name}")
    podman("exec", name, "systemctl", "enable", "--now", "--quiet", CGROUP_NOTIFY_UNIT.name)


def wait_for_systemd(name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = podman("exec", name, "systemctl", "is-system-running", check=False).stdout.strip()
        if state in {"running", "degraded"}:
            return
        if time.monotonic() > deadline:
            raise LabError(f"{name}: systemd did not finish booting in {timeout:.0f}s (state {state or 'unknown'})")
        time.sleep(1)


def install_gpus(lab: Lab) -> str:
    """Each lab host's hardware: the GPUs of its lab_gpus, simulated (src/inferhost/sim/gpus.yml) and seen in
    /sys and /proc as on a real host. The inventory's inferhost_gpus names them, as a user's names theirs."""
    done = []
    for host in pve_hosts(lab):
        gpus = lab.hosts[host]["lab_gpus"]
        extravars = {"sim_gpus": gpus, "sim_gpus_modules": lab.hosts[host]["lab_gpu_modules"]}
        result = playbook(SIM_GPUS, extravars=extravars, limit=host, inventory=lab.inventory)
        done.append(f"{len(gpus)} GPUs on {host}, changed={result.changed}")
    return "; ".join(done)


def power_machines(lab: Lab) -> str:
    """Each guest's machine on or off as the API has the guest, as on a host: a stopped guest is not running."""
    done = []
    for pve in pve_hosts(lab):
        api, node = api_client(lab, pve), lab_node(lab, pve)
        for kind, guest in (("lxc", node["container"]), ("qemu", node["vm"])):
            done.append(_power_machine(lab, api, kind, guest["vmid"]))
    return ", ".join(done)


def _power_machine(lab: Lab, api, kind: str, vmid: int) -> str:
    host = guest_machines(lab)[vmid]
    status = api.status(kind, vmid)
    running = machine_running(host)
    if status == "running" and not running:
        start_machine(lab, host)
        wait_for_ssh(host, lab.hosts[host])
    elif status != "running" and running:
        podman("stop", "-t", "10", CONTAINER_PREFIX + host)
    return f"{host} {status}"


def reboot_host(lab: Lab, host: str | None = None) -> str:
    """The lab's stand-in for a host's reboot (default the first host's): its machine restarts (systemd from the
    start, /run emptied, so the reboot marker is gone) and the simulated GPUs boot with the nvidia module of the
    installed driver."""
    host = host or pve_host(lab)
    name = CONTAINER_PREFIX + host
    podman("restart", "-t", "5", name)
    wait_for_systemd(name)
    wait_for_ssh(host, lab.hosts[host])
    listing = podman("exec", name, "systemctl", "--failed", "--plain", "--no-legend", "--no-pager").stdout
    failed = [line.split()[0] for line in listing.splitlines() if line.strip()]
    if failed:
        raise LabError(f"{host}: units failed at the boot: {', '.join(failed)}")
    loaded = podman("exec", name, "cat", "/sys/module/nvidia/version", check=False).stdout.strip()
    return f"{host} rebooted, nvidia module {loaded or 'not loaded'}"


def podman_exec(host: str, *argv: str) -> subprocess.CompletedProcess:
    """A command in a lab machine through podman, for what the lab does beside the stack (never a play's road)."""
    return podman("exec", CONTAINER_PREFIX + host, *argv, check=False)


def stop_machines(hosts: list[str]) -> None:
    """The machines of hosts stopped, as a host's power cut would leave them (the fake API is not told)."""
    for host in hosts:
        podman("stop", "-t", "10", CONTAINER_PREFIX + host, check=False)


def remove_containers(lab: Lab) -> None:
    """Remove the machines, and the facts cached about them: new machines start with none, as a new host does."""
    for host in sorted(lab.hosts):
        podman("rm", "-f", "-t", "2", CONTAINER_PREFIX + host, check=False)
        (FACT_CACHE / host).unlink(missing_ok=True)
    # A new host's simulated GPUs start from a new tree.
    shutil.rmtree(STATE / "gpu-tree", ignore_errors=True)
