# SPDX-License-Identifier: Apache-2.0
"""Recovering an interrupted move from its journal: finish it when every rebind was done (phase ``rebound``),
else undo it back to its origin, on the same boot exactly as each function was (driver and override), after a
reboot from what sysfs shows; a GPU that needs a reboot on this boot stops it. A recover that is itself
interrupted keeps its decision. Also the journal's summary that status and a refused move show.
"""

from __future__ import annotations

from collections.abc import Callable

from .context import Context
from .errors import EXIT_STRANDED
from .execute import Executor
from .guests import GuestControl
from .journal import boot_id
from .outcome import Outcome
from .plan import SIDES, Planner


class Recovery:
    """Finishes or undoes the move that the journal says was interrupted."""

    def __init__(
        self,
        ctx: Context,
        planner: Planner,
        guests: GuestControl,
        executor: Executor,
        status: Callable[[], Outcome],
    ):
        self.ctx = ctx
        self.planner = planner
        self.guests = guests
        self.executor = executor
        self.status = status  # the facade's status: what recover reports when there is no journal

    def recover(self, *, dry_run: bool = False, force: bool = False, shutdown_timeout: float | None = None) -> Outcome:
        ctx = self.ctx
        if not dry_run:
            ctx.lock.acquire()
        try:
            journal = ctx.journal.load()
            current = boot_id(ctx.cfg.roots.proc)
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
                result = self.planner.describe(self.planner.read_state())
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
                    journal=journal_summary(journal, current),
                )
                return Outcome(result, EXIT_STRANDED, reason)
            decision, desired = decide(journal)
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
                outcome = self.planner.dry_run("recover", desired, force, shutdown_timeout, recovery)
            else:
                ctx.record = journal
                if decision == "undo" and journal.get("config_added"):
                    self.guests.undo_interrupted_config(journal["config_added"])
                outcome = self.executor.move("recover", desired, force, shutdown_timeout, recovery)
            outcome.result["recovery"] = {
                "decision": decision,
                "target": desired,
                "same_boot": same_boot,
                "journal": journal_summary(journal, current),
            }
            return outcome
        finally:
            if not dry_run:
                ctx.lock.release()


def decide(journal: dict) -> tuple[str, str]:
    """finish (go on to the target) or undo (back to the origin) for an interrupted move."""
    target, origin = journal.get("target"), journal.get("origin")
    if journal.get("decision"):
        return journal["decision"], target
    if journal.get("phase") == "rebound" or origin not in SIDES:
        return "finish", target
    return "undo", origin


def journal_summary(journal: dict, current_boot: str) -> dict:
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
