# SPDX-License-Identifier: Apache-2.0
"""Planning a move: read the state (the GPUs' functions and drivers, both guests' status and config), describe
it, and turn it into the steps that bring the GPUs to a side, each with its undo, in the order they run.

Every precondition is checked here, before any change: the IOMMU and whole groups, the receiver's entries
(and a login that may write them), a receiver that runs without the GPUs, processes that hold the GPUs. The
steps' bodies belong to the phases that run them: the guests' power and entries (``guests.GuestControl``) and
the host side (``execute.HostSteps``), both handed in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import entries
from .context import Context
from .errors import ApiError, Refused
from .guests import Guest, GuestControl
from .holders import Holder, find_holders
from .outcome import Outcome, drivers_view
from .pci import Gpu, describe_device, discover, foreign_group_members, nvidia_device_paths

if TYPE_CHECKING:
    from .execute import HostSteps

SIDES = {"vm": ("qemu", "vm"), "ct": ("lxc", "container")}


@dataclass
class State:
    gpus: list[Gpu]
    owner: str
    guests: dict[str, Guest]


@dataclass
class Step:
    name: str
    detail: str
    do: Callable[[], object]
    undo: Callable[[], object] | None = None
    address: str | None = None
    state: str = "planned"
    note: str | None = None
    touched: bool = False  # do() completed, or failed after it may have changed something

    def as_dict(self) -> dict:
        out = {"name": self.name, "detail": self.detail, "state": self.state}
        if self.address:
            out["address"] = self.address
        if self.note:
            out["note"] = self.note
        return out


def owner_of(gpus: list[Gpu], host_driver: str, passthrough: str) -> str:
    functions = [f for g in gpus for f in g.functions]
    if not functions:
        return "none"
    if all(f.driver == passthrough for f in functions):
        return "vm"
    if all(g.primary.driver == host_driver for g in gpus) and not any(f.driver == passthrough for f in functions):
        return "ct"
    if all(f.driver is None for f in functions):
        return "none"
    return "split"


def holders_text(what: str, holders: list[Holder]) -> str:
    return f"{what}: " + "; ".join(map(str, holders[:8])) + ("; ..." if len(holders) > 8 else "")


def needs(fn, action) -> bool:
    """Whether the function is not yet where its action puts it."""
    if action[0] == "bind":
        return fn.driver != action[1]
    if action[0] == "release":
        return fn.driver == action[1] or (fn.driver is None and fn.override is not None)
    return fn.driver != action[1] or fn.override != action[2]


class Planner:
    """Reads the state and plans a move from it."""

    def __init__(self, ctx: Context, guests: GuestControl, host_steps: HostSteps):
        self.ctx = ctx
        self.guests = guests
        self.host_steps = host_steps

    # ------------------------------------------------------------------ state

    def read_state(self) -> State:
        gpus = discover(self.ctx.cfg, self.ctx.sysfs)
        guests = self.guests.guests()
        for guest in guests.values():
            try:
                guest.status = self.ctx.api.status(guest.kind, guest.vmid)
                guest.config = self.ctx.api.config(guest.kind, guest.vmid)
            except ApiError as exc:
                guest.error = exc.reason
        return State(gpus, owner_of(gpus, self.ctx.cfg.host_driver, self.ctx.cfg.passthrough_driver), guests)

    def describe(self, state: State) -> dict:
        slots = [g.slot for g in state.gpus]
        functions = [f.address for g in state.gpus for f in g.functions]
        out = {"owner": state.owner, "gpus": [g.as_dict() for g in state.gpus]}
        for role, guest in state.guests.items():
            item = {
                "vmid": guest.vmid,
                "status": guest.status,
                "config": entries.gpu_entries(guest.kind, guest.config, slots, functions),
            }
            if guest.error:
                item["error"] = guest.error
            out[role] = item
        return out

    def dry_run(self, command, target, force, shutdown_timeout, recovery) -> Outcome:
        """The plan as a result: every step planned, nothing changed."""
        state = self.read_state()
        steps = self.plan(state, target, force=force, shutdown_timeout=shutdown_timeout, recovery=recovery)
        result = self.describe(state)
        result.update(
            command=command, changed=False, dry_run=True, would_change=bool(steps), steps=[s.as_dict() for s in steps]
        )
        result["before"] = drivers_view(result)
        return Outcome(result)

    # -------------------------------------------------------------- function targets

    def _actions(self, gpus: list[Gpu], target: str, restore: dict | None) -> dict[str, tuple]:
        """address -> action for every function: ('bind', driver, override), ('release', away_from) or
        ('restore', driver, override)."""
        host, passthrough = self.ctx.cfg.host_driver, self.ctx.cfg.passthrough_driver
        actions = {}
        for gpu in gpus:
            for fn in gpu.functions:
                if restore and fn.address in restore:
                    orig = restore[fn.address]
                    actions[fn.address] = ("restore", orig.get("driver"), orig.get("override"))
                elif target == "vm":
                    actions[fn.address] = ("bind", passthrough, passthrough)
                elif fn.address == gpu.address:
                    # The override stays on the host driver: PVE's own bind-to-vfio at a VM start then fails
                    # instead of taking the GPU from the running container.
                    actions[fn.address] = ("bind", host, host)
                else:
                    actions[fn.address] = ("release", passthrough)
        return actions

    # ------------------------------------------------------------------ checks

    def _refuse_foreign_groups(self, gpus: list[Gpu]) -> None:
        sysfs = self.ctx.sysfs
        if not sysfs.iommu_enabled():
            raise Refused(
                f"the IOMMU is off ({sysfs.groups} is empty): VFIO passthrough needs it "
                "(amd_iommu/intel_iommu on, iommu=pt)"
            )
        for gpu in gpus:
            if gpu.iommu_group is None:
                raise Refused(f"GPU {gpu.address} has no IOMMU group: VFIO passthrough needs the IOMMU")
        foreign = foreign_group_members(gpus, sysfs)
        if foreign:
            gpu, member = foreign[0]
            raise Refused(
                f"IOMMU group {gpu.iommu_group} of GPU {gpu.address} also holds "
                f"{describe_device(sysfs, member)}, which is not a function of a configured GPU: "
                "a group moves to the VM whole or not at all (put the GPU in another slot, or enable ACS)"
            )

    def _ct_predicted(self, config: dict, gpus: list[Gpu], moving: bool) -> list[str]:
        """devN paths the container config lacks. While the GPUs are not on the host driver their minors are
        unknown: then the container counts as complete if it has as many /dev/nvidiaN entries as GPUs."""
        existing = self.guests.ct_existing_paths(config)
        paths, missing = nvidia_device_paths(gpus, self.ctx.cfg.roots.proc, self.ctx.cfg.roots.dev)
        if not missing:
            return [p for p in paths if p not in existing]
        if not moving:
            raise Refused(
                f"device nodes missing on the host: {', '.join(missing)}; the container cannot start "
                "without them (nvidia-modprobe creates them)"
            )
        lack = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm") if p not in existing]
        numbered = [p for p in existing if re.fullmatch(r"/dev/nvidia\d+", p)]
        if len(numbered) < len(gpus):
            lack.append(f"/dev/nvidiaN for {len(gpus) - len(numbered)} GPU(s)")
        return lack

    def _foreign_holders(self, holders: list[Holder], giver: Guest) -> list[Holder]:
        return [h for h in holders if not h.is_persistenced and not (giver.kind == "lxc" and h.container == giver.vmid)]

    # -------------------------------------------------------------------- plan

    def plan(
        self,
        state: State,
        target: str,
        *,
        force: bool = False,
        shutdown_timeout: float | None = None,
        recovery: dict | None = None,
    ) -> list[Step]:
        """The steps that bring the GPUs to target ('vm' or 'ct'); Refused if a precondition fails first."""
        cfg = self.ctx.cfg
        receiver = state.guests[SIDES[target][1]]
        giver = state.guests["container" if target == "vm" else "vm"]
        for guest in (receiver, giver):
            if guest.error:
                raise Refused(f"cannot read {guest.label}: {guest.error}")
        actions = self._actions(state.gpus, target, (recovery or {}).get("restore"))
        moving = [g for g in state.gpus if any(needs(f, actions[f.address]) for f in g.functions)]
        unbinding_host = any(
            f.driver == cfg.host_driver and needs(f, actions[f.address]) for g in moving for f in g.functions
        )
        if target == "vm":
            self._refuse_foreign_groups(state.gpus)
        config_what = self._check_receiver(receiver, state.gpus, target, bool(moving))
        if unbinding_host:
            foreign = self._foreign_holders(find_holders(cfg.roots.proc, exclude_pids=(os.getpid(),)), giver)
            if foreign:
                self.ctx.holders = foreign  # --json reports them by pid, command and path, as after a stop
                raise Refused(holders_text("the GPUs are in use", foreign) + " (stop them first)")

        steps = self._rebind_steps(
            moving,
            actions,
            giver,
            target,
            force=force,
            shutdown_timeout=shutdown_timeout,
            recovery=recovery,
            unbinding_host=unbinding_host,
        )
        if config_what is not None:
            steps.append(
                Step(
                    "guest-config",
                    f"add to {receiver.label}: {config_what}",
                    lambda: self.guests.ensure_config(receiver),
                    lambda: self.guests.undo_config(receiver),
                )
            )
        if receiver.status != "running":
            steps.append(
                Step(
                    "start-guest",
                    f"start {receiver.label}",
                    lambda: self.guests.start(receiver),
                    lambda: self.guests.stop_started(receiver),
                )
            )
        return steps

    def _check_receiver(self, receiver: Guest, gpus: list[Gpu], target: str, moving: bool) -> str | None:
        """What the receiving guest's config lacks, as text (None: nothing); refuses bad entries, a token login
        that could not write them, and a receiver that runs without the GPUs, all before any change."""
        cfg = self.ctx.cfg
        # The container's devN entries are the nodes the nvidia driver creates; another host driver (a stand-in
        # device on a test machine) has none that gpu-switch knows, so the container's config is left alone.
        ct_nodes = target == "ct" and cfg.host_driver == "nvidia"
        if target == "vm":
            additions = self.guests.vm_additions(receiver.config, gpus, self.guests.vm_mapped(receiver.config))
            raw = self.guests.raw_additions(additions)
        else:
            additions = raw = self._ct_predicted(receiver.config, gpus, moving) if ct_nodes else []
        if raw and not cfg.proxmox.is_root_pam:
            raise Refused(self.guests.root_pam_error(", ".join(raw)))
        # A container that gets rebound GPUs always has its entries checked again (the minors may change).
        needed = bool(additions) or (ct_nodes and moving)
        if receiver.status == "running" and (moving or needed):
            raise Refused(
                f"{receiver.label} is running without the GPUs; stop it first (the move starts it again with them)"
            )
        if not needed:
            return None
        return ", ".join(additions) or "the GPUs' /dev/nvidia* nodes"

    def _rebind_steps(
        self, moving, actions, giver, target, *, force, shutdown_timeout, recovery, unbinding_host
    ) -> list[Step]:
        ctx, cfg, steps = self.ctx, self.ctx.cfg, []
        host, bodies = ctx.host, self.host_steps
        unit = cfg.persistenced_unit
        active = bool(unit) and host.is_active(unit)
        want_active = (
            active
            if (recovery or {}).get("persistenced_active") is None
            else bool(unit) and recovery["persistenced_active"]
        )
        ctx.persistenced_active = want_active
        if moving:
            for driver in sorted({a[1] for a in actions.values() if a[0] in ("bind", "restore") and a[1]}):
                if not ctx.sysfs.driver_loaded(driver):
                    steps.append(Step("load-driver", f"modprobe {driver}", lambda d=driver: host.modprobe(d)))
            if giver.status == "running":
                timeout = shutdown_timeout or cfg.timeouts.shutdown
                steps.append(
                    Step(
                        "stop-guest",
                        f"shut down {giver.label} (timeout {timeout:g} s{', then stop' if force else ''})",
                        lambda: self.guests.shutdown(giver, timeout, force),
                        lambda: self.guests.restart(giver),
                    )
                )
            if active:
                steps.append(
                    Step("stop-service", f"stop {unit}", lambda: bodies.stop_unit(unit), lambda: host.start(unit))
                )
            # A process with a GPU open through VFIO makes its unbind from vfio-pci block in the kernel
            # until it lets go: refuse instead (checked once the giving VM is down).
            vfio_nodes = tuple(
                f"/dev/vfio/{gpu.iommu_group}"
                for gpu in moving
                if gpu.iommu_group is not None
                and any(f.driver == cfg.passthrough_driver and needs(f, actions[f.address]) for f in gpu.functions)
            )
            if unbinding_host or vfio_nodes:
                held = ["/dev/nvidia*"] if unbinding_host else []
                steps.append(
                    Step(
                        "check-holders",
                        f"no process may hold {', '.join(held + list(vfio_nodes))}",
                        lambda: bodies.check_holders(unbinding_host, vfio_nodes),
                    )
                )
            for gpu in moving:
                todo = [f for f in gpu.functions if needs(f, actions[f.address])]
                detail = "; ".join(
                    f"{f.address} {f.driver or 'unbound'} -> {_describe_action(actions[f.address])}" for f in todo
                )
                originals = {f.address: (f.driver, f.override) for f in gpu.functions}
                steps.append(
                    Step(
                        "rebind",
                        detail,
                        lambda g=gpu: bodies.rebind(g, actions),
                        lambda g=gpu, o=originals: bodies.restore(g, o),
                        address=gpu.address,
                    )
                )
            if target == "ct" and cfg.host_driver == "nvidia":
                steps.append(
                    Step("device-nodes", "create the GPUs' /dev/nvidia* nodes (nvidia-modprobe)", bodies.device_nodes)
                )
        if want_active and (moving or not active):
            steps.append(
                Step("start-service", f"start {unit}", lambda: host.start(unit), lambda: bodies.stop_unit(unit))
            )
        return steps


def _describe_action(action: tuple) -> str:
    if action[0] == "release":
        return f"native driver (not {action[1]})"
    return action[1] or "unbound"
