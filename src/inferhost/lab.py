"""The local lab: a fake Proxmox API and podman guests that the whole stack converges against.

    inferhost-lab up        build what is missing, start the lab, converge site.yml, move the GPUs to the
                            VM and back with gpu-switch, validate the inference service, print a summary
    inferhost-lab converge  converge site.yml again (add --check for a dry run)
    inferhost-lab deploy    the README's deployment order against the running lab, each playbook on its own
    inferhost-lab ssh HOST  a shell (or a command) on a lab machine, as the inventory reaches it
    inferhost-lab status    what runs
    inferhost-lab down      remove the containers and stop the fake API

Everything the lab needs to know comes from inventory/lab (hosts, addresses, image releases, the fake
API's guests); state lives in .cache/lab. The machines are reached as real hosts are, over SSH: the lab
makes a client key and a host key per machine, publishes each machine's sshd on the loopback and writes
the known_hosts that the inventory checks host keys against. Playbooks run through ansible-runner, and
the summary is built from its event stream.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fakepve.certs import make_cert

from inferhost.runner import PlaybookResult, run_playbook, use_this_environment
from inferhost.sim import ENGINE_DIR, apt_repo

ROOT = Path(__file__).resolve().parents[2]
# The lab reads the fake API through the Proxmox API client of the stack's modules and gpu-switch.
sys.path.append(str(ROOT / "plugins" / "module_utils"))
from pve_api import Client, Login  # noqa: E402 - plugins/module_utils is on the path from the line above

from inferhost.sim import pve_power  # noqa: E402 - it reads devN entries with gpu_switch's parser, from there too

INVENTORY = ROOT / "inventory" / "lab"
STANDINS = ENGINE_DIR / "install.yml"
SIM_GPUS = ROOT / "src" / "inferhost" / "sim" / "gpus.yml"
STANDIN_STAMP = "/opt/standin/.installed"
STATE = ROOT / ".cache" / "lab"
# The wing's stand-in of NVIDIA's repositories, built here, mounted read-only into every machine (lab_standin_repo).
STANDIN_REPO = STATE / "standin-repo"
SSH_DIR = STATE / "ssh"
# ansible.cfg's fact_caching_connection: the facts every run caches about each machine.
FACT_CACHE = ROOT / ".cache" / "facts"
CONTAINER_PREFIX = "inferhost-"
# Where a Proxmox VE node keeps its cluster's CA: the lab host gets the fake API's certificate there.
PVE_CA = "/etc/pve/pve-root-ca.pem"


class LabError(RuntimeError):
    """A step of the lab failed; the message says which and why."""


@dataclass
class Lab:
    hosts: dict[str, dict]
    proxmox: dict
    groups: dict[str, list[str]] = field(default_factory=dict)
    timings: list[tuple[str, float, str]] = field(default_factory=list)

    @classmethod
    def from_inventory(cls) -> Lab:
        use_this_environment()
        out = subprocess.run(
            ["ansible-inventory", "-i", str(INVENTORY / "hosts.yml"), "--list"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise LabError(f"cannot read the lab inventory: {out.stderr.strip()}")
        listing = json.loads(out.stdout)
        hostvars = listing["_meta"]["hostvars"]
        proxmox = next(iter(hostvars.values()))["lab_proxmox"]
        groups = {name: group.get("hosts", []) for name, group in listing.items() if name != "_meta"}
        return cls(hosts=hostvars, proxmox=proxmox, groups=groups)

    def step(self, name: str, func, *args) -> object:
        print(f"==> {name}", flush=True)
        start = time.monotonic()
        result = func(*args)
        elapsed = time.monotonic() - start
        note = result if isinstance(result, str) else ""
        self.timings.append((name, elapsed, note))
        return result


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


# --- the fake Proxmox API ---------------------------------------------------------------------------


def _pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def fakepve_guests(proxmox: dict) -> dict:
    ct, vm = proxmox["container"], proxmox["vm"]
    return {
        "guests": [
            {
                "type": "lxc",
                "vmid": ct["vmid"],
                "name": ct["name"],
                "node": proxmox["node"],
                "status": ct["status"],
                "config": {"hostname": ct["name"], "ostype": "ubuntu", "arch": "amd64", "memory": 65536},
                "shutdown_secs": 5,
            },
            {
                "vmid": vm["vmid"],
                "name": vm["name"],
                "node": proxmox["node"],
                "status": vm["status"],
                "config": {"machine": "q35", "bios": "ovmf", "memory": 65536, "cores": 16},
                "shutdown_secs": 10,
            },
        ]
    }


def start_fakepve(lab: Lab) -> str:
    px = lab.proxmox
    STATE.mkdir(parents=True, exist_ok=True)
    pidfile = STATE / "fakepve.pid"
    if _pid_alive(pidfile) and _port_open(px["host"], px["port"]):
        return "already running"
    certfile, keyfile, _ = make_cert(str(STATE), name="fakepve", hosts=(px["host"],))
    guests = STATE / "guests.json"
    guests.write_text(json.dumps(fakepve_guests(px), indent=2))
    (STATE / "pve-password").write_text(px["password"] + "\n")
    (STATE / "pve-password").chmod(0o600)
    log = (STATE / "fakepve.log").open("w")
    # fakepve with the lab's machines behind its guests: their power follows the API's (sim/pve_power.py).
    argv = [
        sys.executable,
        "-m",
        "inferhost.sim.pve_power",
        str(guests),
        "--host",
        px["host"],
        "--port",
        str(px["port"]),
    ]
    for vmid, host in guest_machines(lab).items():
        argv += ["--machine", f"{vmid}={CONTAINER_PREFIX + host}"]
    argv += ["--node-machine", CONTAINER_PREFIX + _pve_host(lab)]
    argv += ["--user", px["user"], "--password", px["password"], "--cert", certfile, "--key", keyfile]
    # PVE seconds run ten times faster than real ones: guest shutdowns take a second, not ten.
    argv += ["--time-scale", "0.1"]
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "containers.conf"))}
    # pve_power reads devN entries with gpu_switch's own parser (plugins/module_utils).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "plugins" / "module_utils"), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    pidfile.write_text(str(proc.pid))
    deadline = time.monotonic() + 30
    while not _port_open(px["host"], px["port"]):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise LabError(f"fakepve did not start: {(STATE / 'fakepve.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return f"https://{px['host']}:{px['port']} (CA {Path(certfile).relative_to(ROOT)})"


def guest_machines(lab: Lab) -> dict[int, str]:
    """vmid -> the lab machine that is that guest: the container's and the VM's."""
    px = lab.proxmox
    return {
        px["container"]["vmid"]: lab.groups["inference_containers"][0],
        px["vm"]["vmid"]: lab.groups["inference_vms"][0],
    }


def machine_running(host: str) -> bool:
    return (
        podman("container", "inspect", "--format", "{{.State.Running}}", CONTAINER_PREFIX + host).stdout.strip()
        == "true"
    )


def power_machines(lab: Lab) -> str:
    """Each guest's machine on or off as the API has the guest, as on a host: a stopped guest is not running."""
    api, px, done = api_client(lab), lab.proxmox, []
    for kind, guest in (("lxc", px["container"]), ("qemu", px["vm"])):
        host = guest_machines(lab)[guest["vmid"]]
        status = api.status(kind, guest["vmid"])
        running = machine_running(host)
        if status == "running" and not running:
            start_machine(lab, host)
            wait_for_ssh(host, lab.hosts[host])
        elif status != "running" and running:
            podman("stop", "-t", "10", CONTAINER_PREFIX + host)
        done.append(f"{host} {status}")
    return ", ".join(done)


