# SPDX-License-Identifier: Apache-2.0
"""Follow a source build to its end, printing progress instead of hours of silence.

Runs the ``source_build_wait`` module on the target again and again; each call waits up to ``interval``
seconds for the build to end and returns its status, elapsed time and log tail. Between calls this
prints, on the controller, one line with the elapsed time and the log lines that are new since the
previous poll. The build itself runs detached (started with async), so a dropped connection only stops
the watching: the next run of the play attaches to the same build.

With ``name_dir`` instead of ``job_dir`` it follows the build of that name that runs now, whatever its
key, and returns at once, printing nothing, when none runs (status ``idle``).
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

# Seconds the build started just before this task may take to take its lock (it runs detached): until
# then its directory shows nothing, which is no end.
START_GRACE_S = 30


def new_lines(previous, current):
    """The lines of ``current`` after the overlap with ``previous`` (both are tails of one growing log)."""
    if not previous:
        return current
    for size in range(min(len(previous), len(current)), 0, -1):
        if previous[-size:] == current[:size]:
            return current[size:]
    return current


class ActionModule(ActionBase):
    _VALID_ARGS = frozenset(("job_dir", "name_dir", "name", "timeout", "interval", "lines"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if bool(args.get("job_dir")) == bool(args.get("name_dir")):
            raise AnsibleActionFail("source_build_wait needs one of job_dir (a key's build) and name_dir (a name's)")
        where = {"job_dir": args["job_dir"]} if args.get("job_dir") else {"name_dir": args["name_dir"]}
        timeout = int(args.get("timeout", 36000))
        interval = max(1, int(args.get("interval", 60)))
        lines = int(args.get("lines", 15))
        name = args.get("name") or next(iter(where.values()))
        host = task_vars.get("inventory_hostname", "?")
        start = time.monotonic()
        shown = []
        while True:
            waited = time.monotonic() - start
            wait = 0 if self._task.check_mode else min(interval, max(0, int(timeout - waited)))
            grace = {"start_grace": max(0, int(START_GRACE_S - waited))} if "job_dir" in where else {}
            report = self._execute_module(
                module_name="source_build_wait",
                module_args={**where, "wait": wait, "lines": lines, **grace},
                task_vars=task_vars,
            )
            if report.get("failed"):
                raise AnsibleActionFail(f"following the build of {name} failed: {report.get('msg')}")
            for key in ("status", "done", "elapsed", "elapsed_human", "rc", "reason", "wheel", "log", "tail", "key"):
                result[key] = report.get(key)
            # Following a build that failed is no failure of this task (Ansible would take the build's rc for
            # one): the role decides from the status, and another key's failed build stops nothing.
            result.update(changed=False, failed=False)
            if report.get("status") == "idle":
                return result
            tail = report.get("tail") or []
            fresh = new_lines(shown, tail)
            shown = tail
            of_key = f" (key {report['key']}, started by another run)" if report.get("key") else ""
            display.display(f"{host} {name}{of_key}: {report.get('status')} for {report.get('elapsed_human') or '?'}")
            for line in fresh:
                display.display(f"    {line}")
            if report.get("done") or self._task.check_mode:
                return result
            if time.monotonic() - start >= timeout:
                result.update(
                    failed=True,
                    msg=f"{name}: still building after {timeout} s of waiting; it goes on in the background "
                    f"(log {report.get('log')}). Run the play again to attach to it.",
                )
                return result
