"""The simulated GPUs as a filesystem: the kernel model's tree served over FUSE, its writes answered by the model.

    python3 -m inferhost.sim.gpu_fuse --state DIR --mount DIR [--gpus JSON|COUNT|@FILE] [--dev DIR] [--bind]

On first start it builds the tree in DIR (``sys/``, ``proc/``; ``dev/`` unless --dev names another directory)
with the GPUs given: a count, or a JSON list of ``{"address", "numa_node"}`` (inline, or in a file after @).
Then it serves DIR at the mount point until stopped. Reads pass through; a write to a file under ``sys/``
goes to ``FakeKernel.write``, so the errors (ENODEV, EBUSY, ...), the hung paths and the bindings are the
model's. Nothing is cached by the kernel (zero attribute and entry timeouts, direct I/O), as with sysfs.

``--bind`` (the lab's host machine, which has no GPUs) mounts the served subtrees where a real host has
them: ``/sys/bus/pci``, ``/sys/devices/pci0000:00``, ``/sys/kernel/iommu_groups`` and ``/proc/driver``;
gpu-switch then reads and writes the real paths, in child processes, with its default configuration.
Under systemd (Type=notify) it reports itself ready once every subtree is bound; a failed bind stops it.

``--boot-marker FILE`` (on /run, which a reboot empties) tells a boot from a restart of the service: at a
boot the model reboots (overrides gone, every function probed afresh) and each ``--module NAME=PACKAGE``
loads at the version of that Debian package as dpkg has it installed, or not at all when it is not: the
module DKMS built for the kernel, as a real host loads it. Its ``/sys/module`` is then bound over the
machine's.

When the crash trigger fires, the writing process dies as gpu-switch would: the writer and, when the writer
is gpu-switch's one-shot child, gpu-switch itself.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

try:  # PyPI's binding for libfuse 2 and 3, or Debian's python3-fusepy
    import mfusepy as fuse
except ImportError:  # pragma: no cover - the lab's host machine
    import fusepy as fuse

try:
    from .gpu_kernel import META, FakeKernel, build
except ImportError:  # pragma: no cover - run as a script next to gpu_kernel.py
    from gpu_kernel import META, FakeKernel, build

# Where --bind puts each served subtree (relative to the state directory) on the machine.
BINDS = (
    ("sys/bus/pci", "/sys/bus/pci"),
    ("sys/devices/pci0000:00", "/sys/devices/pci0000:00"),
    ("sys/kernel/iommu_groups", "/sys/kernel/iommu_groups"),
    ("proc/driver", "/proc/driver"),
)
_STAT_KEYS = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime", "st_mtime", "st_ctime")


def _caller_dies() -> None:
    """SIGKILL the process that wrote, and its parent when the writer is gpu-switch's one-shot child."""
    pid = fuse.fuse_get_context()[2]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return
    if b"-c" in argv and b"-I" in argv:  # gpu-switch writes through `python3 -I -S -c ...`
        os.kill(ppid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


class GpuFs(fuse.Operations):
    """The state directory, read as it is; writes under sys/ go to the kernel model."""

    use_ns = True  # times in nanoseconds, as the binding prefers

    def __init__(self, state: str, kernel: FakeKernel):
        self.state, self.kernel = os.path.realpath(state), kernel

    def _full(self, path: str) -> str:
        return os.path.join(self.state, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._full(path))
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None
        return {key: getattr(st, key) for key in _STAT_KEYS}

    def readdir(self, path, fh):
        # Not the model's own files (.fakekernel.json and the like).
        return [".", "..", *(n for n in os.listdir(self._full(path)) if not n.startswith(".fake"))]

    def readlink(self, path):
        return os.readlink(self._full(path))

    def open(self, path, flags):
        if not os.path.isfile(self._full(path)):
            raise fuse.FuseOSError(errno.ENOENT)
        return 0

    def read(self, path, size, offset, fh):
        with open(self._full(path), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def truncate(self, path, length, fh=None):
        return 0  # sysfs ignores O_TRUNC: `echo x > file` is one write

    def write(self, path, data, offset, fh):
        full = self._full(path)
        if not full.startswith(os.path.join(self.state, "sys") + os.sep):
            raise fuse.FuseOSError(errno.EACCES)
        try:
            self.kernel.write(full, data.decode())
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno or errno.EIO) from None
        return len(data)


def wait_mounted(mount: str, timeout: float = 10.0) -> None:
    """Return once the filesystem at mount answers (for _bind, and for a caller that started main())."""
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mount):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{mount} was not mounted within {timeout:g} s")
        time.sleep(0.05)


