"""The move's facade: ``status``, ``move`` and ``recover`` (and the hookscripts the Ansible module attaches),
composed of one object a phase, all sharing one Context:

- planning (``plan.py``): read the state, describe it, the plan and its checks;
- execution and rollback (``execute.py``): the journal, the steps run in order, the undo on failure;
- the guests (``guests.py``): their power, their GPU entries, the hookscript;
- recovery (``recovery.py``): finish or undo an interrupted move from its journal.

The constructor takes the configuration and the seams that ``context.py`` describes (``api``, ``writer``,
``host``, ``secret``, ``after_step``, ``clock``); the phases share them through one Context.
"""

from __future__ import annotations

from .config import Config
from .context import Context
from .errors import EXIT_ROLLED_BACK, ConfigError, Refused
from .execute import Executor, HostSteps
from .guests import GuestControl
from .holders import Holder
from .journal import boot_id
from .outcome import Outcome, drivers_view
from .plan import SIDES, Planner, State
from .recovery import Recovery, journal_summary

__all__ = ["Outcome", "Switcher", "drivers_view"]


class Switcher:
    def __init__(self, config: Config, **seams):
        self.cfg = config
        self.ctx = Context(config, **seams)
        self.guests = GuestControl(self.ctx)
        self.planner = Planner(self.ctx, self.guests, HostSteps(self.ctx))
        self.executor = Executor(self.ctx, self.planner)
        self.recovery = Recovery(self.ctx, self.planner, self.guests, self.executor, self.status)

    @property
    def holders(self) -> list[Holder]:
        """The processes the last check found holding the GPUs (for the result of a refusal)."""
        return self.ctx.holders

    def read_state(self) -> State:
        return self.planner.read_state()

    def describe(self, state: State) -> dict:
        return self.planner.describe(state)

    def status(self) -> Outcome:
        ctx = self.ctx
        state = self.planner.read_state()
        result = self.planner.describe(state)
        result.update(changed=False, steps=[])
        journal = ctx.journal.load()
        if journal:
            result["journal"] = journal_summary(journal, boot_id(ctx.cfg.roots.proc))
            needs = journal.get("needs_reboot") or []
            if needs and journal.get("boot_id") == boot_id(ctx.cfg.roots.proc):
                result["needs_reboot"] = needs
        if ctx.lock.busy():
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
            return self.planner.dry_run(command, target, force, shutdown_timeout, None)
        ctx = self.ctx
        ctx.lock.acquire()
        try:
            journal = ctx.journal.load()
            if journal:
                current = boot_id(ctx.cfg.roots.proc)
                raise Refused(
                    f"an interrupted move ({journal_summary(journal, current)['text']}) left its journal "
                    f"{ctx.journal.path}: run gpu-switch recover first"
                )
            return self.executor.move(command, target, force, shutdown_timeout, None)
        finally:
            ctx.lock.release()

    def recover(self, *, dry_run: bool = False, force: bool = False, shutdown_timeout: float | None = None) -> Outcome:
        return self.recovery.recover(dry_run=dry_run, force=force, shutdown_timeout=shutdown_timeout)

    def ensure_hookscripts(self, volume: str, *, check_mode: bool = False) -> dict:
        """Attach the hookscript (``storage:snippets/name``) to both guests and allow snippets on that storage."""
        return self.guests.ensure_hookscripts(volume, check_mode=check_mode)
