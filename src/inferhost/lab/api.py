"""The lab's fake Proxmox API: fakepve started with the inventory's guests, read back, stopped.

start_fakepve serves lab_proxmox's container and VM through src/inferhost/sim/pve_power.py, which powers each
guest's machine as the API powers the guest, with a certificate, a password file, the guests' file and a pid
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

from .context import CONTAINER_PREFIX, ROOT, STATE, Lab, LabError, pve_host


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
    argv += ["--node-machine", CONTAINER_PREFIX + pve_host(lab)]
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
