"""The lab's fake Proxmox API: fakepve started with the inventory's guests, read back, stopped.

start_fakepve serves every lab host's node with its container and VM (lab_node) through
src/inferhost/sim/pve_power.py, which powers each guest's machine as the API powers the guest and runs its
hookscript on its own node's machine, with a certificate, a password file, the guests' file and a pid
file of its own under .cache/lab. The lab reads it through the stack's own Proxmox API client
(plugins/module_utils/pve_api.py), as the modules and gpu-switch do.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fakepve.certs import make_cert

# The lab reads the fake API through the Proxmox API client of the stack's modules and gpu-switch:
# plugins/module_utils is on the path from the package's __init__.
from pve_api import Client, Login

from .context import CONTAINER_PREFIX, ROOT, STATE, Lab, LabError, guests_of, pve_host, pve_hosts


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


def fakepve_guests(lab: Lab) -> dict:
    """fakepve's guests file: each lab host's node with its container and VM (lab_node), one API for them all."""
    guests = []
    for host in pve_hosts(lab):
        node = lab.hosts[host]["lab_node"]
        ct, vm = node["container"], node["vm"]
        guests += [
            {
                "type": "lxc",
                "vmid": ct["vmid"],
                "name": ct["name"],
                "node": node["name"],
                "status": ct["status"],
                "config": {"hostname": ct["name"], "ostype": "ubuntu", "arch": "amd64", "memory": 65536},
                "shutdown_secs": 5,
            },
            {
                "vmid": vm["vmid"],
                "name": vm["name"],
                "node": node["name"],
                "status": vm["status"],
                "config": {"machine": "q35", "bios": "ovmf", "memory": 65536, "cores": 16},
                "shutdown_secs": 10,
            },
        ]
    return {"guests": guests}


def start_fakepve(lab: Lab) -> str:
    """fakepve with the nodes and guests of the lab's cluster: both hosts', whether the lab runs one host or two,
    so that a second host joins a running lab of one as a node of the same cluster (fakepve keeps its state in
    memory: it cannot be restarted with a node more and keep what the plays have configured)."""
    px = lab.proxmox
    cluster = lab if len(pve_hosts(lab)) == 2 else Lab.from_inventory(2)
    STATE.mkdir(parents=True, exist_ok=True)
    pidfile = STATE / "fakepve.pid"
    if _pid_alive(pidfile) and _port_open(px["host"], px["port"]):
        return "already running"
    certfile, keyfile, _ = make_cert(str(STATE), name="fakepve", hosts=(px["host"],))
    guests = STATE / "guests.json"
    guests.write_text(json.dumps(fakepve_guests(cluster), indent=2))
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
    for vmid, host in guest_machines(cluster).items():
        argv += ["--machine", f"{vmid}={CONTAINER_PREFIX + host}"]
    for host in pve_hosts(cluster):
        argv += ["--node-machine", f"{cluster.hosts[host]['lab_node']['name']}={CONTAINER_PREFIX + host}"]
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
    """vmid -> the lab machine that is that guest: every host's container and VM."""
    machines = {}
    for host in pve_hosts(lab):
        node, guests = lab.hosts[host]["lab_node"], guests_of(lab, host)
        machines[node["container"]["vmid"]] = guests["container"]
        machines[node["vm"]["vmid"]] = guests["vm"]
    return machines


def api_client(lab: Lab, host: str | None = None) -> Client:
    """The fake API on a lab host's node (default the first host's), logged in as the inventory says, verified
    against the lab's CA."""
    px = lab.proxmox
    login = Login(px["host"], px["port"], px["user"], secret=px["password"], ca_file=str(STATE / "fakepve.crt"))
    return Client(login, lab_node(lab, host)["name"])


def lab_node(lab: Lab, host: str | None = None) -> dict:
    """A lab host's node as the fake API has it (lab_node: its name, container and VM); default the first host's."""
    return lab.hosts[host or pve_host(lab)]["lab_node"]


def guest_status(lab: Lab, host: str | None = None) -> tuple[str, str]:
    """A host's container's and VM's status (running, stopped) on the fake API; default the first host's."""
    api, node = api_client(lab, host), lab_node(lab, host)
    return api.status("lxc", node["container"]["vmid"]), api.status("qemu", node["vm"]["vmid"])


def guest_configs(lab: Lab, host: str | None = None) -> tuple[dict, dict]:
    """A host's container's and VM's config on the fake API; default the first host's."""
    api, node = api_client(lab, host), lab_node(lab, host)
    return api.config("lxc", node["container"]["vmid"]), api.config("qemu", node["vm"]["vmid"])


def api_summary(lab: Lab) -> str:
    parts = []
    for host in pve_hosts(lab):
        node = lab_node(lab, host)
        ct, vm = guest_status(lab, host)
        parts.append(f"{node['name']}: CT {node['container']['vmid']} {ct}, VM {node['vm']['vmid']} {vm}")
    return "; ".join(parts)


def fakepve_pid() -> int | None:
    """The fake API's process, while it runs."""
    return _pid_alive(STATE / "fakepve.pid")


def stop_fakepve() -> None:
    pid = fakepve_pid()
    if pid:
        os.killpg(pid, signal.SIGTERM)


def remove_fakepve_files() -> None:
    """What start_fakepve wrote for one lab: the next one writes its own."""
    for leftover in ("fakepve.pid", "guests.json", "pve-password", "fakepve.key"):
        (STATE / leftover).unlink(missing_ok=True)
