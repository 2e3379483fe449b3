# SPDX-License-Identifier: Apache-2.0
"""Wait until an inference service is ready, printing progress instead of a silent half hour.

Runs the ``inference_service_probe`` module on the target every ``interval`` seconds and prints one line
per probe on the controller: elapsed time, the unit's state, what /health answers, and the unit's last
log line (the engine's own loading progress). Ready when /health answers 200 and /v1/models lists the
model. Fails at once when the unit has failed (after its restarts are used up), and after ``timeout``.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


def fmt(seconds):
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(("url", "model", "unit", "secret_file", "timeout", "interval", "grace"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        for required in ("url", "model", "unit"):
            if not args.get(required):
                raise AnsibleActionFail(f"inference_service_wait needs {required}")
        timeout = int(args.get("timeout", 2700))
        interval = max(1, int(args.get("interval", 10)))
        grace = int(args.get("grace", 30))
        probe_args = {k: args[k] for k in ("url", "model", "unit", "secret_file") if args.get(k)}
        host = task_vars.get("inventory_hostname", "?")
        start = time.monotonic()
        restarts = None
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
            # "?": no systemd answered for the unit (a service run by hand): the model served is the answer.
            if probe.get("ready") and active in ("active", "?"):
                result.update(changed=False, msg=f"{args['model']} is served after {fmt(elapsed)}")
                return result
            if self._task.check_mode:
                result.update(changed=False, msg="check mode: probed once, not waiting")
                return result
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
