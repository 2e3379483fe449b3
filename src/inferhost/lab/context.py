"""What every part of the lab shares: the lab as inventory/lab describes it, where its files are, its error.

Lab is read from the inventory once per command (hosts, groups, the fake API's settings in lab_proxmox), is
handed to every step and keeps the steps' timings for the summary. LabError is how a step fails: the command
line prints its message. What the lab makes lives under .cache/lab (STATE).

The lab has one host, or two (`inferhost-lab up --hosts 2`): then it runs on a copy of inventory/lab with the
second host's lines uncommented (with_second_host), as a site uncomments inventory/example's, and remembers it
for the commands that follow.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferhost.runner import use_this_environment

ROOT = Path(__file__).resolve().parents[3]
INVENTORY = ROOT / "inventory" / "lab"
STATE = ROOT / ".cache" / "lab"
# The wing's stand-in of NVIDIA's repositories, built here, mounted read-only into every machine (lab_standin_repo).
STANDIN_REPO = STATE / "standin-repo"
# The stand-in of vLLM's CPU wheel index (lab_engine_index), mounted read-only into the containers.
ENGINE_INDEX = STATE / "engine-index"
# One uv cache for the containers' environments and the test checkpoint's trainer: each wheel is downloaded once.
UV_CACHE = STATE / "uv-cache"
CONTAINER_PREFIX = "inferhost-"
# The lab of two hosts: inventory/lab with its second host uncommented, two levels below the root as inventory/lab
# is (the inventory finds the lab's SSH key at {{ inventory_dir }}/../../.cache).
CLUSTER_INVENTORY = ROOT / ".cache" / "lab-cluster"
# How many hosts the running lab has, written by `inferhost-lab up`.
HOST_COUNT = STATE / "hosts"
# What marks the second host's lines in inventory/example and inventory/lab: uncommented, the host is in.
SECOND_HOST_TAG = "# second host"
_TAGGED = re.compile(r"^([ \t]*)# ?(.*?)([ \t]+" + re.escape(SECOND_HOST_TAG) + r")[ \t]*$")


class LabError(RuntimeError):
    """A step of the lab failed; the message says which and why."""


def uncomment_second_host(text: str) -> str:
    """text with every commented line tagged SECOND_HOST_TAG uncommented (its "# " dropped, the tag kept)."""
    return "".join(_TAGGED.sub(r"\1\2\3", line) for line in text.splitlines(keepends=True))


def with_second_host(source: Path, target: Path) -> Path:
    """A copy of the inventory at source in target with its second host's lines uncommented; its hosts.yml."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    for path in target.rglob("*.yml"):
        text = path.read_text()
        if SECOND_HOST_TAG in text:
            path.write_text(uncomment_second_host(text))
    return target / "hosts.yml"


def inventory_for(host_count: int) -> Path:
    """The hosts.yml of the lab with that many hosts (1 or 2)."""
    if host_count == 1:
        return INVENTORY / "hosts.yml"
    if host_count == 2:
        return with_second_host(INVENTORY, CLUSTER_INVENTORY)
    raise LabError(f"the lab has one host or two, not {host_count}")


def current_inventory() -> Path:
    """The hosts.yml of the running lab: the two hosts' copy once `inferhost-lab up --hosts 2` made it."""
    cluster = CLUSTER_INVENTORY / "hosts.yml"
    return cluster if running_host_count() == 2 and cluster.exists() else INVENTORY / "hosts.yml"


def running_host_count() -> int:
    """The host count of the lab that `inferhost-lab up` last brought up (1 when none says otherwise)."""
    try:
        return int(HOST_COUNT.read_text())
    except (OSError, ValueError):
        return 1


@dataclass
class Lab:
    hosts: dict[str, dict]
    proxmox: dict
    groups: dict[str, list[str]] = field(default_factory=dict)
    timings: list[tuple[str, float, str]] = field(default_factory=list)
    inventory: Path = INVENTORY / "hosts.yml"

    @classmethod
    def from_inventory(cls, host_count: int | None = None) -> Lab:
        """The lab of host_count hosts (default: the running lab's count)."""
        use_this_environment()
        inventory = inventory_for(host_count or running_host_count())
        out = subprocess.run(
            ["ansible-inventory", "-i", str(inventory), "--list"],
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
        return cls(hosts=hostvars, proxmox=proxmox, groups=groups, inventory=inventory)

    def step(self, name: str, func, *args) -> object:
        print(f"==> {name}", flush=True)
        start = time.monotonic()
        result = func(*args)
        elapsed = time.monotonic() - start
        note = result if isinstance(result, str) else ""
        self.timings.append((name, elapsed, note))
        return result


def pve_hosts(lab: Lab) -> list[str]:
    """The lab's Proxmox VE hosts, the first host first."""
    return sorted(lab.groups.get("pve_hosts", []))


def pve_host(lab: Lab) -> str:
    """The lab's first Proxmox VE host, the one of a lab of one host."""
    return pve_hosts(lab)[0]


def guests_of(lab: Lab, host: str) -> dict[str, str]:
    """The lab machines of a host's guests, as the inventory has them: {"container": ..., "vm": ...}."""
    guests = {}
    for kind, group in (("container", "inference_containers"), ("vm", "inference_vms")):
        found = [g for g in sorted(lab.groups.get(group, [])) if lab.hosts[g].get("inferhost_pve_host") == host]
        if len(found) != 1:
            raise LabError(f"{host}: the lab inventory names {len(found)} {kind}s on it, not one")
        guests[kind] = found[0]
    return guests
