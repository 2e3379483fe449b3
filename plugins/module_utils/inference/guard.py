"""GPU guard of an inference unit: run by systemd before start, after start and after stop.

  check      (ExecStartPre=+) the unit's GPUs are bound to the nvidia driver (not given to the VM), their
             device nodes exist, and no process holds them. Leftovers of this same unit (processes that
             carry its INFERHOST_UNIT marker or sit in its cgroup) are terminated; any other holder makes
             the start fail with its pid, command and owner. With nvidia-smi, the GPUs' used memory must
             also drop below a threshold (a process in another container or on the host is invisible
             to /proc here, but not to the driver).
  ready      (ExecStartPost=) wait until /health answers 200 and /v1/models lists the model, logging
             progress, so the unit is "active" only when it serves.
  wait-free  (ExecStopPost=+) wait until no process holds the GPUs and their memory is free again, so the
             next service does not start on GPUs that are still being released.

Who holds the nodes is gpu_switch's scan (gpu_switch/holders.py) and readiness is the probe module's
(client.py); this file adds whose a holder is, the driver and memory checks and the command line. Standard
library only: the inference_service role installs it with client.py and holders.py in a library directory
of the guest, which the installed ``gpu-guard`` command puts first on the path (``gpu_switch`` there is a
namespace package holding holders.py alone). Every path it reads is configurable, so tests run it against
stand-in device nodes and a fake sysfs tree.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from gpu_switch.holders import Holder, find_holders, read_text

from .client import KEY_VAR, readiness

MARKER = "INFERHOST_UNIT"


def log(message):
    """One line of the guard's output (systemd puts it in the unit's journal)."""
    print(f"gpu-guard: {message}", flush=True)


class GuardError(RuntimeError):
    """A start the guard refuses; the message says why and what to do."""


# --- whose a holder of the device nodes is -------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """A holder of one of the unit's device nodes, with what tells whose it is."""

    holder: Holder
    uid: str
    marker: str  # the INFERHOST_UNIT value in its environment, "" when none or unreadable
    environ_readable: bool
    cgroup: str

    @property
    def pid(self):
        return self.holder.pid

    def belongs_to(self, unit):
        """A leftover of this unit: it carries the unit's marker or sits in the unit's cgroup."""
        return self.marker == unit or any(line.endswith("/" + unit) for line in self.cgroup.splitlines())

    def __str__(self):
        if self.marker:
            owner = f"unit {self.marker}"
        elif not self.environ_readable:
            owner = "environment unreadable, so not provably this unit's"
        else:
            owner = "no inference unit"
        command = self.holder.command[:120]
        return f"pid {self.pid} ({command}; uid {self.uid}; {owner}) holds {self.holder.path}"


def ownership(proc, holder):
    """The holder with its uid, marker and cgroup read from /proc."""
    base = os.path.join(proc, str(holder.pid))
    try:
        with open(os.path.join(base, "environ"), "rb") as handle:
            environ = handle.read().split(b"\0")
        readable = True
    except OSError:  # another user's process, and no CAP_SYS_PTRACE (a container): only the cgroup tells
        environ, readable = [], False
    prefix = MARKER.encode() + b"="
    marker = next((e[len(prefix) :].decode(errors="replace") for e in environ if e.startswith(prefix)), "")
    status = read_text(os.path.join(base, "status"))
    uid = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid:")), "?")
    cgroup = read_text(os.path.join(base, "cgroup")).strip()
    return Held(holder=holder, uid=uid, marker=marker, environ_readable=readable, cgroup=cgroup)


def holders(proc, devices):
    """Every process but the guard and its parent with one of ``devices`` open, with whose it is."""
    found = find_holders(proc, (os.getpid(), os.getppid()), nvidia=False, nodes=tuple(devices))
    return [ownership(proc, h) for h in found]


def alive(pid):
    """Whether ``pid`` still exists (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate(pids, timeout, kill=os.kill, is_alive=alive, sleep=time.sleep):
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL what is left. Returns the pids killed hard."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    remaining = list(pids)
    while remaining and time.monotonic() < deadline:
        sleep(0.2)
        remaining = [p for p in remaining if is_alive(p)]
    for pid in remaining:
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)
    return remaining


def clean_leftovers(args, found):
    """Terminate the holders that are this unit's leftovers; returns the others."""
    mine = [h for h in found if h.belongs_to(args.unit)]
    if mine:
        for held in mine:
            log(f"leftover of {args.unit}: {held}; terminating it")
        hard = terminate([h.pid for h in mine], args.kill_timeout)
        if hard:
            log(f"sent SIGKILL to {', '.join(map(str, hard))} after {args.kill_timeout:g} s")
    return [h for h in found if not h.belongs_to(args.unit)]


# --- the driver and the GPU memory -----------------------------------------------------------------


def bound_driver(sysfs, address):
    """The driver the PCI function ``address`` is bound to, or None."""
    link = os.path.join(sysfs, "bus", "pci", "devices", address, "driver")
    if not os.path.lexists(link):
        return None
    return os.path.basename(os.readlink(link))


