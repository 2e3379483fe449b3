"""One model across several containers: when the group of ranks is ready, and how it is started again.

A service with ``nodes`` runs one unit per node (rank 0, the head, serves the API; the others run headless).
The head's ``/health`` is no proof that the group serves: after a rank died it still answers 200 for a while
(about 30 s with vLLM's CPU build), and only a completion fails. So the group is ready when every rank's unit
is active and a real one-token completion through the head comes back; when a rank's unit fails (or stays
inactive), or a completion fails while the head says it is healthy, the whole group is stopped (each unit's
stop waits until its GPUs are free: the guard's ExecStopPost) and started again in order: the ranks above 0
first, the head last.

systemd cannot bind units of different containers to each other, so this runs in the play, on the controller:
the wait of each node of the group runs at the same time (one fork each), and they talk through a small file
on the controller (``Board``). The head's wait (``GroupWait``) judges and commands; every other node's wait
(``RankAgent``) publishes its unit's state and carries out the head's stops and starts on its own node.
Everything that reaches a unit or the API is a function handed in, so the tests drive it with fakes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

READY, LOADING, RESTART = "ready", "loading", "restart"


class GroupError(RuntimeError):
    """The group cannot be made to serve; the message says why."""


def _restarts(state):
    """systemd's count of the unit's automatic restarts (NRestarts), None when not known."""
    try:
        return int(state.get("NRestarts"))
    except (TypeError, ValueError):
        return None


def unit_problem(nodes, units, elapsed, grace, restarts_at_start=None):
    """Why a rank's unit calls for a restart (failed, inactive after ``grace`` seconds, stopping on its own, or
    restarted by systemd since the group was started: ``restarts_at_start`` {host: NRestarts then}), or None.

    A rank that systemd restarted on its own (``Restart=always``) comes back to a group that no longer exists: the
    others wait for a peer that will never rejoin (vLLM 0.32.0's CPU build, measured in the lab: a head that
    crashed and restarted waits for its rank 1 forever, and /health never answers)."""
    for rank, host in enumerate(nodes):
        state = units.get(host) or {}
        active = state.get("ActiveState")
        if active == "failed":
            return f"rank {rank} ({host}): its unit failed ({state.get('Result', '?')})"
        if active == "inactive" and elapsed > grace:
            return f"rank {rank} ({host}): its unit is inactive"
        if active == "deactivating":
            # Nobody asked (the group's own stops are over before the next look): its main process is gone.
            return f"rank {rank} ({host}): its unit is stopping on its own ({state.get('SubState', '?')})"
        before, now = (restarts_at_start or {}).get(host), _restarts(state)
        if before is not None and now is not None and now > before:
            return f"rank {rank} ({host}): systemd restarted its unit on its own (NRestarts {before} -> {now})"
    return None


def verdict(nodes, units, probe, completion, *, elapsed, grace, restarts_at_start=None):
    """``(READY | LOADING | RESTART, reason)`` of the group at one look.

    ``nodes``: hosts in rank order; ``units``: {host: systemd properties (ActiveState, SubState, Result)}, a host
    missing when its state is not known yet; ``probe``: the head's readiness (``health``, ``ready``);
    ``completion``: the one-token completion (``ok``, ``problem``), None when not asked; ``elapsed``: seconds
    since the group was started; ``grace``: seconds an inactive unit may take to begin starting;
    ``restarts_at_start``: each unit's NRestarts when the group was (re)started (``unit_problem``).
    """
    problem = unit_problem(nodes, units, elapsed, grace, restarts_at_start)
    missing = [h for h in nodes if h not in units]
    if problem:
        state, reason = RESTART, problem
    elif missing:
        state, reason = LOADING, f"waiting for the state of {', '.join(missing)}"
    elif not probe.get("ready"):
        state, reason = LOADING, f"the head's health {probe.get('health')}"
    elif completion is None:
        state, reason = LOADING, "the head answers; a completion is next"
    elif not completion.get("ok"):
        state = RESTART
        reason = f"the head says it is healthy but a completion failed: {completion.get('problem') or '?'}"
    elif all(units[h].get("ActiveState") == "active" for h in nodes):
        state, reason = READY, "a one-token completion through the head came back"
    else:
        state, reason = LOADING, "a completion came back; waiting for every unit to be active"
    return state, reason


class GroupWait:
    """The head's wait: judge the group, restart it in order, until it serves or gives up.

    ``ops`` has ``units()`` -> {host: properties}, ``probe()`` -> the head's readiness, ``complete()`` -> the
    one-token completion, ``stop(host)`` (returns once the unit is stopped and its GPUs are free) and
    ``start(host)``; ``log(line)`` prints progress. ``confirm``: completions that must fail in a row (the head
    healthy) before the group is restarted; ``max_restarts``: restarts before it gives up.
    """

    def __init__(self, nodes, ops, *, timeout, grace=30, interval=10, confirm=2, max_restarts=2, join_timeout=300):
        self.nodes, self.ops = list(nodes), ops
        self.timeout, self.grace, self.interval = timeout, grace, interval
        self.confirm, self.max_restarts, self.join_timeout = confirm, max_restarts, join_timeout
        self.restarts = []  # the reason of each restart, in order

    def restart(self, reason, log):
        """Stop every rank (the head first: clients see a closed port, not a half group), then start the ranks
        above 0 and the head last."""
        self.restarts.append(reason)
        log(f"restarting the group ({len(self.restarts)}/{self.max_restarts}): {reason}")
        for host in self.nodes:
            self.ops.stop(host)
        log("every rank is stopped and its GPUs are free; starting the ranks above 0, then the head")
        for host in [*self.nodes[1:], self.nodes[0]]:
            self.ops.start(host)

    def run(self, clock=time.monotonic, sleep=time.sleep, log=print):
        """Wait; returns a result mapping (``ready``, ``msg``, ``restarts``, ``elapsed_s``); GroupError when the
        group does not serve within ``timeout`` of its last start or its restarts are used up."""
        began = started = clock()
        failures = 0
        restarts_at_start = {}  # each unit's NRestarts at its first look since the group's last start
        while True:
            units = self.ops.units()
            for host, unit in units.items():
                if _restarts(unit) is not None:
                    restarts_at_start.setdefault(host, _restarts(unit))
            probe = self.ops.probe()
            elapsed = clock() - started
            completion = self.ops.complete() if probe.get("ready") else None
            state, reason = verdict(
                self.nodes,
                units,
                probe,
                completion,
                elapsed=elapsed,
                grace=self.grace,
                restarts_at_start=restarts_at_start,
            )
            # A failed completion is asked again before the group is restarted for it; a failed unit is not.
            by_completion = (
                state == RESTART and unit_problem(self.nodes, units, elapsed, self.grace, restarts_at_start) is None
            )
            failures = failures + 1 if by_completion else 0
            if by_completion and failures < self.confirm:
                state, reason = LOADING, f"{reason} (asking again before restarting the group)"
            log(f"{elapsed:.0f}s {state}: {reason}")
            if state == READY:
                return {
                    "ready": True,
                    "msg": f"the group of {len(self.nodes)} nodes serves after {elapsed:.0f}s",
                    "restarts": self.restarts,
                    "elapsed_s": round(clock() - began, 1),
                }
            missing = [h for h in self.nodes if h not in units]
            if missing and clock() - began > self.join_timeout:
                raise GroupError(
                    f"no state of {', '.join(missing)} after {self.join_timeout}s: every node of the group must be "
                    "in the play (no --limit leaving one out) and the play's forks at least its number of nodes"
                )
            if state == RESTART:
                if len(self.restarts) >= self.max_restarts:
                    raise GroupError(f"{reason}; the group was restarted {len(self.restarts)} times already")
                self.restart(reason, log)
                started, failures = clock(), 0
                restarts_at_start = {}
                continue
            if elapsed >= self.timeout:
                raise GroupError(f"the group does not serve after {elapsed:.0f}s: {reason}")
            sleep(self.interval)


class Board:
    """A small JSON file on the controller that the waits of one group share, each change under a lock.

    ``nodes``: {host: {"state": properties, "seen": time, "done": last command carried out}}; ``commands``:
    [{"seq", "host", "do": stop | start}] from the head; ``end``: the head's final result, None until then.
    """

    def __init__(self, path):
        self.path = path

    @contextlib.contextmanager
    def _locked(self):
        with open(self.path + ".lock", "a+", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _load(self):
        try:
            with open(self.path, encoding="utf-8") as handle:
                return json.load(handle)
        except (FileNotFoundError, ValueError):
            return {"nodes": {}, "commands": [], "end": None}

    def read(self):
        with self._locked():
            return self._load()

    def update(self, change):
        """Apply ``change(data)`` to the board and write it back; returns what ``change`` returned."""
        with self._locked():
            data = self._load()
            out = change(data)
            tmp = f"{self.path}.{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(data, handle)
            os.replace(tmp, self.path)
            return out

    def remove(self):
        for path in (self.path, self.path + ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


class HeadOps:
    """The head's ``ops`` for ``GroupWait``: its own unit through ``local``, the other nodes' through the board.

    ``local`` has ``state()``, ``probe()``, ``complete()``, ``stop()`` and ``start()`` for the head's own unit.
    A stop or start of another node is a command on the board, done when that node's wait reports it.
    """

    def __init__(self, board, head, local, *, command_timeout, clock=time.monotonic, sleep=time.sleep, poll=1.0):
        self.board, self.head, self.local = board, head, local
        self.command_timeout, self.clock, self.sleep, self.poll = command_timeout, clock, sleep, poll

    def units(self):
        own = self.local.state()
        self.board.update(lambda d: d["nodes"].setdefault(self.head, {}).update(state=own, seen=time.time()))
        return {host: entry["state"] for host, entry in self.board.read()["nodes"].items() if "state" in entry}

    def probe(self):
        return self.local.probe()

    def complete(self):
        return self.local.complete()

    def _command(self, host, action):
        if host == self.head:
            getattr(self.local, action)()
            return

        def post(data):
            seq = len(data["commands"]) + 1
            data["commands"].append({"seq": seq, "host": host, "do": action})
            return seq

        seq = self.board.update(post)
        deadline = self.clock() + self.command_timeout
        while self.clock() < deadline:
            entry = self.board.read()["nodes"].get(host, {})
            if entry.get("done", 0) >= seq:
                if entry.get("error"):
                    raise GroupError(f"{action} of {host} failed: {entry['error']}")
                return
            self.sleep(self.poll)
        raise GroupError(f"{host} did not report the {action} of its unit within {self.command_timeout}s")

    def stop(self, host):
        self._command(host, "stop")

    def start(self, host):
        self._command(host, "start")

    def finish(self, result):
        self.board.update(lambda d: d.update(end=result))


class RankAgent:
    """The wait of a node above rank 0: publish its unit's state, carry out the head's commands on its own unit,
    and end with the head's result. ``local`` has ``state()``, ``stop()`` and ``start()``."""

    def __init__(self, board, host, local, *, join_timeout=300, interval=1.0):
        self.board, self.host, self.local = board, host, local
        self.join_timeout, self.interval = join_timeout, interval

    def step(self):
        """Carry out the commands not done yet and publish the state; returns the head's result once it ended."""
        data = self.board.read()
        done = data["nodes"].get(self.host, {}).get("done", 0)
        error = None
        for command in data["commands"]:
            if command["host"] == self.host and command["seq"] > done:
                try:
                    getattr(self.local, command["do"])()
                except Exception as exc:  # noqa: BLE001 - reported to the head, which fails the group with it
                    error = str(exc)
                done = command["seq"]
        state = self.local.state()

        def publish(board):
            entry = board["nodes"].setdefault(self.host, {})
            entry.update(state=state, seen=time.time(), done=done)
            if error:
                entry["error"] = error
            return board.get("end")

        return self.board.update(publish)

    def run(self, clock=time.monotonic, sleep=time.sleep):
        began = clock()
        while True:
            end = self.step()
            if end is not None:
                return end
            if self.head_missing() and clock() - began > self.join_timeout:
                raise GroupError(
                    f"the head's wait never joined within {self.join_timeout}s: the head must be in the play and "
                    "the play's forks at least the group's number of nodes"
                )
            sleep(self.interval)

    def head_missing(self):
        data = self.board.read()
        return not any(host != self.host for host in data["nodes"])
