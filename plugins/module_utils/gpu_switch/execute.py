# SPDX-License-Identifier: Apache-2.0
"""Running a move: the journal written before the first change, each step run with the journal naming it first
(and each function named before its first sysfs write), rebind steps at once in parallel mode, every started
step undone in reverse on failure, and the result with its reason and what to do.

Also the bodies of the host-side steps: stopping the persistence daemon, the holder check, rebinding and
restoring a GPU's functions, creating the device nodes. A GPU whose sysfs write hung needs a host reboot: the
rollback then leaves everything but the rebinds as it is, and the move ends stranded (exit 3).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from .config import Config
from .context import Context
from .errors import EXIT_ROLLED_BACK, EXIT_STRANDED, Refused, StepFailed, WriteTimeout
from .holders import find_holders
from .journal import boot_id
from .outcome import Outcome, drivers_view, reason_of, where_now
from .pci import Gpu, nvidia_minors
from .plan import Planner, Step, holders_text
from .rebind import Rebinder


class HostSteps:
    """The bodies of the host-side steps that the plan names."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def stop_unit(self, unit: str) -> None:
        self.ctx.host.stop(unit)
        if self.ctx.host.is_active(unit):
            raise StepFailed(f"{unit} is still active after systemctl stop")

    def check_holders(self, nvidia: bool = True, nodes: tuple[str, ...] = ()) -> None:
        cfg = self.ctx.cfg
        holders = find_holders(
            cfg.roots.proc, exclude_pids=(os.getpid(),), nvidia=nvidia, nodes=nodes, dev_root=cfg.roots.dev
        )
        if holders:
            self.ctx.holders = holders
            raise Refused(holders_text("the GPUs are still in use", holders))

    def _rebinder(self) -> Rebinder:
        return Rebinder(self.ctx.sysfs, self.ctx.writer, self.ctx.cfg.timeouts.sysfs_write, self._before_write)

    def _before_write(self, address: str, path: str, value: str) -> None:
        """Journal the function about to be rebound, before its first sysfs write (recover reads sysfs again, so
        the later writes of the same function need no entry of their own)."""
        current = (self.ctx.record or {}).get("write") or {}
        if current.get("address") != address:
            self.ctx.journal_update(write={"address": address, "path": path, "value": value.strip()})

    def rebind(self, gpu: Gpu, actions: dict) -> None:
        rebinder = self._rebinder()
        for fn in gpu.functions:
            action = actions[fn.address]
            if action[0] == "bind":
                rebinder.bind(fn.address, action[1], action[2])
            elif action[0] == "release":
                rebinder.release(fn.address, action[1])
            else:
                rebinder.restore(fn.address, action[1], action[2])

    def restore(self, gpu: Gpu, originals: dict) -> None:
        rebinder, sysfs = self._rebinder(), self.ctx.sysfs
        for fn in reversed(gpu.functions):
            driver, override = originals[fn.address]
            if sysfs.driver(fn.address) != driver or sysfs.override(fn.address) != override:
                rebinder.restore(fn.address, driver, override)

    def device_nodes(self) -> None:
        minors = sorted(set(_minors(self.ctx.cfg)))
        for minor in minors:
            self.ctx.host.nvidia_modprobe("-c", str(minor))
        self.ctx.host.nvidia_modprobe("-u", "-c", "0")


class Executor:
    """Runs a plan under the journal and rolls it back on failure."""

    def __init__(self, ctx: Context, planner: Planner):
        self.ctx = ctx
        self.planner = planner

    def move(
        self, command: str, target: str, force: bool, shutdown_timeout: float | None, recovery: dict | None
    ) -> Outcome:
        """Plan from the state now and run the plan under a journal; the caller holds the lock."""
        ctx, planner = self.ctx, self.planner
        state = planner.read_state()
        steps = planner.plan(state, target, force=force, shutdown_timeout=shutdown_timeout, recovery=recovery)
        if not steps:
            if recovery:
                ctx.journal.clear()
            result = planner.describe(state)
            result.update(command=command, changed=False, steps=[])
            return Outcome(result)
        origin = (recovery or {}).get("origin") or state.owner
        ctx.record = {
            "version": 1,
            "command": command,
            "boot_id": boot_id(ctx.cfg.roots.proc),
            "pid": os.getpid(),
            "started": ctx.clock(),
            "origin": origin,
            "target": target,
            "phase": "started",
            "functions": {
                f.address: {"driver": f.driver, "override": f.override} for g in state.gpus for f in g.functions
            },
            "persistenced_active": ctx.persistenced_active,
            "steps": [s.as_dict() for s in steps],
            "needs_reboot": [],
        }
        if recovery:
            ctx.record.update(
                decision=recovery["decision"],
                functions=recovery.get("functions") or ctx.record["functions"],
                config_added=recovery.get("config_added"),
            )
        ctx.journal.write(ctx.record)
        before = drivers_view(planner.describe(state))
        error, hung, failures = self.execute(steps)
        after = planner.describe(planner.read_state())
        after["before"] = before
        after.update(command=command, changed=any(s.touched for s in steps), steps=[s.as_dict() for s in steps])
        if error is None:
            ctx.journal.clear()
            ctx.record = None
            return Outcome(after)
        reason = reason_of(error)
        if isinstance(error, Refused) and ctx.holders:
            after["holders"] = [h.as_dict() for h in ctx.holders]
        if hung or failures:
            after.update(error=reason, rolled_back=False, needs_reboot=sorted(hung))
            ctx.journal_update(phase="rolling-back", needs_reboot=sorted(hung), undo_failures=failures)
            where = where_now(after)
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
        ctx.journal.clear()
        ctx.record = None
        after.update(error=reason, rolled_back=True)
        return Outcome(
            after, EXIT_ROLLED_BACK, f"{command} failed and was rolled back: {reason}; now {where_now(after)}"
        )

    # -------------------------------------------------------------- execution

    def _run(self, step: Step, index: int) -> None:
        self.ctx.journal_update(
            step=index,
            step_name=step.name,
            phase="rebinding" if step.name == "rebind" else self.ctx.record.get("phase"),
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
            if self.ctx.cfg.parallel and step.name == "rebind" and groups and groups[-1][0][1].name == "rebind":
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
                if self.ctx.after_step:
                    self.ctx.after_step(step)
            if last_rebind is not None and group[-1][0] == last_rebind:
                self.ctx.journal_update(phase="rebound", write=None)
        if error is None:
            return None, set(), []
        for step in started:
            if step.address in hung:
                step.state = "hung"
        self.ctx.journal_update(phase="rolling-back", needs_reboot=sorted(hung), error=reason_of(error))
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
                step.note = reason_of(exc)
                failures.append(f"undo {step.name}: {reason_of(exc)}")
            except Exception as exc:  # noqa: BLE001
                step.state = "undo-failed"
                step.note = reason_of(exc)
                failures.append(f"undo {step.name} ({step.detail}): {reason_of(exc)}")
        return failures


def _minors(cfg: Config) -> list[int]:
    minors = nvidia_minors(cfg.roots.proc)
    gpus = set(cfg.gpus) if cfg.gpus else None
    return [m for address, m in minors.items() if gpus is None or address in gpus]