def memory_used(nvidia_smi, gpus):
    """{gpu index: MiB used} from nvidia-smi, or None when nvidia-smi is not available."""
    exe = shutil.which(nvidia_smi) if nvidia_smi else None
    if not exe or not gpus:
        return None
    out = subprocess.run(
        [exe, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", ",".join(map(str, gpus))],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if out.returncode != 0:
        raise GuardError(f"nvidia-smi failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    used = {}
    for line in out.stdout.splitlines():
        if "," in line:
            index, mib = (part.strip() for part in line.split(",", 1))
            used[int(index)] = int(float(mib))
    return used


def busy_memory(args):
    """{gpu index: MiB used} of the GPUs with more than the free threshold in use ({} without nvidia-smi)."""
    used = memory_used(args.nvidia_smi, args.gpu)
    if used is None:
        return {}
    return {gpu: mib for gpu, mib in used.items() if mib > args.max_used_mib}


# --- commands ------------------------------------------------------------------------------------


def cmd_check(args):
    """ExecStartPre: refuse the start unless the GPUs are on nvidia, present and free."""
    for gpu_address in args.pci:
        driver = bound_driver(args.sysfs, gpu_address)
        if driver != "nvidia":
            where = "given to the VM" if driver == "vfio-pci" else "not usable here"
            raise GuardError(
                f"GPU {gpu_address} is bound to {driver or 'no driver'} ({where}): "
                "move the GPUs back first (gpu-switch to-ct)"
            )
    for path in args.device + args.control:
        if not os.path.exists(path):
            raise GuardError(f"device node {path} is missing: is the GPU passed through to this guest?")
    others = clean_leftovers(args, holders(args.proc, args.device))
    if others:
        raise GuardError(
            "the GPUs of "
            + args.unit
            + " are in use; nothing was stopped because these processes do not belong to it: "
            + "; ".join(map(str, others))
        )
    deadline = time.monotonic() + args.wait
    busy = busy_memory(args)
    while busy and time.monotonic() < deadline:
        time.sleep(1)
        busy = busy_memory(args)
    if busy:
        listing = ", ".join(f"GPU {g}: {m} MiB" for g, m in sorted(busy.items()))
        raise GuardError(
            f"GPU memory is in use ({listing}, more than {args.max_used_mib} MiB) by a process this guest cannot "
            "see (the host or another guest): free it first"
        )
    log(f"{args.unit}: GPUs {', '.join(map(str, args.gpu)) or '-'} are free and bound to nvidia")
    return 0


def cmd_wait_free(args):
    """ExecStopPost: wait until nobody holds the GPUs and their memory is free; 1 after the timeout."""
    deadline = time.monotonic() + args.timeout
    last = 0.0
    while True:
        found = clean_leftovers(args, holders(args.proc, args.device))
        busy = busy_memory(args)
        if not found and not busy:
            log(f"{args.unit}: GPUs released")
            return 0
        now = time.monotonic()
        if now >= deadline:
            for held in found:
                log(f"still held after {args.timeout:g} s: {held}")
            for gpu, mib in sorted(busy.items()):
                log(f"GPU {gpu} still has {mib} MiB in use after {args.timeout:g} s")
            return 1
        if now - last >= 5:
            log(f"waiting for the GPUs to be released ({len(found)} holders, {len(busy)} GPUs with memory in use)")
            last = now
        time.sleep(0.5)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: there
        return True
    return True


def cmd_ready(args):
    """ExecStartPost: wait until the service serves the model (the unit's API key from its environment)."""
    key = os.environ.get(KEY_VAR) or None
    # systemd gives ExecStartPost the engine's pid: an engine that has exited will never serve.
    main_pid = int(os.environ.get("MAINPID") or 0)
    start = time.monotonic()
    last = -args.log_every
    while True:
        state = readiness(args.url, args.model, key)
        elapsed = time.monotonic() - start
        if state["ready"]:
            log(f"{args.model} is ready after {elapsed:.0f} s")
            return 0
        seen = f"health {state['health']}, models {state['models_status']}"
        if main_pid and not _alive(main_pid):
            log(f"the engine (pid {main_pid}) exited after {elapsed:.0f} s without serving {args.model} ({seen})")
            return 1
        if elapsed >= args.timeout:
            log(f"{args.model} not ready after {args.timeout:g} s ({seen})")
            return 1
        if elapsed - last >= args.log_every:
            log(f"waiting for {args.model}: {elapsed:.0f} s, {seen}")
            last = elapsed
        time.sleep(args.interval)


def parser():
    """The command line of the three commands."""
    top = argparse.ArgumentParser(prog="gpu-guard", description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)
    for name in ("check", "wait-free"):
        p = sub.add_parser(name)
        p.add_argument("--unit", required=True, help="this unit's name (%%n), for its leftovers")
        p.add_argument("--device", action="append", default=[], help="a device node of one of the unit's GPUs")
        p.add_argument("--control", action="append", default=[], help="a shared node that must exist (nvidiactl)")
        p.add_argument("--pci", action="append", default=[], help="PCI address of one of the unit's GPUs")
        p.add_argument("--gpu", action="append", type=int, default=[], help="GPU index, for nvidia-smi")
        p.add_argument("--sysfs", default="/sys")
        p.add_argument("--proc", default="/proc")
        p.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi to read memory.used with ('' = none)")
        p.add_argument("--max-used-mib", type=int, default=1024, help="memory per GPU that counts as free")
        p.add_argument("--kill-timeout", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL")
        p.add_argument("--wait", type=float, default=60.0, help="check: seconds to wait for GPU memory to drop")
        p.add_argument("--timeout", type=float, default=120.0, help="wait-free: seconds to wait in all")
    p = sub.add_parser("ready")
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--timeout", type=float, default=2700.0)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--log-every", type=float, default=30.0)
    return top


def main(argv=None):
    """Run one command; the exit status for systemd (0 go on, 1 refused or timed out)."""
    args = parser().parse_args(argv)
    handler = {"check": cmd_check, "wait-free": cmd_wait_free, "ready": cmd_ready}[args.command]
    try:
        return handler(args)
    except GuardError as exc:
        log(f"refusing: {exc}")
        return 1
