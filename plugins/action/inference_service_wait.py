# SPDX-License-Identifier: Apache-2.0
"""Wait until an inference service is ready, printing progress instead of a silent half hour.

Runs the ``inference_service_probe`` module on the target every ``interval`` seconds and prints one line
per probe on the controller: elapsed time, the unit's state, what /health answers, and the unit's last
log line (the engine's own loading progress). Ready when /health answers 200 and /v1/models lists the
model. Fails at once when the unit has failed (after its restarts are used up), and after ``timeout``.

With ``group`` (a service across several nodes), every node of the group runs this task at the same time, and
the waits work together through a file on the controller (``module_utils/inference/group.py``): the head's wait
is ready only when every rank's unit is active and a one-token completion through the head comes back, and
restarts the whole group in order when a rank's unit fails or a completion fails while /health says ok; the
other nodes' waits carry out its stops and starts on their own units and end with its result.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The group's logic is shared with the tests; it runs here, on the controller (standard library only).
_MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _MODULE_UTILS not in sys.path:
    sys.path.insert(0, _MODULE_UTILS)
from inference import group  # noqa: E402

display = Display()


def fmt(seconds):
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


# The unit states with processes that a stop would signal.
RUNNING = frozenset(("active", "activating", "deactivating", "reloading"))


class Local:
    """One node's own unit, through the modules the action runs on that node (the ``local`` of group.py)."""

    def __init__(self, action, task_vars, unit, probe_args=None):
        self.action, self.task_vars, self.unit, self.probe_args = action, task_vars, unit, probe_args
        self.last = {}

    def _run(self, module, module_args):
        return self.action._execute_module(module_name=module, module_args=module_args, task_vars=self.task_vars)

    def _systemd(self, **extra):
        result = self._run("ansible.builtin.systemd_service", {"name": self.unit, **extra})
        if result.get("failed"):
            raise group.GroupError(f"systemctl on {self.unit}: {result.get('msg')}")
        return result

    def state(self):
        if self.probe_args is None:  # a rank above 0 serves no API: its unit's state is all there is to see
            status = self._systemd().get("status") or {}
            return {k: status.get(k, "?") for k in ("ActiveState", "SubState", "Result", "NRestarts")}
        self.last = self._run("inference_service_probe", {**self.probe_args, "complete": True})
        if self.last.get("failed"):
            raise group.GroupError(f"probing {self.unit} failed: {self.last.get('msg')}")
        return self.last.get("unit_state") or {}

    def probe(self):
        return self.last

    def complete(self):
        return self.last.get("completion") or {"ok": False, "problem": "no completion was asked"}

    def stop(self):
        # Only a broken group is stopped here (group.GroupWait.restart). A rank whose peer died may wait in a
        # collective that never completes (torch gives up on an NCCL collective only after its process group's
        # timeout, 10 minutes by default), and a graceful stop would wait for it up to TimeoutStopSec: nothing of a
        # broken group is worth the wait. Its processes are killed, then the unit is stopped, its ExecStopPost still
        # waiting until the GPUs are free.
        if (self._systemd().get("status") or {}).get("ActiveState") in RUNNING:
            self._command("kill", "--signal=SIGKILL")
        self._systemd(state="stopped")

    def start(self):
        # A group's start is asked for, not a crash loop's: a start limit that the failed ranks ran into
        # ("Start request repeated too quickly") is cleared first, and the unit's last failure with it.
        self._command("reset-failed")
        self._systemd(state="started", no_block=True)

    def _command(self, *argv):
        result = self._run("ansible.builtin.command", {"argv": ["systemctl", *argv, self.unit]})
        if result.get("failed"):
            raise group.GroupError(f"systemctl {' '.join(argv)} {self.unit}: {result.get('msg')}")


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(
        (
            "url",
            "model",
            "unit",
            "secret_file",
            "timeout",
            "interval",
            "grace",
            "group",
            "max_restarts",
            "confirm",
            "join_timeout",
            "board_dir",
            "complete",
        )
    )

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        for required in ("url", "model", "unit"):
            if not args.get(required) and not (required == "url" and (args.get("group") or {}).get("rank")):
                raise AnsibleActionFail(f"inference_service_wait needs {required}")
        if args.get("group") and not self._task.check_mode:
            return self.run_group(result, args, task_vars or {})
        return self.run_single(result, args, task_vars or {})

    def run_single(self, result, args, task_vars):
        """The wait of a service on one node."""
        timeout = int(args.get("timeout", 2700))
        interval = max(1, int(args.get("interval", 10)))
        grace = int(args.get("grace", 30))
        probe_args = {k: args[k] for k in ("url", "model", "unit", "secret_file") if args.get(k)}
        # A dead engine answers /health for a while: served means a one-token completion came back too, unless the
        # caller asks the completion itself (validate.yml, with its own bound).
        probe_args["complete"] = bool(args.get("complete", True))
        confirm = max(1, int(args.get("confirm", 2)))
        host = task_vars.get("inventory_hostname", "?")
        start = time.monotonic()
        restarts = first_restarts = None
        failed_completions, previous_log = 0, ""
        while True:
            probe = self._execute_module(
                module_name="inference_service_probe", module_args=probe_args, task_vars=task_vars
            )
            if probe.get("failed"):
                raise AnsibleActionFail(f"probing {args['unit']} failed: {probe.get('msg')}")
            elapsed = time.monotonic() - start
            state = probe.get("unit_state") or {}
            active, sub = state.get("ActiveState", "?"), state.get("SubState", "?")
            restarts = state.get("NRestarts", restarts)
            if first_restarts is None and restarts not in (None, "?"):
                first_restarts = restarts
            line = (
                f"{host} {args['unit']}: {fmt(elapsed)} {active} ({sub}), health {probe.get('health')}, "
                f"last log: {probe.get('last_log') or '-'}"
            )
            display.display(line)
            result.update(
                elapsed_s=round(elapsed, 1),
                unit_state=state,
                last_log=probe.get("last_log", ""),
                models=probe.get("models", []),
                health=probe.get("health"),
                ready=bool(probe.get("ready")),
            )
            completion = probe.get("completion") or {}
            generates = completion.get("ok") or not probe_args["complete"]
            # "?": no systemd answered for the unit (a service run by hand): the model served is the answer.
            if probe.get("ready") and active in ("active", "?") and generates:
                result.update(changed=False, msg=f"{args['model']} is served after {fmt(elapsed)}")
                return result
            if self._task.check_mode:
                result.update(changed=False, msg="check mode: probed once, not waiting")
                return result
            failure = self.first_failure(args, state, first_restarts, previous_log, elapsed)
            if failure:
                result.update(failed=True, msg=failure)
                return result
            failed_completions = failed_completions + 1 if probe.get("ready") and completion else 0
            if failed_completions >= confirm:
                result.update(
                    failed=True,
                    msg=f"{args['unit']} answers /health and lists {args['model']}, but {failed_completions} "
                    f"completions in a row failed: {completion.get('problem') or '?'} (journalctl -u {args['unit']})",
                )
                return result
            previous_log = probe.get("last_log") or previous_log
            if active == "failed" or (active == "inactive" and elapsed > grace):
                result.update(
                    failed=True,
                    msg=f"{args['unit']} is {active} ({state.get('Result', '?')}, {restarts} restarts) after "
                    f"{fmt(elapsed)}; last log: {probe.get('last_log') or '-'} (journalctl -u {args['unit']})",
                )
                return result
            if elapsed >= timeout:
                result.update(
                    failed=True,
                    msg=f"{args['model']} not served after {fmt(timeout)}: {active} ({sub}), "
                    f"health {probe.get('health')}, last log: {probe.get('last_log') or '-'}",
                )
                return result
            time.sleep(min(interval, max(0.0, timeout - elapsed)))

    @staticmethod
    def first_failure(args, state, first_restarts, previous_log, elapsed):
        """The engine's first failure when systemd restarted the unit on its own since the wait began (its next load
        would only hide it), else None."""
        now = state.get("NRestarts")
        try:
            restarted = first_restarts is not None and int(now) > int(first_restarts)
        except (TypeError, ValueError):
            restarted = False
        if not restarted:
            return None
        return (
            f"{args['unit']} failed and systemd restarted it on its own after {fmt(elapsed)} of waiting (NRestarts "
            f"{first_restarts} -> {now}); its last log line before: {previous_log or '-'} "
            f"(journalctl -u {args['unit']})"
        )

    def run_group(self, result, args, task_vars):
        """The wait of one node of a group (see the module's docstring)."""
        spec = args["group"]
        nodes = [str(n) for n in spec.get("nodes") or []]
        rank = int(spec.get("rank", 0))
        if len(nodes) < 2 or not 0 <= rank < len(nodes):
            raise AnsibleActionFail(
                f"inference_service_wait: group needs nodes (2 or more) and this node's rank: {spec}"
            )
        host = task_vars.get("inventory_hostname", nodes[rank])
        interval = max(1, int(args.get("interval", 10)))
        join_timeout = int(args.get("join_timeout", 300))
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{spec.get('service', args['unit'])}-{self._task._uuid}")
        board = group.Board(
            os.path.join(args.get("board_dir") or tempfile.gettempdir(), f"inferhost-group-{name}.json")
        )

        def log(line):
            display.display(f"{host} {args['unit']} (rank {rank} of {len(nodes)}): {line}")

        if rank > 0:
            agent = group.RankAgent(board, host, Local(self, task_vars, args["unit"]), join_timeout=join_timeout)
            try:
                end = agent.run(sleep=lambda _s: time.sleep(min(interval, 2)))
            except group.GroupError as exc:
                return {**result, "failed": True, "changed": False, "ready": False, "msg": str(exc)}
            return {**result, **end, "changed": False}
        probe_args = {k: args[k] for k in ("url", "model", "unit", "secret_file") if args.get(k)}
        ops = group.HeadOps(
            board,
            host,
            Local(self, task_vars, args["unit"], probe_args),
            command_timeout=int(args.get("timeout", 2700)),
        )
        wait = group.GroupWait(
            nodes,
            ops,
            timeout=int(args.get("timeout", 2700)),
            grace=int(args.get("grace", 30)),
            interval=interval,
            confirm=int(args.get("confirm", 2)),
            max_restarts=int(args.get("max_restarts", 2)),
            join_timeout=join_timeout,
        )
        try:
            end = wait.run(log=log)
        except group.GroupError as exc:
            end = {"ready": False, "failed": True, "msg": str(exc), "restarts": wait.restarts}
        ops.finish(end)
        return {**result, **end, "changed": False}
