"""SSH into the lab's machines, as into real hosts: a client key, a host key per machine, the known_hosts file
that the inventory checks host keys against, the mounts that put them in the machines, and the ssh command.

The keys are made once per lab under .cache/lab/ssh (SSH_DIR); `inferhost-lab down` removes them, so that the
next lab gets new ones.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from .context import STATE, Lab, LabError

SSH_DIR = STATE / "ssh"


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


def ssh_volumes(host: str) -> list[str]:
    """podman run's -v arguments that give a machine its host key, its sshd settings and the client's key."""
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


def ssh_argv(lab: Lab, host: str) -> list[str]:
    """ssh to a lab machine as the inventory reaches it: its address and port, the lab's key and known_hosts."""
    address, port = ssh_endpoint(lab.hosts[host])
    known_hosts = SSH_DIR / "known_hosts"
    return [
        "ssh", "-i", str(SSH_DIR / "id_ed25519"), "-p", str(port), "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{address}",
    ]  # fmt: skip
