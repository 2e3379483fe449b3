"""The Proxmox hookscript of both guests: a pre-start that refuses to start a guest whose GPUs are bound to the
other side's driver.

PVE calls ``<hookscript> <vmid> <phase>``; a non-zero exit at pre-start aborts the start. Without this guard
a plain ``qm start`` of the VM would make PVE unbind the GPUs from nvidia under the running container (PVE
binds every hostpci device to vfio-pci at VM start), and a container start would hand it device nodes of
GPUs that sit on vfio-pci. Reads sysfs only: no API call, no lock (the move itself starts guests while it
holds the lock). A configuration it cannot read makes it refuse: fail closed.
"""

from __future__ import annotations

import os
import sys

from .config import DEFAULT_PATH, load_config
from .errors import GpuSwitchError
from .journal import Journal, boot_id
from .pci import Sysfs, discover


def check(config, vmid: int, phase: str) -> str | None:
    """None if the guest may go on, else the reason it may not start."""
    if phase != "pre-start" or vmid not in (config.vm_vmid, config.container_vmid):
        return None
    journal = Journal(config.journal_path).load()
    if journal and journal.get("needs_reboot") and journal.get("boot_id") == boot_id(config.roots.proc):
        return f"GPU {', '.join(journal['needs_reboot'])} needs a host reboot (a sysfs write hung in the kernel)"
    gpus = discover(config, Sysfs(config.roots.sysfs))
    if vmid == config.vm_vmid:
        wrong = [f for g in gpus for f in g.functions if f.driver and f.driver != config.passthrough_driver]
        side, fix = "the host's and the container's", "gpu-switch to-vm"
    else:
        wrong = [f for g in gpus for f in g.functions if f.driver == config.passthrough_driver]
        side, fix = "the VM's", "gpu-switch to-ct"
    if not wrong:
        return None
    names = ", ".join(f"{f.address} ({f.driver})" for f in wrong[:4]) + (", ..." if len(wrong) > 4 else "")
    return f"GPU functions {names} are bound to {side} driver; move them with {fix}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not argv[0].isdigit():
        sys.stderr.write("usage: gpu-switch-hook <vmid> <phase>\n")
        return 2
    vmid, phase = int(argv[0]), argv[1]
    if phase != "pre-start":
        return 0
    kind = "guest"
    try:
        config = load_config(os.environ.get("GPU_SWITCH_CONFIG") or DEFAULT_PATH)
        kind = {config.vm_vmid: "VM", config.container_vmid: "CT"}.get(vmid, kind)
        reason = check(config, vmid, phase)
    except GpuSwitchError as exc:
        reason = f"cannot check the GPUs ({exc.reason})"
    if reason is None:
        return 0
    sys.stderr.write(f"gpu-switch hook: refusing to start {kind} {vmid}: {reason}\n")
    return 1
