"""The local lab: a fake Proxmox API and podman guests that the whole stack converges against.

Everything the lab needs to know comes from inventory/lab (hosts, addresses, image releases, the fake
API's guests); state lives in .cache/lab. The machines are reached as real hosts are, over SSH: the lab
makes a client key and a host key per machine, publishes each machine's sshd on the loopback and writes
the known_hosts that the inventory checks host keys against. Playbooks run through ansible-runner, and
the summary is built from its event stream.

A module a job: context.py (the Lab read from the inventory, the paths, LabError), api.py (the fake API),
ssh.py (keys, known_hosts, the ssh command), machines.py (the podman machines), playbooks.py (a playbook run
and what its results say), journey.py (the steps and the commands' bodies), cli.py (the arguments). This file
puts plugins/module_utils on the path and re-exports the names that the lab's tests and the converge benchmark
use, and `main` for the `inferhost-lab` command.
"""

from __future__ import annotations

import sys

from .context import HOST_COUNT, INVENTORY, ROOT, STATE, Lab, LabError, guests_of, pve_hosts

# The lab reads the fake API through the Proxmox API client of the stack's modules and gpu-switch, and
# sim/pve_power.py reads devN entries with gpu_switch's parser: both from plugins/module_utils, on the path
# before any module of the package imports them (a package's __init__ runs before its modules).
sys.path.append(str(ROOT / "plugins" / "module_utils"))

from .api import api_client, guest_configs, guest_status, lab_node  # noqa: E402 - the path above must come first
from .cli import cmd_down, main  # noqa: E402
from .journey import bring_up, converge, deploy_in_order, move_gpus, validate  # noqa: E402
from .machines import machine_running, podman_exec, reboot_host, remove_containers, stop_machines  # noqa: E402
from .playbooks import cold_fact_cache, left_for_later, playbook, reboot_reasons  # noqa: E402
from .ssh import SSH_DIR, ssh_argv  # noqa: E402

__all__ = [
    "HOST_COUNT",
    "INVENTORY",
    "ROOT",
    "SSH_DIR",
    "STATE",
    "Lab",
    "LabError",
    "api_client",
    "bring_up",
    "cmd_down",
    "cold_fact_cache",
    "converge",
    "deploy_in_order",
    "guest_configs",
    "guest_status",
    "guests_of",
    "lab_node",
    "left_for_later",
    "machine_running",
    "main",
    "move_gpus",
    "playbook",
    "podman_exec",
    "pve_hosts",
    "reboot_host",
    "reboot_reasons",
    "remove_containers",
    "ssh_argv",
    "stop_machines",
    "validate",
]