def _bind(mount: str, binds) -> None:
    """Once the filesystem answers, mount its subtrees where a real host has them (none without --bind), then
    tell systemd the service is ready (Type=notify). A failure stops the whole process: no half-bound host."""
    try:
        wait_mounted(mount, timeout=60)
        for rel, target in binds:
            subprocess.run(["mount", "--bind", os.path.join(mount, rel), target], check=True, capture_output=True)
    except (OSError, TimeoutError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else exc
        print(f"gpu_fuse: binding the tree failed: {detail}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if binds:
        print(f"gpu_fuse: bound {', '.join(t for _, t in binds)}", flush=True)
    notify_ready()


def notify_ready() -> None:
    """sd_notify(READY=1) when systemd started this process as a notify service; nothing otherwise."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(b"READY=1")


def _unbind(binds) -> None:
    for _, target in reversed(binds):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)


def installed_version(package: str) -> str | None:
    """The upstream version of an installed Debian package (590.48.01 of 590.48.01-1), None when not installed
    (the status's second letter; the first is the selection, h for a held package)."""
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Version}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    fields = proc.stdout.split()  # "hi  590.48.01-1": the abbreviation has a third, blank letter
    if proc.returncode != 0 or len(fields) != 2 or fields[0][1:2] != "i":
        return None
    return fields[1].rsplit("-", 1)[0]


def boot(kernel: FakeKernel, marker: str, modules: list[str], fresh: bool) -> None:
    """What this machine's boot does to the model, once per boot (marker is on /run): see the module doc."""
    if os.path.exists(marker):
        return
    if not fresh:
        kernel.reboot(str(uuid.uuid4()))
    for spec in modules:
        name, _, package = spec.partition("=")
        kernel.load_module(name, installed_version(package))
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(marker, "w", encoding="utf-8") as fh:
        fh.write("booted\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_fuse", description="Serve simulated GPUs over FUSE.")
    p.add_argument("--state", required=True, help="the model's tree (built on first start)")
    p.add_argument("--mount", required=True, help="where to serve it")
    p.add_argument("--gpus", default="2", help="a count, or a JSON list of {address, numa_node}, or @FILE")
    p.add_argument("--dev", help="the device directory for /dev/nvidiaN (default STATE/dev)")
    p.add_argument("--bind", action="store_true", help="bind the served subtrees over /sys and /proc")
    p.add_argument("--boot-marker", help="a file on /run: its absence means this start is a boot")
    p.add_argument("--module", action="append", default=[], help="NAME=PACKAGE: loaded at a boot when installed")
    args = p.parse_args(argv)
    sysfs, proc = os.path.join(args.state, "sys"), os.path.join(args.state, "proc")
    dev = args.dev or os.path.join(args.state, "dev")
    fresh = not os.path.exists(os.path.join(sysfs, META))
    if fresh:
        text = args.gpus
        if text.startswith("@"):
            with open(text[1:], encoding="utf-8") as fh:
                text = fh.read()
        gpus = json.loads(text) if text.lstrip().startswith("[") else int(text)
        print(f"gpu_fuse: built {', '.join(build(args.state, gpus, dev=dev))}", flush=True)
    kernel = FakeKernel.open(sysfs, proc, dev)
    kernel.on_crash = _caller_dies
    os.makedirs(os.path.join(sysfs, "module"), exist_ok=True)  # a tree built before modules were modelled
    binds = BINDS
    if args.boot_marker:
        boot(kernel, args.boot_marker, args.module, fresh)
        binds = (*BINDS, ("sys/module", "/sys/module"))
    os.makedirs(args.mount, exist_ok=True)
    threading.Thread(target=_bind, args=(args.mount, binds if args.bind else ()), daemon=True).start()
    try:
        fuse.FUSE(
            GpuFs(args.state, kernel),
            args.mount,
            foreground=True,
            allow_other=True,
            attr_timeout=0,
            entry_timeout=0,
            negative_timeout=0,
            direct_io=True,
        )
    finally:
        if args.bind:
            _unbind(binds)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
