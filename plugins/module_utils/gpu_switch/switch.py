"""The move: read the state, plan the steps (each with its undo), run them under a lock with a journal,
roll back on failure, and recover an interrupted move from the journal.

Seams (all optional constructor arguments): ``api`` (a PveApi or a fake with the same methods),
``writer`` (sysfs writes with a timeout), ``host`` (systemctl / modprobe runner), ``after_step``
(called after each step: tests inject crashes there) and ``clock``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from . import entries
from .config import Config, read_secret
from .errors import (
    EXIT_OK,
    EXIT_ROLLED_BACK,
    EXIT_STRANDED,
    ApiError,
    ConfigError,
    GpuSwitchError,
    Refused,
    StepFailed,
    TaskFailed,
    WriteTimeout,
)
from .holders import Holder, find_holders
from .journal import HostLock, Journal, boot_id
from .pci import Gpu, Sysfs, describe_device, discover, foreign_group_members, nvidia_device_paths, nvidia_minors
from .pve import PveApi, label
from .rebind import Rebinder
from .system import Host
from .writer import ProcessWriter

SIDES = {"vm": ("qemu", "vm"), "ct": ("lxc", "container")}
ROOT_PAM = (
    "Proxmox allows devN entries (and raw hostpciN ones) only for root@pam logged in with a password; "
    "{who} is {what}: set proxmox.user to root@pam with its password in password_file and no token_name, "
    "or add the entries once by hand as root ({entries})"
)


@dataclass
class Guest:
    kind: str
    role: str
    vmid: int
    status: str = "unknown"
    config: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def label(self) -> str:
        return label(self.kind, self.vmid)


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


@dataclass
class Outcome:
    """What a command returns: the JSON result, the exit code, and the one-line reason on failure."""

    result: dict
    exit_code: int = EXIT_OK
    reason: str | None = None


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


class Switcher:
    def __init__(
        self,
        config: Config,
        *,
        api=None,
        writer=None,
        host: Host | None = None,
        secret: str | None = None,
        after_step: Callable[[Step], None] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.cfg = config
        self.sysfs = Sysfs(config.roots.sysfs)
        self.writer = writer or ProcessWriter()
        self.host = host or Host(timeout=config.timeouts.command)
        self._api, self._secret = api, secret
        self.after_step = after_step
        self.clock = clock
        self.journal = Journal(config.journal_path)
        self.lock = HostLock(config.lock_path)
        self._journal: dict | None = None

    # ------------------------------------------------------------------ state

    @property
    def api(self):
        if self._api is None:
            self._api = PveApi(self.cfg.proxmox, self._secret or read_secret(self.cfg.proxmox))
        return self._api

    def guests(self) -> dict[str, Guest]:
        return {
            "container": Guest("lxc", "container", self.cfg.container_vmid),
            "vm": Guest("qemu", "vm", self.cfg.vm_vmid),
        }

    def read_state(self) -> State:
        gpus = discover(self.cfg, self.sysfs)
        guests = self.guests()
        for guest in guests.values():
            try:
                guest.status = self.api.status(guest.kind, guest.vmid)
                guest.config = self.api.config(guest.kind, guest.vmid)
            except ApiError as exc:
                guest.error = exc.reason
        return State(gpus, owner_of(gpus, self.cfg.host_driver, self.cfg.passthrough_driver), guests)

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

    # -------------------------------------------------------------- function targets

    def _actions(self, gpus: list[Gpu], target: str, restore: dict | None) -> dict[str, tuple]:
        """address -> action for every function: ('bind', driver, override), ('release', away_from) or
        ('restore', driver, override)."""
        host, passthrough = self.cfg.host_driver, self.cfg.passthrough_driver
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

    @staticmethod
    def _needs(fn, action) -> bool:
        if action[0] == "bind":
            return fn.driver != action[1]
        if action[0] == "release":
            return fn.driver == action[1] or (fn.driver is None and fn.override is not None)
        return fn.driver != action[1] or fn.override != action[2]

    # ------------------------------------------------------------------ checks

    def _refuse_foreign_groups(self, gpus: list[Gpu]) -> None:
        if not self.sysfs.iommu_enabled():
            raise Refused(
                f"the IOMMU is off ({self.sysfs.groups} is empty): VFIO passthrough needs it "
                "(amd_iommu/intel_iommu on, iommu=pt)"
            )
        for gpu in gpus:
            if gpu.iommu_group is None:
                raise Refused(f"GPU {gpu.address} has no IOMMU group: VFIO passthrough needs the IOMMU")
        foreign = foreign_group_members(gpus, self.sysfs)
        if foreign:
            gpu, member = foreign[0]
            raise Refused(
                f"IOMMU group {gpu.iommu_group} of GPU {gpu.address} also holds "
                f"{describe_device(self.sysfs, member)}, which is not a function of a configured GPU: "
                "a group moves to the VM whole or not at all (put the GPU in another slot, or enable ACS)"
            )

    def _vm_additions(self, config: dict, gpus: list[Gpu]) -> list[str]:
        """hostpciN values to add for GPUs the VM config does not pass yet; Refused on bad existing entries."""
        existing = []
        for key, value in config.items():
            if entries.HOSTPCI_KEY.match(key):
                try:
                    entries.parse_hostpci(str(value))
                except entries.EntryError as exc:
                    raise Refused(f"VM {self.cfg.vm_vmid} {key} is malformed: {exc}") from None
                existing.append((key, str(value)))
        add = []
        for gpu in gpus:
            functions = [f.address for f in gpu.functions]
            cover = {key: entries.hostpci_coverage(value, gpu.slot, functions) for key, value in existing}
            if "all" in cover.values():
                continue
            partial = [k for k, c in cover.items() if c == "some"]
            if partial:
                raise Refused(
                    f"VM {self.cfg.vm_vmid} {partial[0]} passes only some functions of GPU {gpu.address}; "
                    f"all of {', '.join(functions)} must go together: fix or delete {partial[0]}"
                )
            try:
                add.append(entries.make_hostpci(gpu.slot, self.cfg.hostpci_options))
            except entries.EntryError as exc:
                raise ConfigError(f"config {self.cfg.path}: vm.hostpci_options: {exc}") from None
        if add and "pcie=1" in self.cfg.hostpci_options.split(",") and "q35" not in str(config.get("machine", "")):
            raise Refused(
                f"VM {self.cfg.vm_vmid} has machine {config.get('machine', 'i440fx (default)')!r}, and "
                "hostpci pcie=1 needs q35: set machine: q35 on the VM, or drop pcie=1 from "
                "vm.hostpci_options"
            )
        return add

    def _ct_existing_paths(self, config: dict) -> set[str]:
        paths = set()
        for key, value in config.items():
            if entries.DEV_KEY.match(key):
                try:
                    paths.add(entries.parse_dev(str(value))["path"])
                except entries.EntryError as exc:
                    raise Refused(f"CT {self.cfg.container_vmid} {key} is malformed: {exc}") from None
        return paths

    def _ct_predicted(self, config: dict, gpus: list[Gpu], moving: bool) -> list[str]:
        """devN paths the container config lacks. While the GPUs are not on the host driver their minors are
        unknown: then the container counts as complete if it has as many /dev/nvidiaN entries as GPUs."""
        existing = self._ct_existing_paths(config)
        paths, missing = nvidia_device_paths(gpus, self.cfg.roots.proc, self.cfg.roots.dev)
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

    def _root_pam_error(self, what: str) -> str:
        px = self.cfg.proxmox
        who = f"the API token {px.identity}" if px.token_name else f"the user {px.user}"
        return ROOT_PAM.format(
            who=who, what="not root@pam" if px.token_name or px.user != "root@pam" else "root@pam", entries=what
        )

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
        receiver = state.guests[SIDES[target][1]]
        giver = state.guests["container" if target == "vm" else "vm"]
        for guest in (receiver, giver):
            if guest.error:
                raise Refused(f"cannot read {guest.label}: {guest.error}")
        actions = self._actions(state.gpus, target, (recovery or {}).get("restore"))
        moving = [g for g in state.gpus if any(self._needs(f, actions[f.address]) for f in g.functions)]
        unbinding_host = any(
            f.driver == self.cfg.host_driver and self._needs(f, actions[f.address]) for g in moving for f in g.functions
        )
        if target == "vm":
            self._refuse_foreign_groups(state.gpus)
        config_what = self._check_receiver(receiver, state.gpus, target, bool(moving))
        if unbinding_host:
            foreign = self._foreign_holders(find_holders(self.cfg.roots.proc, exclude_pids=(os.getpid(),)), giver)
            if foreign:
                self._holders = foreign  # --json reports them by pid, command and path, as after a stop
                raise Refused(_holders_text("the GPUs are in use", foreign) + " (stop them first)")

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
                    lambda: self._ensure_config(receiver),
                    lambda: self._undo_config(receiver),
                )
            )
        if receiver.status != "running":
            steps.append(
                Step(
                    "start-guest",
                    f"start {receiver.label}",
                    lambda: self._start(receiver),
                    lambda: self._stop_started(receiver),
                )
            )
        return steps

    def _check_receiver(self, receiver: Guest, gpus: list[Gpu], target: str, moving: bool) -> str | None:
        """What the receiving guest's config lacks, as text (None: nothing); refuses bad entries, a token login
        that could not write them, and a receiver that runs without the GPUs, all before any change."""
        # The container's devN entries are the nodes the nvidia driver creates; another host driver (a stand-in
        # device on a test machine) has none that gpu-switch knows, so the container's config is left alone.
        ct_nodes = target == "ct" and self.cfg.host_driver == "nvidia"
        if target == "vm":
            additions = self._vm_additions(receiver.config, gpus)
        else:
            additions = self._ct_predicted(receiver.config, gpus, moving) if ct_nodes else []
        if additions and not self.cfg.proxmox.is_root_pam:
            raise Refused(self._root_pam_error(", ".join(additions)))
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
        cfg, steps = self.cfg, []
        unit = cfg.persistenced_unit
        active = bool(unit) and self.host.is_active(unit)
        want_active = (
            active
            if (recovery or {}).get("persistenced_active") is None
            else bool(unit) and recovery["persistenced_active"]
        )
        self._persistenced_active = want_active
        if moving:
            for driver in sorted({a[1] for a in actions.values() if a[0] in ("bind", "restore") and a[1]}):
                if not self.sysfs.driver_loaded(driver):
                    steps.append(Step("load-driver", f"modprobe {driver}", lambda d=driver: self.host.modprobe(d)))
            if giver.status == "running":
                timeout = shutdown_timeout or cfg.timeouts.shutdown
                steps.append(
                    Step(
                        "stop-guest",
                        f"shut down {giver.label} (timeout {timeout:g} s{', then stop' if force else ''})",
                        lambda: self._shutdown(giver, timeout, force),
                        lambda: self._restart(giver),
                    )
                )
            if active:
                steps.append(
                    Step("stop-service", f"stop {unit}", lambda: self._stop_unit(unit), lambda: self.host.start(unit))
                )
            # A process with a GPU open through VFIO makes its unbind from vfio-pci block in the kernel
            # until it lets go: refuse instead (checked once the giving VM is down).
            vfio_nodes = tuple(
                f"/dev/vfio/{gpu.iommu_group}"
                for gpu in moving
                if gpu.iommu_group is not None
                and any(
                    f.driver == cfg.passthrough_driver and self._needs(f, actions[f.address]) for f in gpu.functions
                )
            )
            if unbinding_host or vfio_nodes:
                held = ["/dev/nvidia*"] if unbinding_host else []
                steps.append(
                    Step(
                        "check-holders",
                        f"no process may hold {', '.join(held + list(vfio_nodes))}",
                        lambda: self._check_holders(unbinding_host, vfio_nodes),
                    )
                )
            for gpu in moving:
                todo = [f for f in gpu.functions if self._needs(f, actions[f.address])]
                detail = "; ".join(
                    f"{f.address} {f.driver or 'unbound'} -> {self._describe_action(actions[f.address])}" for f in todo
                )
                originals = {f.address: (f.driver, f.override) for f in gpu.functions}
                steps.append(
                    Step(
                        "rebind",
                        detail,
                        lambda g=gpu: self._rebind(g, actions),
                        lambda g=gpu, o=originals: self._restore(g, o),
                        address=gpu.address,
                    )
                )
            if target == "ct" and cfg.host_driver == "nvidia":
                steps.append(
                    Step("device-nodes", "create the GPUs' /dev/nvidia* nodes (nvidia-modprobe)", self._device_nodes)
                )
        if want_active and (moving or not active):
            steps.append(
                Step("start-service", f"start {unit}", lambda: self.host.start(unit), lambda: self._stop_unit(unit))
            )
        return steps

    @staticmethod
    def _describe_action(action: tuple) -> str:
        if action[0] == "release":
            return f"native driver (not {action[1]})"
        return action[1] or "unbound"

    # ---------------------------------------------------------- step bodies

    def _shutdown(self, guest: Guest, timeout: float, force: bool) -> None:
        api, margin = self.api, 30.0
        try:
            api.act(guest.kind, guest.vmid, "shutdown", "stopped", timeout + margin, timeout=int(timeout))
        except TaskFailed as exc:
            if api.status(guest.kind, guest.vmid) == "stopped":
                return
            if not force:
                raise Refused(
                    f"{guest.label} did not shut down within {timeout:g} s ({exc.exitstatus or exc.reason}); "
                    "rerun with --force to stop it hard, or with a longer --timeout"
                ) from None
            params = {"overrule-shutdown": 1} if exc.exitstatus is None else {}
            api.act(guest.kind, guest.vmid, "stop", "stopped", self.cfg.timeouts.task, **params)
        if api.status(guest.kind, guest.vmid) != "stopped":
            raise StepFailed(f"{guest.label} is still not stopped after its shutdown task")

    def _restart(self, guest: Guest) -> None:
        if self.api.status(guest.kind, guest.vmid) != "running":
            self._start(guest)

    def _start(self, guest: Guest) -> None:
        self.api.act(guest.kind, guest.vmid, "start", "running", self.cfg.timeouts.task)
        status = self.api.status(guest.kind, guest.vmid)
        if status != "running":
            raise StepFailed(f"{guest.label} is {status} after its start task ended OK")

    def _stop_started(self, guest: Guest) -> None:
        if self.api.status(guest.kind, guest.vmid) == "running":
            self.api.act(guest.kind, guest.vmid, "stop", "stopped", self.cfg.timeouts.task)

    def _stop_unit(self, unit: str) -> None:
        self.host.stop(unit)
        if self.host.is_active(unit):
            raise StepFailed(f"{unit} is still active after systemctl stop")

    def _check_holders(self, nvidia: bool = True, nodes: tuple[str, ...] = ()) -> None:
        holders = find_holders(
            self.cfg.roots.proc, exclude_pids=(os.getpid(),), nvidia=nvidia, nodes=nodes, dev_root=self.cfg.roots.dev
        )
        if holders:
            self._holders = holders
            raise Refused(_holders_text("the GPUs are still in use", holders))

    def _rebinder(self) -> Rebinder:
        return Rebinder(self.sysfs, self.writer, self.cfg.timeouts.sysfs_write, self._before_write)

    def _rebind(self, gpu: Gpu, actions: dict) -> None:
        rebinder = self._rebinder()
        for fn in gpu.functions:
            action = actions[fn.address]
            if action[0] == "bind":
                rebinder.bind(fn.address, action[1], action[2])
            elif action[0] == "release":
                rebinder.release(fn.address, action[1])
            else:
                rebinder.restore(fn.address, action[1], action[2])

    def _restore(self, gpu: Gpu, originals: dict) -> None:
        rebinder = self._rebinder()
        for fn in reversed(gpu.functions):
            driver, override = originals[fn.address]
            if self.sysfs.driver(fn.address) != driver or self.sysfs.override(fn.address) != override:
                rebinder.restore(fn.address, driver, override)

    def _device_nodes(self) -> None:
        minors = sorted(set(_minors(self.cfg)))
        for minor in minors:
            self.host.nvidia_modprobe("-c", str(minor))
        self.host.nvidia_modprobe("-u", "-c", "0")

    def _ensure_config(self, guest: Guest) -> None:
        config = self.api.config(guest.kind, guest.vmid)
        gpus = discover(self.cfg, self.sysfs)
        if guest.kind == "qemu":
            add = self._vm_additions(config, gpus)
            keys = entries.free_keys(config, entries.HOSTPCI_KEY, "hostpci", entries.MAX_HOSTPCI, len(add))
        else:
            paths, missing = nvidia_device_paths(gpus, self.cfg.roots.proc, self.cfg.roots.dev)
            if missing:
                raise StepFailed(
                    f"device nodes missing on the host: {', '.join(missing)}; the container cannot start without them"
                )
            existing = self._ct_existing_paths(config)
            add = [entries.make_dev(p) for p in paths if p not in existing]
            keys = entries.free_keys(config, entries.DEV_KEY, "dev", entries.MAX_DEV, len(add))
        if not add:
            return
        values = dict(zip(keys, add, strict=True))
        what = ", ".join(f"{k}: {v}" for k, v in values.items())
        if not self.cfg.proxmox.is_root_pam:
            raise StepFailed(self._root_pam_error(what))
        self._journal_update(config_added={"kind": guest.kind, "vmid": guest.vmid, "values": values})
        try:
            self.api.set_config(guest.kind, guest.vmid, values, digest=config.get("digest"))
        except ApiError as exc:
            if exc.status == 403:
                raise StepFailed(f"{exc.reason}; " + self._root_pam_error(what)) from None
            raise

    def _undo_config(self, guest: Guest) -> None:
        added = ((self._journal or {}).get("config_added") or {}).get("values") or {}
        config = self.api.config(guest.kind, guest.vmid)
        stale = sorted(k for k, v in added.items() if str(config.get(k)) == v)
        if stale:
            self.api.set_config(guest.kind, guest.vmid, {}, delete=stale, digest=config.get("digest"))

    # ---------------------------------------------------------------- journal

    def _journal_update(self, **changes) -> None:
        if self._journal is None:
            return
        self._journal.update(changes)
        self.journal.write(self._journal)

    def _before_write(self, address: str, path: str, value: str) -> None:
        """Journal the function about to be rebound, before its first sysfs write (recover reads sysfs again, so
        the later writes of the same function need no entry of their own)."""
        current = (self._journal or {}).get("write") or {}
        if current.get("address") != address:
            self._journal_update(write={"address": address, "path": path, "value": value.strip()})

    # -------------------------------------------------------------- execution

    def _run(self, step: Step, index: int) -> None:
        self._journal_update(
            step=index, step_name=step.name, phase="rebinding" if step.name == "rebind" else self._journal.get("phase")
        )
        step.state = "running"
        try:
            step.do()
        except Exception:
            step.touched = step.name in ("rebind", "guest-config", "start-guest")
            raise
        step.touched = True
        step.state = "done"

    def _groups(self, steps: list[Step]) -> list[list[tuple[int, Step]]]:
        groups: list[list[tuple[int, Step]]] = []
        for index, step in enumerate(steps):
            if self.cfg.parallel and step.name == "rebind" and groups and groups[-1][0][1].name == "rebind":
                groups[-1].append((index, step))
            else:
                groups.append([(index, step)])
        return groups

    def _run_group(self, group: list[tuple[int, Step]], started: list[Step], hung: set[str]) -> BaseException | None:
        """Run one step, or several rebind steps at once (parallel mode); returns the first error."""
        error = None
        if len(group) == 1:
            index, step = group[0]
            started.append(step)
            try:
                self._run(step, index)
            except Exception as exc:  # noqa: BLE001 - any failure rolls back
                step.state = "failed"
                error = exc
        else:
            started.extend(step for _, step in group)
            with ThreadPoolExecutor(max_workers=len(group)) as pool:
                futures = [(step, pool.submit(self._run, step, index)) for index, step in group]
            for step, future in futures:
                exc = future.exception()
                if exc is not None:
                    step.state = "failed"
                    error = error or exc
                    if isinstance(exc, WriteTimeout):
                        hung.add(exc.address or step.address)
        if isinstance(error, WriteTimeout):
            hung.add(error.address or started[-1].address)
        return error

    def execute(self, steps: list[Step]) -> tuple[BaseException | None, set[str], list[str]]:
        """Run the steps; on failure undo every started step in reverse. Returns (error, needs_reboot,
        undo_failures). A BaseException that is not an Exception (a crash) passes through untouched."""
        started: list[Step] = []
        hung: set[str] = set()
        last_rebind = max((i for i, s in enumerate(steps) if s.name == "rebind"), default=None)
        error = None
        for group in self._groups(steps):
            error = self._run_group(group, started, hung)
            if error is not None:
                break
            for _, step in group:
                if self.after_step:
                    self.after_step(step)
            if last_rebind is not None and group[-1][0] == last_rebind:
                self._journal_update(phase="rebound", write=None)
        if error is None:
            return None, set(), []
        for step in started:
            if step.address in hung:
                step.state = "hung"
        self._journal_update(phase="rolling-back", needs_reboot=sorted(hung), error=_reason(error))
        failures = self.rollback(started, hung)
        return error, hung, failures

    def rollback(self, started: list[Step], hung: set[str]) -> list[str]:
        failures = []
        for step in reversed(started):
            if step.undo is None or step.state in ("planned", "hung"):
                continue
            if hung and step.name != "rebind":
                # A GPU is stuck in the kernel: do not start anything that would open it.
                step.note = "left as is: a GPU needs a host reboot"
                continue
            try:
                step.undo()
                step.state = "undone"
            except WriteTimeout as exc:
                hung.add(exc.address or step.address or "?")
                step.state = "undo-failed"
                step.note = _reason(exc)
                failures.append(f"undo {step.name}: {_reason(exc)}")
            except Exception as exc:  # noqa: BLE001
                step.state = "undo-failed"
                step.note = _reason(exc)
                failures.append(f"undo {step.name} ({step.detail}): {_reason(exc)}")
        return failures

    # ---------------------------------------------------------------- commands

    def status(self) -> Outcome:
        state = self.read_state()
        result = self.describe(state)
        result.update(changed=False, steps=[])
        journal = self.journal.load()
        if journal:
            result["journal"] = _journal_summary(journal, boot_id(self.cfg.roots.proc))
            needs = journal.get("needs_reboot") or []
            if needs and journal.get("boot_id") == boot_id(self.cfg.roots.proc):
                result["needs_reboot"] = needs
        if self.lock.busy():
            result["busy"] = True
        errors = [g.error for g in state.guests.values() if g.error]
        if errors:
            result["error"] = errors[0]
            return Outcome(result, EXIT_ROLLED_BACK, errors[0])
        return Outcome(result)

    def move(
        self, target: str, *, dry_run: bool = False, force: bool = False, shutdown_timeout: float | None = None
    ) -> Outcome:
        if target not in SIDES:
            raise ConfigError(f"unknown target {target!r} (vm or ct)")
        command = f"to-{target}"
        if dry_run:
            return self._dry_run(command, target, force, shutdown_timeout, None)
        self.lock.acquire()
        try:
            journal = self.journal.load()
            if journal:
                current = boot_id(self.cfg.roots.proc)
                raise Refused(
                    f"an interrupted move ({_journal_summary(journal, current)['text']}) left its journal "
                    f"{self.journal.path}: run gpu-switch recover first"
                )
            return self._move(command, target, force, shutdown_timeout, None)
        finally:
            self.lock.release()

    def _dry_run(self, command, target, force, shutdown_timeout, recovery) -> Outcome:
        state = self.read_state()
        steps = self.plan(state, target, force=force, shutdown_timeout=shutdown_timeout, recovery=recovery)
        result = self.describe(state)
        result.update(
            command=command, changed=False, dry_run=True, would_change=bool(steps), steps=[s.as_dict() for s in steps]
        )
        result["before"] = drivers_view(result)
        return Outcome(result)

    def _move(
        self, command: str, target: str, force: bool, shutdown_timeout: float | None, recovery: dict | None
    ) -> Outcome:
        state = self.read_state()
        steps = self.plan(state, target, force=force, shutdown_timeout=shutdown_timeout, recovery=recovery)
        if not steps:
            if recovery:
                self.journal.clear()
            result = self.describe(state)
            result.update(command=command, changed=False, steps=[])
            return Outcome(result)
        origin = (recovery or {}).get("origin") or state.owner
        self._journal = {
            "version": 1,
            "command": command,
            "boot_id": boot_id(self.cfg.roots.proc),
            "pid": os.getpid(),
            "started": self.clock(),
            "origin": origin,
            "target": target,
            "phase": "started",
            "functions": {
                f.address: {"driver": f.driver, "override": f.override} for g in state.gpus for f in g.functions
            },
            "persistenced_active": getattr(self, "_persistenced_active", None),
            "steps": [s.as_dict() for s in steps],
            "needs_reboot": [],
        }
        if recovery:
            self._journal.update(
                decision=recovery["decision"],
                functions=recovery.get("functions") or self._journal["functions"],
                config_added=recovery.get("config_added"),
            )
        self.journal.write(self._journal)
        before = drivers_view(self.describe(state))
        error, hung, failures = self.execute(steps)
        after = self.describe(self.read_state())
        after["before"] = before
        after.update(command=command, changed=any(s.touched for s in steps), steps=[s.as_dict() for s in steps])
        if error is None:
            self.journal.clear()
            self._journal = None
            return Outcome(after)
        reason = _reason(error)
        if isinstance(error, Refused) and getattr(self, "_holders", None):
            after["holders"] = [h.as_dict() for h in self._holders]
        if hung or failures:
            after.update(error=reason, rolled_back=False, needs_reboot=sorted(hung))
            self._journal_update(phase="rolling-back", needs_reboot=sorted(hung), undo_failures=failures)
            where = _where(after)
            if hung:
                todo = (
                    f"GPU {', '.join(sorted(hung))} needs a host reboot (a sysfs write hung in the kernel); "
                    "guests and services were left stopped; reboot the host, gpu-switch recover runs at boot"
                )
            else:
                todo = "fix the cause, then run gpu-switch recover"
            after["what_to_do"] = todo
            return Outcome(
                after,
                EXIT_STRANDED,
                f"{command} failed: {reason}; NOT fully rolled back "
                f"({'; '.join(failures) or 'hung write'}); now {where}; {todo}",
            )
        self.journal.clear()
        self._journal = None
        after.update(error=reason, rolled_back=True)
        return Outcome(after, EXIT_ROLLED_BACK, f"{command} failed and was rolled back: {reason}; now {_where(after)}")

    def recover(self, *, dry_run: bool = False, force: bool = False, shutdown_timeout: float | None = None) -> Outcome:
        if not dry_run:
            self.lock.acquire()
        try:
            journal = self.journal.load()
            current = boot_id(self.cfg.roots.proc)
            if journal is None:
                outcome = self.status()
                outcome.result.update(command="recover", changed=False, steps=[])
                if outcome.result["owner"] == "split":
                    reason = (
                        "the GPUs are split between drivers and there is no journal to recover from: "
                        "choose with gpu-switch to-vm or to-ct"
                    )
                    outcome.result.update(error=reason, rolled_back=False)
                    return Outcome(outcome.result, EXIT_STRANDED, reason)
                return outcome
            same_boot = journal.get("boot_id") == current
            if same_boot and journal.get("needs_reboot"):
                result = self.describe(self.read_state())
                reason = (
                    f"GPU {', '.join(journal['needs_reboot'])} needs a host reboot (a sysfs write hung in "
                    "the kernel); reboot the host, then gpu-switch recover runs at boot"
                )
                result.update(
                    command="recover",
                    changed=False,
                    steps=[],
                    error=reason,
                    rolled_back=False,
                    needs_reboot=journal["needs_reboot"],
                    journal=_journal_summary(journal, current),
                )
                return Outcome(result, EXIT_STRANDED, reason)
            decision, desired = _decide(journal)
            recovery = {
                "decision": decision,
                "origin": journal.get("origin"),
                "config_added": journal.get("config_added") if decision == "finish" else None,
                "persistenced_active": journal.get("persistenced_active"),
                "functions": journal.get("functions"),
            }
            if decision == "undo" and same_boot and journal.get("functions"):
                recovery["restore"] = journal["functions"]
            if dry_run:
                outcome = self._dry_run("recover", desired, force, shutdown_timeout, recovery)
            else:
                self._journal = journal
                if decision == "undo" and journal.get("config_added"):
                    self._undo_interrupted_config(journal["config_added"])
                outcome = self._move("recover", desired, force, shutdown_timeout, recovery)
            outcome.result["recovery"] = {
                "decision": decision,
                "target": desired,
                "same_boot": same_boot,
                "journal": _journal_summary(journal, current),
            }
            return outcome
        finally:
            if not dry_run:
                self.lock.release()

    def ensure_hookscripts(self, volume: str, *, check_mode: bool = False) -> dict:
        """Attach the hookscript (``storage:snippets/name``) to both guests and allow snippets on that storage.
        Returns {'changed': bool, 'changes': [...]}; only root@pam may set a hookscript."""
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*:snippets/[A-Za-z0-9._+-]+", volume):
            raise ConfigError(
                f"hookscript {volume!r} is not a snippet volume such as local:snippets/gpu-switch-hook.py"
            )
        storage = volume.split(":", 1)[0]
        changes = []
        store = self.api.storage(storage)
        content = [c for c in str(store.get("content", "")).split(",") if c and c != "none"]
        if "snippets" not in content:
            changes.append(
                f"storage {storage}: content {','.join(content) or 'none'} -> {','.join([*content, 'snippets'])}"
            )
            if not check_mode:
                self.api.set_storage_content(storage, ",".join([*content, "snippets"]), store.get("digest"))
        for guest in self.guests().values():
            config = self.api.config(guest.kind, guest.vmid)
            if config.get("hookscript") == volume:
                continue
            changes.append(f"{guest.label}: hookscript {config.get('hookscript') or '(none)'} -> {volume}")
            if check_mode:
                continue
            if not self.cfg.proxmox.is_root_pam:
                raise Refused(f"only root@pam may set a hookscript; {self.cfg.proxmox.identity} may not")
            self.api.set_config(guest.kind, guest.vmid, {"hookscript": volume}, digest=config.get("digest"))
        return {"changed": bool(changes), "changes": changes}

    def _undo_interrupted_config(self, added: dict) -> None:
        """Remove the entries an interrupted move added to the guest that will not get the GPUs."""
        values = added.get("values") or {}
        config = self.api.config(added["kind"], added["vmid"])
        stale = sorted(k for k, v in values.items() if str(config.get(k)) == v)
        if stale:
            self.api.set_config(added["kind"], added["vmid"], {}, delete=stale, digest=config.get("digest"))
        self._journal_update(config_added=None)


def _minors(cfg: Config) -> list[int]:
    minors = nvidia_minors(cfg.roots.proc)
    gpus = set(cfg.gpus) if cfg.gpus else None
    return [m for bdf, m in minors.items() if gpus is None or bdf in gpus]


def _decide(journal: dict) -> tuple[str, str]:
    """finish (go on to the target) or undo (back to the origin) for an interrupted move."""
    target, origin = journal.get("target"), journal.get("origin")
    if journal.get("decision"):
        return journal["decision"], target
    if journal.get("phase") == "rebound" or origin not in SIDES:
        return "finish", target
    return "undo", origin


def _holders_text(what: str, holders: list[Holder]) -> str:
    return f"{what}: " + "; ".join(map(str, holders[:8])) + ("; ..." if len(holders) > 8 else "")


def drivers_view(result: dict) -> dict:
    """Owner and the driver of every function: the 'before' of a result (and the diff of the Ansible module)."""
    return {
        "owner": result.get("owner"),
        "drivers": {f["address"]: f["driver"] for g in result.get("gpus", []) for f in g["functions"]},
    }


def _reason(exc: BaseException) -> str:
    if isinstance(exc, GpuSwitchError):
        return exc.reason
    return f"internal error: {type(exc).__name__}: {exc}"


def _where(result: dict) -> str:
    drivers = sorted({f["driver"] or "unbound" for g in result.get("gpus", []) for f in g["functions"]})
    parts = [f"owner {result.get('owner')}", f"drivers {'/'.join(drivers)}"]
    for role in ("container", "vm"):
        if role in result:
            parts.append(f"{'CT' if role == 'container' else 'VM'} {result[role]['vmid']} {result[role]['status']}")
    return ", ".join(parts)


def _journal_summary(journal: dict, current_boot: str) -> dict:
    same = journal.get("boot_id") == current_boot
    text = (
        f"{journal.get('command')} from {journal.get('origin')} to {journal.get('target')}, phase "
        f"{journal.get('phase')}, {'this boot' if same else 'a previous boot'}"
    )
    return {
        "command": journal.get("command"),
        "origin": journal.get("origin"),
        "target": journal.get("target"),
        "phase": journal.get("phase"),
        "same_boot": same,
        "needs_reboot": journal.get("needs_reboot") or [],
        "text": text,
    }
