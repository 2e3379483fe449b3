"""What every part of the lab shares: the lab as inventory/lab describes it, where its files are, its error.

Lab is read from the inventory once per command (hosts, groups, the fake API's settings in lab_proxmox), is
handed to every step and keeps the steps' timings for the summary. LabError is how a step fails: the command
line prints its message. What the lab makes lives under .cache/lab (STATE).
"""

from __future__ import annotations

import json
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


def pve_host(lab: Lab) -> str:
    """The lab's Proxmox VE host: the machine whose inventory names its GPUs (inferhost_gpus)."""
    return next(h for h, hv in sorted(lab.hosts.items()) if "inferhost_gpus" in hv)