def api_client(lab: Lab) -> Client:
    """The fake API on the lab's node, logged in as the inventory says, verified against the lab's CA."""
    px = lab.proxmox
    login = Login(px["host"], px["port"], px["user"], secret=px["password"], ca_file=str(STATE / "fakepve.crt"))
    return Client(login, px["node"])


def guest_status(lab: Lab) -> tuple[str, str]:
    """The container's and the VM's status (running, stopped) on the fake API."""
    api, px = api_client(lab), lab.proxmox
    return api.status("lxc", px["container"]["vmid"]), api.status("qemu", px["vm"]["vmid"])


def guest_configs(lab: Lab) -> tuple[dict, dict]:
    """The container's and the VM's config on the fake API."""
    api, px = api_client(lab), lab.proxmox
    return api.config("lxc", px["container"]["vmid"]), api.config("qemu", px["vm"]["vmid"])


def api_summary(lab: Lab) -> str:
    px = lab.proxmox
    ct, vm = guest_status(lab)
    return f"CT {px['container']['vmid']} {ct}, VM {px['vm']['vmid']} {vm}"


def stop_fakepve() -> None:
    pid = _pid_alive(STATE / "fakepve.pid")
    if pid:
        os.killpg(pid, signal.SIGTERM)


# --- SSH: a client key, a host key per machine, the known_hosts the inventory trusts ----------------


