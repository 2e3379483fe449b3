"""The watchdog of a guest's inference service: judged by generation between plays, restarted when it stops.

A service whose engine hangs keeps answering ``/health`` and ``/v1/models`` (the API server is a process of its
own), so neither counts here. Every ``interval_s`` the watchdog looks at the active service's unit and, when the
unit is active, judges the engine by what it generates:

- busy (the engine's own gauges on ``/metrics`` show requests running or waiting): its token counters must move
  within ``busy_window_s``; a one-token request would only queue behind the others;
- idle: a one-token completion with the service's key must come back within ``completion_timeout_s``.

``failures`` failed judgments in a row restart the unit (its processes are killed first: a hung engine may ignore
SIGTERM). A unit that failed on its own (its start limit hit, its readiness wait timed out) is started again too.
Restarts back off (``backoff_s``, doubled for each restart within ``restart_window_s``) and are limited: after
``max_restarts`` in the window the unit is stopped and left so, with the reason, until a play or an operator
starts it. The watchdog never touches a unit that is loading (systemd's "activating": the unit's own start
timeout bounds it), one that is stopped (an operator's stop, or not the active service), or any unit while a
pause holds (the inference_service role pauses it while it converges; the lease expires on its own when a play
dies).

Every verdict that differs from the last, and every action, is a line in the journal; the whole state is a small
JSON file that other readers (``watchdog status``, the metrics) take as it is.

Standard library only: installed in the guest's guard library beside client.py, run by the
``inferhost-watchdog`` unit. Everything that reaches systemd or the API is handed in, so tests drive it with fakes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from dataclasses import dataclass, field

from .client import exchange, one_token, read_key

OK, FAILED, SKIPPED = "ok", "failed", "skipped"

# The engines' own figures on /metrics: gauges of requests being served or queued, and counters that move while
# the engine generates (vLLM's v1 engine and SGLang's --enable-metrics).
ENGINE_METRICS = {
    "vllm": {
        "busy": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
        "progress": ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"),
    },
    "sglang": {
        "busy": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        "progress": ("sglang:generation_tokens_total", "sglang:prompt_tokens_total"),
    },
}

UNIT_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "MainPID")


def log(line):
    """One line in the journal (the unit's standard output)."""
    print(f"watchdog: {line}", flush=True)


def metric_sums(text):
    """{metric name: the sum of its samples} from Prometheus' text format; labels are summed over."""
    sums = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line[: line.index("{")], line[line.rindex("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        sums[name] = sums.get(name, 0.0) + value
    return sums


@dataclass
class Settings:
    """The watchdog's settings (the role's inference_service_watchdog_* variables)."""

    interval_s: float = 10
    failures: int = 2
    completion_timeout_s: float = 15
    busy_window_s: float = 60
    max_restarts: int = 3
    restart_window_s: float = 3600
    backoff_s: float = 60

    @classmethod
    def from_dict(cls, data):
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass
class Service:
    """One watched service: what the plan knows of it."""

    name: str
    unit: str
    url: str
    model: str
    engine: str = "vllm"
    secret_file: str = ""

    @classmethod
    def from_dict(cls, data):
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class Memory:
    """What the watchdog remembers of one service between looks (and writes to its state file)."""

    verdict: str = ""
    reason: str = ""
    since: float = 0.0
    failures: int = 0
    restarts: list = field(default_factory=list)  # [{"at": epoch, "reason": text}]
    given_up: str = ""
    progress: float | None = None
    progress_at: float = 0.0
    last_ok: float = 0.0
    judged: dict = field(default_factory=lambda: {"idle": 0, "busy": 0})  # judgments of each kind, since the start


class Systemd:
    """The unit through systemctl."""

    def __init__(self, run=subprocess.run):
        self.run = run

    def _call(self, *argv):
        done = self.run(["systemctl", *argv], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"systemctl {' '.join(argv)}: {(done.stderr or done.stdout).strip()}")
        return done.stdout

    def show(self, unit):
        out = self._call("show", unit, "--property", ",".join(UNIT_PROPERTIES))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def restart(self, unit):
        # A hung engine may never act on SIGTERM: its processes are killed, then the unit is started again (the
        # guard's ExecStopPost still waits until the GPUs are free).
        self._call("kill", "--signal=SIGKILL", unit)
        self._call("reset-failed", unit)
        self._call("restart", "--no-block", unit)

    def start(self, unit):
        self._call("reset-failed", unit)
        self._call("start", "--no-block", unit)

    def stop(self, unit):
        state = self.show(unit).get("ActiveState")
        if state in ("active", "activating", "deactivating", "reloading"):
            self._call("kill", "--signal=SIGKILL", unit)
        self._call("stop", "--no-block", unit)


class Api:
    """The service's API from the guest, with its key read from the unit's root-only secret file."""

    def __init__(self, service, timeout):
        self.service, self.timeout = service, timeout

    def metrics(self):
        """{name: sum} of /metrics, or None when it does not answer."""
        key = read_key(self.service.secret_file)
        status, text, _ = exchange(self.service.url.rstrip("/") + "/metrics", key, timeout=self.timeout)
        return metric_sums(text) if status == 200 else None

    def complete(self):
        key = read_key(self.service.secret_file)
        return one_token(self.service.url, self.service.model, key, timeout=self.timeout)


def paused(pause_file, now):
    """The reason of a pause in force (its lease not yet expired), else ""."""
    try:
        with open(pause_file, encoding="utf-8") as handle:
            lease = json.load(handle)
        until, reason = float(lease.get("until", 0)), str(lease.get("reason") or "paused")
    except (OSError, ValueError, AttributeError, TypeError):
        return ""
    return f"{reason} (until {time.strftime('%H:%M:%S', time.localtime(until))})" if until > now else ""


class Watchdog:
    """Judges one service at each ``look`` and acts on the verdicts (see the module's docstring)."""

    def __init__(self, service, settings, *, systemd, api, clock=time.time, pause_file=""):
        self.service, self.settings = service, settings
        self.systemd, self.api, self.clock, self.pause_file = systemd, api, clock, pause_file
        self.memory = Memory()

    # --- one judgment ---------------------------------------------------------------------------------

    def judge(self, now):
        """``(OK | FAILED | SKIPPED, reason)`` of the engine at this moment."""
        metrics = self.api.metrics()
        names = ENGINE_METRICS.get(self.service.engine, ENGINE_METRICS["vllm"])
        if metrics is not None:
            busy = sum(metrics.get(n, 0.0) for n in names["busy"])
            progress = sum(metrics.get(n, 0.0) for n in names["progress"])
            mem = self.memory
            moved = mem.progress is None or progress != mem.progress
            if moved:
                mem.progress, mem.progress_at = progress, now
            if busy > 0:
                mem.judged["busy"] += 1
                if moved:
                    return OK, f"busy ({busy:g} requests running or waiting), its token counters moving"
                still = now - mem.progress_at
                if still >= self.settings.busy_window_s:
                    return FAILED, (
                        f"busy ({busy:g} requests running or waiting) but no token counted for {still:.0f} s "
                        f"(the window is {self.settings.busy_window_s:g} s)"
                    )
                return OK, f"busy ({busy:g} requests), no token counted for {still:.0f} s yet"
        self.memory.judged["idle"] += 1
        completion = self.api.complete()
        if completion.get("ok"):
            return OK, "a one-token completion came back"
        return FAILED, f"not generating: {completion.get('problem') or '?'}"

    # --- one look ---------------------------------------------------------------------------------------

    def look(self):
        """Look at the unit once, judge it when it is active, act on the verdict; returns the verdict's reason."""
        now = self.clock()
        reason = paused(self.pause_file, now) if self.pause_file else ""
        if reason:
            self.memory.failures = 0
            return self._verdict(SKIPPED, f"paused: {reason}", now)
        state = self.systemd.show(self.service.unit)
        if state.get("ActiveState") == "active":
            return self._look_active(now)
        return self._look_not_active(state, now)

    def _look_active(self, now):
        mem = self.memory
        mem.given_up = ""  # a play or an operator started it again: watched afresh
        verdict, reason = self.judge(now)
        if verdict == OK:
            mem.failures, mem.last_ok = 0, now
            return self._verdict(OK, reason, now)
        mem.failures += 1
        reason = f"{reason} ({mem.failures}/{self.settings.failures} in a row)"
        self._verdict(FAILED, reason, now)
        if mem.failures >= self.settings.failures:
            self._restart(reason, now)
        return mem.reason

    def _look_not_active(self, state, now):
        mem = self.memory
        mem.failures, mem.progress = 0, None
        active = state.get("ActiveState", "?")
        if active in ("activating", "reloading", "deactivating"):
            return self._verdict(SKIPPED, f"{active} ({state.get('SubState', '?')}): loading or stopping", now)
        if active == "failed" and not mem.given_up:
            reason = f"the unit failed on its own ({state.get('Result', '?')})"
            self._verdict(FAILED, reason, now)
            self._restart(reason, now, start_only=True)
        elif mem.given_up:
            self._verdict(SKIPPED, f"given up: {mem.given_up}", now)
        else:
            self._verdict(SKIPPED, f"{active}: stopped, not watched until it runs again", now)
        return mem.reason

    def _recent(self, now):
        window = self.settings.restart_window_s
        self.memory.restarts = [r for r in self.memory.restarts if now - r["at"] < window]
        return self.memory.restarts

    def _restart(self, reason, now, start_only=False):
        mem, unit = self.memory, self.service.unit
        recent = self._recent(now)
        if len(recent) >= self.settings.max_restarts:
            mem.given_up = (
                f"{reason}; restarted {len(recent)} times in {self.settings.restart_window_s:g} s already, so it is "
                "stopped and left so until a play or an operator starts it"
            )
            log(f"{unit}: giving up: {mem.given_up}")
            self.systemd.stop(unit)
            mem.failures = 0
            self._verdict(SKIPPED, f"given up: {mem.given_up}", now)
            return
        if recent:
            wait = self.settings.backoff_s * 2 ** (len(recent) - 1)
            left = recent[-1]["at"] + wait - now
            if left > 0:
                self._verdict(FAILED, f"{reason}; the next restart in {left:.0f} s (backoff)", now)
                return
        recent.append({"at": now, "reason": reason})
        action = "starting" if start_only else "restarting"
        log(f"{unit}: {action} it ({len(recent)}/{self.settings.max_restarts} in the window): {reason}")
        (self.systemd.start if start_only else self.systemd.restart)(unit)
        mem.failures = 0
        mem.progress = None

    def _verdict(self, verdict, reason, now):
        mem = self.memory
        if (verdict, reason) != (mem.verdict, mem.reason):
            if verdict != mem.verdict or verdict != OK:
                log(f"{self.service.unit}: {verdict}: {reason}")
            mem.since = now if verdict != mem.verdict else mem.since
            mem.verdict, mem.reason = verdict, reason
        return reason

    def state(self):
        """The service's entry in the state file."""
        mem = self.memory
        return {
            "unit": self.service.unit,
            "verdict": mem.verdict,
            "reason": mem.reason,
            "since": mem.since,
            "failures_in_a_row": mem.failures,
            "restarts": list(mem.restarts),
            "given_up": mem.given_up,
            "last_ok": mem.last_ok,
            "judged": dict(mem.judged),
        }


def replace_json(path, data):
    """Write ``data`` to ``path`` whole, mode 0644: readers never see half of it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_state(path, watchdogs, now):
    """The state file."""
    replace_json(path, {"updated": now, "services": {w.service.name: w.state() for w in watchdogs}})


def read_state(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def remembered(watchdog, old):
    """Carry the restarts and a give-up over from the state file (the watchdog itself was restarted)."""
    entry = (old.get("services") or {}).get(watchdog.service.name) or {}
    if entry.get("unit") == watchdog.service.unit:
        watchdog.memory.restarts = [r for r in entry.get("restarts") or [] if isinstance(r, dict) and "at" in r]
        watchdog.memory.given_up = str(entry.get("given_up") or "")


def load_config(path):
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    settings = Settings.from_dict(config.get("settings") or {})
    services = [Service.from_dict(s) for s in config.get("services") or []]
    return config, settings, services


def cmd_run(args):
    config, settings, services = load_config(args.config)
    state_file, pause_file = config.get("state_file", ""), config.get("pause_file", "")
    watchdogs = [
        Watchdog(s, settings, systemd=Systemd(), api=Api(s, settings.completion_timeout_s), pause_file=pause_file)
        for s in services
    ]
    old = read_state(state_file) if state_file else {}
    for watchdog in watchdogs:
        remembered(watchdog, old)
    units = ", ".join(s.unit for s in services) or "nothing"
    log(
        f"watching {units}: every {settings.interval_s:g} s, a restart after {settings.failures} failed judgments "
        f"in a row, at most {settings.max_restarts} restarts in {settings.restart_window_s:g} s"
    )
    while True:
        began = time.monotonic()
        for watchdog in watchdogs:
            try:
                watchdog.look()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                log(f"{watchdog.service.unit}: could not look: {exc}")
        if state_file:
            write_state(state_file, watchdogs, time.time())
        if args.once:
            return 0
        time.sleep(max(0.0, settings.interval_s - (time.monotonic() - began)))


def cmd_status(args):
    config, _settings, _services = load_config(args.config)
    state = read_state(config.get("state_file", ""))
    if args.json:
        print(json.dumps(state, indent=1, sort_keys=True))
        return 0
    services = state.get("services") or {}
    if not services:
        print("the watchdog has written no state yet")
        return 1
    for name, entry in sorted(services.items()):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.get("since") or 0))
        print(f"{name} ({entry.get('unit')}): {entry.get('verdict')} since {since}: {entry.get('reason')}")
        for restart in entry.get("restarts") or []:
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(restart["at"]))
            print(f"  restarted {at}: {restart.get('reason')}")
    return 0


def cmd_pause(args):
    """Pause the watchdog for ``--for`` seconds (a lease: it ends by itself), or end a pause (``--for 0``)."""
    path = args.file
    if args.seconds <= 0:
        if os.path.exists(path):
            os.remove(path)
        return 0
    replace_json(path, {"until": time.time() + args.seconds, "reason": args.reason})
    return 0


def main(argv=None):
    top = argparse.ArgumentParser(prog="inferhost-watchdog", description=__doc__.split("\n\n")[0])
    top.add_argument("--config", default="/etc/inferhost/watchdog.json")
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="watch until stopped (the unit's command)")
    run.add_argument("--once", action="store_true", help="look once and exit")
    status = sub.add_parser("status", help="the last verdicts and restarts")
    status.add_argument("--json", action="store_true")
    pause = sub.add_parser("pause", help="pause for a while (a lease), or end a pause with --for 0")
    pause.add_argument("--file", required=True, help="the pause file of the configuration (pause_file)")
    pause.add_argument("--for", dest="seconds", type=float, required=True)
    pause.add_argument("--reason", default="paused by hand")
    args = top.parse_args(argv)
    return {"run": cmd_run, "status": cmd_status, "pause": cmd_pause}[args.command](args)
