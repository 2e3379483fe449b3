"""Who holds the GPUs' device nodes: a scan of /proc/<pid>/fd and /proc/<pid>/maps.

nvidia-smi inside a container is not PID-namespace aware, and PVE mknods its own copy of each node under
/var/lib/lxc/<vmid>/passthrough, so ``fuser /dev/nvidia0`` can miss a container's processes. The scan
matches the link text (any path ending in /dev/nvidia*) and, where the link resolves, the character
device's major number (the nvidia majors from /proc/devices).

It also finds the holders of given nodes, such as a GPU's /dev/vfio/<group>: a process with the device
open through VFIO (a QEMU that outlived its VM) makes the unbind from vfio-pci block in the kernel until
it lets go. The inference units' GPU guard (inference/guard.py) scans for its GPUs' nodes the same way, and
runs this file alone in the container (standard library only, nothing else of gpu_switch imported).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

NODE = re.compile(r"(^|/)dev/nvidia[^/]*(/[^/]+)?( \(deleted\))?$")
LXC = re.compile(r"/lxc(?:\.payload)?[./](\d+)(?:/|$)")
PERSISTENCED = ("nvidia-persistenced", "nvidia-persiste")  # /proc/<pid>/comm is cut at 15 characters


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    path: str
    container: int | None = None

    @property
    def is_persistenced(self) -> bool:
        return self.command.split()[0].rsplit("/", 1)[-1] in PERSISTENCED if self.command else False

    def as_dict(self) -> dict:
        out = {"pid": self.pid, "command": self.command, "path": self.path}
        if self.container is not None:
            out["container"] = self.container
        return out

    def __str__(self) -> str:
        where = f" in CT {self.container}" if self.container is not None else ""
        return f"pid {self.pid} ({self.command}){where} holds {self.path}"


def nvidia_majors(proc_root: str) -> set[int]:
    majors = set()
    try:
        with open(os.path.join(proc_root, "devices"), encoding="ascii", errors="replace") as fh:
            section = None
            for line in fh:
                if line.startswith("Character devices"):
                    section = "c"
                elif line.startswith("Block devices"):
                    section = "b"
                parts = line.split()
                if section == "c" and len(parts) == 2 and parts[0].isdigit() and parts[1].startswith("nvidia"):
                    majors.add(int(parts[0]))
    except OSError:
        pass
    return majors


def read_text(path: str) -> str:
    """A /proc file as text; "" when it cannot be read (the process is gone, or it is another user's)."""
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _command(proc: str) -> str:
    cmdline = read_text(os.path.join(proc, "cmdline")).replace("\0", " ").strip()
    return cmdline or read_text(os.path.join(proc, "comm")).strip() or "?"


def _container(proc: str) -> int | None:
    m = LXC.search(read_text(os.path.join(proc, "cgroup")))
    return int(m.group(1)) if m else None


def _node_ids(nodes: tuple[str, ...], dev_root: str) -> tuple[set[int], set[tuple[int, int]]]:
    """The st_rdev of each node that is a character device, and (st_dev, st_ino) of each other one (a stand-in
    file): a /dev/... node is looked up under dev_root, any other path where it is."""
    devices, files = set(), set()
    for node in nodes:
        path = os.path.join(dev_root, node[len("/dev/") :]) if node.startswith("/dev/") else node
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            devices.add(st.st_rdev)
        else:
            files.add((st.st_dev, st.st_ino))
    return devices, files


def _holds(
    fd_path: str, majors: set[int], nvidia: bool, nodes: tuple[str, ...], ids: tuple[set[int], set[tuple[int, int]]]
) -> str | None:
    try:
        target = os.readlink(fd_path)
    except OSError:
        return None
    if (nvidia and NODE.search(target)) or target.removesuffix(" (deleted)") in nodes:
        return target
    devices, files = ids
    if (majors or devices or files) and target.startswith("/"):
        try:
            st = os.stat(fd_path)
        except OSError:
            return None
        if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev) in majors or st.st_rdev in devices):
            return target
        if (st.st_dev, st.st_ino) in files:
            return target
    return None


def find_holders(
    proc_root: str,
    exclude_pids: tuple[int, ...] = (),
    *,
    nvidia: bool = True,
    nodes: tuple[str, ...] = (),
    dev_root: str = "/dev",
) -> list[Holder]:
    """Every process with an NVIDIA device node (unless nvidia is false) or one of nodes open or mapped, one entry
    per process, by pid. A node is matched by its path, and also by its device number (a /dev/... node read under
    dev_root, any other absolute path where it is) or, for a node that is not a device (a test's stand-in), by
    the file it is."""
    majors = nvidia_majors(proc_root) if nvidia else set()
    ids = _node_ids(nodes, dev_root)
    holders = []
    try:
        pids = sorted(int(p) for p in os.listdir(proc_root) if p.isdigit())
    except OSError:
        return []
    for pid in pids:
        if pid in exclude_pids:
            continue
        proc = os.path.join(proc_root, str(pid))
        found = None
        try:
            fds = os.listdir(os.path.join(proc, "fd"))
        except OSError:
            fds = []
        for fd in sorted(fds, key=lambda n: int(n) if n.isdigit() else 0):
            found = _holds(os.path.join(proc, "fd", fd), majors, nvidia, nodes, ids)
            if found:
                break
        if not found and nvidia:
            for line in read_text(os.path.join(proc, "maps")).splitlines():
                parts = line.split(None, 5)
                if len(parts) == 6 and NODE.search(parts[5].strip()):
                    found = parts[5].strip()
                    break
        if found:
            holders.append(Holder(pid=pid, command=_command(proc), path=found, container=_container(proc)))
    return holders