def _keygen(path: Path, comment: str) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
        )


def ssh_endpoint(hv: dict) -> tuple[str, int]:
    """The address and port the inventory reaches a machine at (ansible_host, ansible_port)."""
    return hv["ansible_host"], int(hv.get("ansible_port", 22))


def prepare_ssh(lab: Lab) -> None:
    """Keys and sshd settings for every machine, made once per lab, and the known_hosts file."""
    _keygen(SSH_DIR / "id_ed25519", "inferhost-lab")
    known = []
    for host, hv in sorted(lab.hosts.items()):
        hostdir = SSH_DIR / "hosts" / host
        _keygen(hostdir / "ssh_host_ed25519_key", host)
        address, port = ssh_endpoint(hv)
        # A machine on the host network listens on its own port; the others on 22, published on the loopback.
        listen = f"Port {port}\nListenAddress {address}\n" if hv.get("lab_host_network") else ""
        (hostdir / "sshd.conf").write_text(
            f"# inferhost lab: this machine's host key, root by key only.\n{listen}"
            "HostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        )
        key = (hostdir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        known.append(f"[{address}]:{port} {' '.join(key)}")
    (SSH_DIR / "known_hosts").write_text("\n".join(known) + "\n")


def _ssh_volumes(host: str) -> list[str]:
    hostdir = SSH_DIR / "hosts" / host
    mounts = {
        hostdir / "ssh_host_ed25519_key": "/etc/ssh/ssh_host_ed25519_key",
        hostdir / "ssh_host_ed25519_key.pub": "/etc/ssh/ssh_host_ed25519_key.pub",
        hostdir / "sshd.conf": "/etc/ssh/sshd_config.d/inferhost-lab.conf",
        SSH_DIR / "id_ed25519.pub": "/root/.ssh/authorized_keys",
    }
    return [arg for src, dst in mounts.items() for arg in ("-v", f"{src}:{dst}:ro")]


def wait_for_ssh(host: str, hv: dict, timeout: float = 60) -> None:
    """Until the machine's sshd answers with its banner."""
    address, port = ssh_endpoint(hv)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=2) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise LabError(f"{host}: no sshd answered on {address}:{port} in {timeout:.0f}s")
        time.sleep(0.5)


# --- the podman machines ----------------------------------------------------------------------------


def gpu_tree(host: str) -> Path:
    """Where a lab host's simulated GPUs keep their tree (its /var/lib/inferhost-sim): on this machine, so that
    its containers see the host's PCI devices, as an LXC container sees its host's."""
    return STATE / "gpu-tree" / host


def _machine_argv(lab: Lab, host: str, hv: dict) -> list[str]:
    """podman run's arguments for one lab machine."""
    argv = ["run", "-d", "--name", CONTAINER_PREFIX + host, "--hostname", host, "--systemd", "always"]
    argv += [*_ssh_volumes(host), "-v", f"{STANDIN_REPO}:{hv['lab_standin_repo']['path']}:ro"]
    if hv.get("lab_host_network"):
        argv += ["--network", "host"]
    else:
        address, port = ssh_endpoint(hv)
        argv += ["-p", f"{address}:{port}:22"]
    command = ["/sbin/init"]
    if host in lab.groups.get("pve_hosts", []):
        # A Proxmox VE node has its cluster's CA; the lab host has the fake API's certificate there.
        argv += ["-v", f"{STATE / 'fakepve.crt'}:{PVE_CA}:ro"]
        # Its GPUs are simulated over FUSE (install_gpus), mounted where a host's sysfs has them.
        gpu_tree(host).mkdir(parents=True, exist_ok=True)
        argv += ["--device", "/dev/fuse", "--cap-add", "SYS_ADMIN", "-v", f"{gpu_tree(host)}:/var/lib/inferhost-sim"]
    if host in lab.groups.get("inference_containers", []):
        # The host's PCI devices, read-only, as LXC shows them; device nodes come from its devN entries at each
        # start, made before its init runs (pve_power.pass_devices).
        tree = gpu_tree(hv["inferhost_pve_host"]) / "sys"
        for sub in ("bus/pci", "devices/pci0000:00"):
            argv += ["--mount", f'type=bind,src={tree / sub},"dst=/sys/{sub}",ro']
        command = ["/bin/sh", "-c", pve_power.PRESTART_WAIT]
    return [*argv, f"localhost/debian-systemd:{hv['lab_image_release']}", *command]


def start_machine(lab: Lab, host: str) -> None:
    """podman start of an existing machine; a container's gets the device nodes of its devN entries first."""
    name = CONTAINER_PREFIX + host
    podman("start", name)
    if host in lab.groups.get("inference_containers", []):
        pass_api_devices(lab, host)


def pass_api_devices(lab: Lab, host: str) -> None:
    """The container's device nodes from its devN entries in the API, as PVE makes them at its start."""
    vmid = next(v for v, h in guest_machines(lab).items() if h == host)
    config = api_client(lab).config("lxc", vmid)
    node = CONTAINER_PREFIX + lab.hosts[host]["inferhost_pve_host"]

    def run(*argv):
        return podman(*argv, check=False)

    try:
        pve_power.pass_devices(CONTAINER_PREFIX + host, pve_power.read_devices(node, config, run), run)
    except pve_power.TaskError as exc:
        raise LabError(f"{host}: {exc}") from exc


def start_containers(lab: Lab) -> str:
    """The lab's machines: the Proxmox hosts with their simulated GPUs first, then the guests, which see them."""
    prepare_ssh(lab)
    hosts = [h for h in sorted(lab.hosts) if h in lab.groups.get("pve_hosts", [])]
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
    return started


def wait_for_systemd(name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = podman("exec", name, "systemctl", "is-system-running", check=False).stdout.strip()
        if state in {"running", "degraded"}:
            return
        if time.monotonic() > deadline:
            raise LabError(f"{name}: systemd did not finish booting in {timeout:.0f}s (state {state or 'unknown'})")
        time.sleep(1)


def remove_containers(lab: Lab) -> None:
    """Remove the machines, and the facts cached about them: new machines start with none, as a new host does."""
    for host in sorted(lab.hosts):
        podman("rm", "-f", "-t", "2", CONTAINER_PREFIX + host, check=False)
        (FACT_CACHE / host).unlink(missing_ok=True)
    # A new host's simulated GPUs start from a new tree.
    shutil.rmtree(STATE / "gpu-tree", ignore_errors=True)


# --- playbooks --------------------------------------------------------------------------------------


def cold_fact_cache(name: str) -> Path:
    """An empty fact cache of its own for one run, as on a controller that never saw the machines."""
    cache = STATE / "cold-facts" / name
    shutil.rmtree(cache, ignore_errors=True)
    return cache


def _playbook(
    path: Path,
    *,
    check: bool = False,
    extravars: dict | None = None,
    limit: str | None = None,
    tags: str | None = None,
    fact_cache: Path | None = None,
):
    """One ansible-playbook run; fact_cache: a directory of its own (a cold cache, as on another controller)."""
    env = {"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(fact_cache)} if fact_cache else None
    result = run_playbook(
        path,
        inventory=INVENTORY / "hosts.yml",
        private_dir=STATE / "runner",
        check=check,
        extravars=extravars,
        limit=limit,
        tags=tags,
        env=env,
        project_dir=ROOT,
    )
    if result.status != "successful":
        name = path.relative_to(ROOT).as_posix()
        raise LabError(f"{name} {result.status}: {result.first_failure or 'see the output above'}")
    return result


def build_standin_repo(lab: Lab) -> str:
    """The lab's NVIDIA repository: the wing's signed stand-in (src/inferhost/sim/apt_repo.py) with the packages
    of lab_standin_repo, and headers for the kernel the machines run (this machine's), as a distribution has
    them for its own kernels. Built once per specification."""
    standin = next(iter(lab.hosts.values()))["lab_standin_repo"]
    versions = standin["driver_versions"]
    spec = {
        "nvidia": {"driver_versions": versions},
        "guest": {"driver_versions": versions, "kernels": [platform.release()]},
        "cuda": standin["cuda"],
    }
    try:
        built = apt_repo.build(str(STANDIN_REPO), spec)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise LabError(f"the stand-in NVIDIA repository: {exc}") from exc
    return "built" if built else "unchanged"


def install_standins(lab: Lab) -> str:
    """What the lab's container stands in for: an engine with a model. On a real host these are the environments
    python_env builds; the container's GPUs are its host's (start_containers)."""
    # The machines keep their stand-ins; install them again only when they or their definition changed.
    stamp = hashlib.sha256(
        b"".join(
            p.read_bytes() for p in sorted(STANDINS.parent.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
        )
    ).hexdigest()[:16]
    # A container that is off (the VM holds the GPUs) gets them when it runs again and the lab is brought up.
    stale = [
        h
        for h in sorted(lab.groups.get("inference_containers", []))
        if machine_running(h)
        and podman("exec", CONTAINER_PREFIX + h, "cat", STANDIN_STAMP, check=False).stdout.strip() != stamp
    ]
    if not stale:
        return "unchanged"
    result = _playbook(
        STANDINS,
        extravars={
            "standin_hosts": "inference_containers",
            "standin_models": ["/srv/models/standin-a"],
            # nccl_tuning writes the real environment file in the lab.
            "standin_nccl_env": False,
        },
        limit=",".join(stale),
    )
    for host in stale:
        podman("exec", CONTAINER_PREFIX + host, "sh", "-c", f"echo {stamp} > {STANDIN_STAMP}")
    return f"changed={result.changed}"


def install_gpus(lab: Lab) -> str:
    """The lab host's hardware: the GPUs of its lab_gpus, simulated (src/inferhost/sim/gpus.yml) and seen in
    /sys and /proc as on a real host. The inventory's inferhost_gpus names them, as a user's names theirs."""
    host = _pve_host(lab)
    gpus = lab.hosts[host]["lab_gpus"]
    extravars = {"sim_gpus": gpus, "sim_gpus_modules": lab.hosts[host]["lab_gpu_modules"]}
    result = _playbook(SIM_GPUS, extravars=extravars, limit=host)
    return f"{len(gpus)} GPUs on {host}, changed={result.changed}"


def reboot_host(lab: Lab) -> str:
    """The lab's stand-in for the host's reboot: its machine restarts (systemd from the start, /run emptied, so
    the reboot marker is gone) and the simulated GPUs boot with the nvidia module of the installed driver."""
    host = _pve_host(lab)
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


def _pve_host(lab: Lab) -> str:
    return next(h for h, hv in sorted(lab.hosts.items()) if "inferhost_gpus" in hv)


def converge(lab: Lab, check: bool = False) -> PlaybookResult:
    return _playbook(ROOT / "site.yml", check=check)


def move_gpus(lab: Lab, to: str) -> str:
    """playbooks/gpu_switch.yml, as a user runs it; returns where the GPUs are and what the move did."""
    result = _playbook(ROOT / "playbooks" / "gpu_switch.yml", extravars={"gpu_switch_to": to})
    moves = result.results_of("Move the GPUs to the requested guest")
    if not moves:
        raise LabError("gpu_switch.yml reported no move")
    move = moves[0]
    if move.get("owner") != to:
        raise LabError(f"gpu-switch to-{to} left the GPUs with {move.get('owner')}")
    done = sum(1 for step in move.get("steps", []) if step.get("state") == "done")
    return (
        f"owner={move['owner']} gpus={len(move.get('gpus', []))} changed={move.get('changed')} "
        f"CT {move['container']['status']}, VM {move['vm']['status']}, {done} steps"
    )


def ssh_argv(lab: Lab, host: str) -> list[str]:
    """ssh to a lab machine as the inventory reaches it: its address and port, the lab's key and known_hosts."""
    address, port = ssh_endpoint(lab.hosts[host])
    known_hosts = SSH_DIR / "known_hosts"
    return [
        "ssh", "-i", str(SSH_DIR / "id_ed25519"), "-p", str(port), "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{address}",
    ]  # fmt: skip


def gpu_switch_over_ssh(lab: Lab, to: str) -> str:
    """`ssh root@<host> gpu-switch to-<guest>`, as the README's deployment order has the user do it."""
    host = _pve_host(lab)
    argv = [*ssh_argv(lab, host), "gpu-switch", "--json", f"to-{to}"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"gpu-switch to-{to} on {host} (rc {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    report = json.loads(proc.stdout)
    if report.get("owner") != to:
        raise LabError(f"gpu-switch to-{to} left the GPUs with {report.get('owner')}")
    return f"owner={report['owner']} changed={report.get('changed')}"


def deploy_in_order(lab: Lab) -> list[tuple[str, float, str, object]]:
    """The README's first deployment, each step on its own with a cold fact cache, as a user runs it: host.yml,
    the host's reboot, host.yml again, container.yml, validate.yml on the container, gpu-switch to-vm, vm.yml,
    gpu-switch to-ct. Each step as (name, seconds, note, what it returned)."""
    playbooks = ROOT / "playbooks"
    steps = [
        ("host.yml", lambda cache: _playbook(playbooks / "host.yml", fact_cache=cache)),
        ("reboot the host", lambda _: reboot_host(lab)),
        # As the README says: after the reboot, host.yml again (its facts now name the module that runs).
        ("host.yml after the reboot", lambda cache: _playbook(playbooks / "host.yml", fact_cache=cache)),
        ("container.yml", lambda cache: _playbook(playbooks / "container.yml", fact_cache=cache)),
        ("validate.yml", lambda cache: validate(lab, fact_cache=cache)),
        ("gpu-switch to-vm", lambda _: gpu_switch_over_ssh(lab, "vm")),
        ("vm.yml", lambda cache: _playbook(playbooks / "vm.yml", fact_cache=cache)),
        ("gpu-switch to-ct", lambda _: gpu_switch_over_ssh(lab, "ct")),
    ]
    done = []
    for number, (name, run) in enumerate(steps):
        cache = cold_fact_cache(f"deploy-{number}")
        print(f"==> deployment order: {name} (empty fact cache)", flush=True)
        start = time.monotonic()
        result = run(cache)
        done.append((name, time.monotonic() - start, result if isinstance(result, str) else "", result))
    return done


def left_for_later(result: PlaybookResult) -> dict[str, str]:
    """The guests a run left for later because they are off (playbooks/tasks/guest_power.yml), with its words."""
    return {
        host: str(res.get("msg", ""))
        for host, task, res in result.ok_results
        if task.startswith("guest_power | Say which guest")
    }


def reboot_reasons(result: PlaybookResult) -> list[str]:
    """What host.yml said a reboot is owed for (its closing report), empty when nothing is owed."""
    reports = [res for _, task, res in result.ok_results if task.endswith("Report that a reboot is required")]
    return [line for report in reports if isinstance(report.get("msg"), list) for line in report["msg"][1:]]


def validate(lab: Lab, fact_cache: Path | None = None) -> str:
    """playbooks/validate.yml against the container's stand-in service (the lab has no driver or CUDA)."""
    result = _playbook(
        ROOT / "playbooks" / "validate.yml",
        extravars={"validate_checks": ["smoke"], "validate_hosts": "inference_containers"},
        fact_cache=fact_cache,
    )
    smoke = result.results_of("Send the prompts through the chat API")
    if not smoke:
        raise LabError("validate.yml asked no questions: is inference_service_active set for the lab container?")
    return "; ".join(str(r.get("msg", "")) for r in smoke)


def print_summary(lab: Lab, result: PlaybookResult | None) -> None:
    print("\nLab summary")
    width = max(len(name) for name, _, _ in lab.timings) if lab.timings else 10
    for name, secs, note in lab.timings:
        print(f"  {name:<{width}}  {secs:7.1f} s  {note}")
    if result:
        print("\n  site.yml by play:")
        for play in result.plays:
            print(
                f"    {play.name:<40} {play.seconds:6.1f} s  tasks={play.tasks:<3} ok={play.ok:<3} "
                f"changed={play.changed:<3} failed={play.failed}"
            )
        print(f"  total: changed={result.changed} failed={result.failed} on {len(result.hosts)} hosts")
        for host, why in sorted(left_for_later(result).items()):
            print(f"  {host}: {why.split(': ', 1)[-1]}")


def bring_up(lab: Lab) -> None:
    """Everything the lab needs before its first converge, each step kept when it is in place already: the
    images, the fake API, the stand-in repository, the machines (the host with its GPUs first), each guest's
    machine on or off as the API has it, and the stand-in engine in the containers that run."""
    lab.step("base images", build_images, lab)
    lab.step("fake Proxmox API", start_fakepve, lab)
    lab.step("stand-in NVIDIA repository", build_standin_repo, lab)
    lab.step("podman machines", start_containers, lab)
    lab.step("guests powered as the API has them", power_machines, lab)
    lab.step("stand-in engine", install_standins, lab)


def cmd_up(args: argparse.Namespace) -> int:
    lab = Lab.from_inventory()
    bring_up(lab)
    result = lab.step("converge site.yml" + (" (check)" if args.check else ""), converge, lab, args.check)
    lab.timings[-1] = (*lab.timings[-1][:2], f"changed={result.changed}")
    if not args.check:
        # The VM is off while the container holds the GPUs: site.yml left it for later. Converge it holding them.
        lab.step("gpu-switch to-vm", move_gpus, lab, "vm")
        lab.step("vm.yml", lambda: f"changed={_playbook(ROOT / 'playbooks' / 'vm.yml').changed}")
        lab.step("gpu-switch to-ct", move_gpus, lab, "ct")
        lab.step("validate.yml (smoke)", validate, lab)
    lab.step("Proxmox API state", api_summary, lab)
    print_summary(lab, result)
    return 0


def cmd_converge(args: argparse.Namespace) -> int:
    lab = Lab.from_inventory()
    result = lab.step("converge site.yml" + (" (check)" if args.check else ""), converge, lab, args.check)
    lab.timings[-1] = (*lab.timings[-1][:2], f"changed={result.changed}")
    print_summary(lab, result)
    return 0


def cmd_status(_: argparse.Namespace) -> int:
    lab = Lab.from_inventory()
    pid = _pid_alive(STATE / "fakepve.pid")
    print(f"fake Proxmox API: {f'running (pid {pid})' if pid else 'stopped'}")
    for host in sorted(lab.hosts):
        state = podman("container", "inspect", "--format", "{{.State.Status}}", CONTAINER_PREFIX + host, check=False)
        print(f"{host}: {state.stdout.strip() if state.returncode == 0 else 'absent'}")
    if pid:
        print(f"API: {api_summary(lab)}")
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    lab = Lab.from_inventory()
    remove_containers(lab)
    stop_fakepve()
    for leftover in ("fakepve.pid", "guests.json", "pve-password", "fakepve.key"):
        (STATE / leftover).unlink(missing_ok=True)
    # The next lab gets new keys.
    shutil.rmtree(SSH_DIR, ignore_errors=True)
    print("lab removed")
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    lab = Lab.from_inventory()
    if args.host not in lab.hosts:
        raise LabError(f"no lab machine {args.host!r} (known: {', '.join(sorted(lab.hosts))})")
    return subprocess.run([*ssh_argv(lab, args.host), *args.argv], check=False).returncode


def cmd_deploy(_: argparse.Namespace) -> int:
    lab = Lab.from_inventory()
    for name, secs, note, _ in deploy_in_order(lab):
        lab.timings.append((name, secs, note))
    print_summary(lab, None)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferhost-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the lab and converge site.yml")
    up.add_argument("--check", action="store_true", help="converge in check mode (with --diff)")
    conv = sub.add_parser("converge", help="converge site.yml against the running lab")
    conv.add_argument("--check", action="store_true", help="check mode (with --diff): show, change nothing")
    sub.add_parser("deploy", help="the README's deployment order, each playbook alone with a cold fact cache")
    ssh = sub.add_parser("ssh", help="a shell or a command on a lab machine, over the inventory's SSH road")
    ssh.add_argument("host")
    ssh.add_argument("argv", nargs="*", metavar="command")
    sub.add_parser("status", help="show what runs")
    sub.add_parser("down", help="remove the lab")
    args = parser.parse_args(argv)
    handler = {
        "up": cmd_up,
        "converge": cmd_converge,
        "deploy": cmd_deploy,
        "ssh": cmd_ssh,
        "status": cmd_status,
        "down": cmd_down,
    }[args.command]
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "containers.conf"))
    try:
        return handler(args)
    except LabError as exc:
        print(f"inferhost-lab: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
