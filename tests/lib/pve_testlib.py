"""Helpers of the host-tier unit tests: load our Ansible modules, run them, build fake host trees."""

import re
from pathlib import Path

import yaml
from localhost import run_playbook
from module_runner import load_module, run_module

from inferhost.sim import host_tree

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["BRIDGE", "GPUS", "NIC", "ROOT", "api_args", "host_tree", "load_module", "play_with_pve_api", "run_module"]

# The default fake host: two GPUs (one on nvidia, one on vfio-pci), a bridge in the first GPU's IOMMU
# group (never foreign) and a NIC in a group of its own.
GPUS = [
    {"address": "0000:01:00.0", "group": 10, "numa": 0, "driver": "nvidia", "minor": 0},
    {"address": "0000:81:00.0", "group": 20, "numa": 1, "driver": "vfio-pci"},
]
BRIDGE = {"address": "0000:00:01.1", "class": "0x060400", "vendor": "0x1022", "group": 10, "driver": "pcieport"}
NIC = {"address": "0000:02:00.0", "class": "0x020000", "group": 11, "driver": "igb"}


def api_args(pve, cafile, **fields):
    """A module's arguments for node pve1 of a fakepve, logged in as root@pam with fakepve's password, and fields."""
    base = {"api_host": pve.host, "api_port": pve.port, "api_password": "secret", "ca_path": cafile, "node": "pve1"}
    return {**base, **fields}


def play_with_pve_api(tmp_path, connection, role, *extra):
    """Run role pve_api, then role (a roles: entry), on localhost with connection as the play's vars:
    (changed, failed, the output)."""
    path = tmp_path / "play.yml"
    play = {"name": "Wire the GPUs", "hosts": "localhost", "gather_facts": False, "vars": connection}
    path.write_text(yaml.safe_dump([{**play, "roles": [{"role": "pve_api"}, role]}]))
    proc = run_playbook(path, *extra)
    recap = re.search(r"localhost\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", proc.stdout)
    assert recap, proc.stdout[-3000:] + proc.stderr[-2000:]
    return int(recap.group(1)), int(recap.group(2)), proc.stdout
