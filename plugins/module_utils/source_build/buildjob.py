"""A source build as a detached job with a state file, a log file and a lock.

Builds take hours. The role starts the job through Ansible's async wrapper (it survives a dropped
connection), then polls it: each poll waits up to a minute on the state file and returns the elapsed
time and the log's last lines for the play to show. A second play that finds the job still running
attaches to it instead of starting another (the lock says so); a job whose process died without
writing its end state is reported as ``lost``.

One build per name at a time, whatever its key: the checkout, the build environment and the build
directory belong to the name, so a build of another key (a changed ref or patch) would rewrite the
tree under the running one and its ``clean_paths`` would delete its build directory. ``run`` holds
the name's lock for the whole build and refuses while another build of the name runs; the role waits
for such a build (``wait_name``) before it touches the checkout.

Name directory, ``<cache>/<name>/``:

    .build.lock  flock held by the build of this name that runs (hidden: a listing shows the keys only)

Job directory layout, ``<cache>/<name>/<key>/``:

    build.lock   flock held for as long as the build runs
    state.json   {status: running|succeeded|failed, pid, started, finished, rc, wheel, reason}
    build.log    the build's combined output, headed by the command and its environment
    build.json   the cache key's inputs and the build plan, written with the wheel
    *.whl        the wheel, moved in from a staging directory only after a successful build
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time

STATE = "state.json"
LOG = "build.log"
LOCK = "build.lock"
NAME_LOCK = ".build.lock"
INFO = "build.json"
STAGING = ".staging"
LOST = "lost: the build process ended without writing its result (machine rebooted, or killed)"


class JobError(Exception):
    """The build cannot start (a build of its name already running, bad directory)."""


def _write_json(path, data):
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def read_state(job_dir):
    try:
        with open(os.path.join(job_dir, STATE), encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except ValueError:
        return {"status": "unknown"}


def is_locked(job_dir):
    """True while a build holds the job's lock."""
    path = os.path.join(job_dir, LOCK)
    if not os.path.exists(path):
        return False
    with open(path, "a", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def wheels(job_dir):
    try:
        return sorted(f for f in os.listdir(job_dir) if f.endswith(".whl"))
    except FileNotFoundError:
        return []


def status(job_dir):
    """cached | running | failed | lost | absent, from the job directory alone."""
    state = read_state(job_dir) or {}
    if state.get("status") == "succeeded" and wheels(job_dir):
        return "cached"
    if is_locked(job_dir):
        return "running"
    if state.get("status") == "running":
        return "lost"
    if state.get("status") == "failed":
        return "failed"
    return "absent"


def tail(path, lines=15, max_bytes=65536):
    """The last ``lines`` lines of a file, without reading all of a multi-gigabyte log."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out = [line.rstrip("\r") for line in data.splitlines()]
    # Progress bars redraw with carriage returns: keep the last state of each line.
    out = [line.rsplit("\r", 1)[-1] for line in out]
    return out[-lines:] if lines else []


def name_dir_of(job_dir):
    """``<cache>/<name>`` of a job directory ``<cache>/<name>/<key>``."""
    return os.path.dirname(os.path.normpath(job_dir))


def running_job(name_dir):
    """The job directory of the build of this name that runs now, whatever its key; None when none runs."""
    try:
        entries = sorted(os.listdir(name_dir))
    except FileNotFoundError:
        return None
    for entry in entries:
        path = os.path.join(name_dir, entry)
        if os.path.isdir(path) and is_locked(path):
            return path
    return None


def _try_lock(path):
    """An open file holding an exclusive flock on ``path``, or None when another process holds it."""
    handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 (returned to be held)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _release(handle):
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()


def _refuse(job_dir, other):
    """Raise JobError naming the running build; leave the reason in this key's state when it is another key."""
    name_dir = name_dir_of(job_dir)
    name = os.path.basename(name_dir)
    if other is None or os.path.normpath(other) == os.path.normpath(job_dir):
        raise JobError(f"a build of {name} is already running in {other or name_dir}")
    reason = (
        f"a build of {name} is already running in {other} (key {os.path.basename(other)}); the checkout and "
        "build directory are the name's, so this key builds after it ends: run the play again then"
    )
    if (read_state(job_dir) or {}).get("status") != "succeeded":
        now = time.time()
        _write_json(
            os.path.join(job_dir, STATE), {"status": "failed", "started": now, "finished": now, "reason": reason}
        )
    raise JobError(reason)


def run(job_dir, *, argv, cwd, env, info, timeout_s, clean_paths=()):
    """Run one build to completion (the async job's body). Returns the final state dict.

    ``{staging}`` in argv is the directory the build must write its wheel to; ``clean_paths`` (relative
    to cwd) are removed first, for build systems whose incremental state does not track every input.
    Refused (JobError) while a build of the same name runs, whatever its key.
    """
    os.makedirs(job_dir, exist_ok=True)
    name_dir = name_dir_of(job_dir)
    name_lock = _try_lock(os.path.join(name_dir, NAME_LOCK))
    if name_lock is None:
        _refuse(job_dir, running_job(name_dir))
    try:
        # A key lock without the name's: a build started before the name had a lock still runs.
        other = running_job(name_dir)
        lock = None if other else _try_lock(os.path.join(job_dir, LOCK))
        if lock is None:
            _refuse(job_dir, other)
        try:
            staging = _prepare(job_dir, cwd, clean_paths)
            argv = [a.replace("{staging}", staging) for a in argv]
            state = {"status": "running", "pid": os.getpid(), "started": time.time(), "command": argv}
            _write_json(os.path.join(job_dir, STATE), state)
            rc, reason = _execute(job_dir, argv, cwd, env, info, timeout_s, state)
            return _finish(job_dir, staging, info, state, rc, reason)
        finally:
            _release(lock)
    finally:
        _release(name_lock)


def _prepare(job_dir, cwd, clean_paths):
    staging = os.path.join(job_dir, STAGING)
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    for old in wheels(job_dir):
        os.unlink(os.path.join(job_dir, old))
    base = os.path.normpath(cwd)
    for rel in clean_paths:
        target = os.path.normpath(os.path.join(base, rel))
        if target != base and os.path.commonpath([target, base]) == base:
            shutil.rmtree(target, ignore_errors=True)
    return staging


def _execute(job_dir, argv, cwd, env, info, timeout_s, state):  # noqa: PLR0917 (internal step of run)
    """Run the command with its output in the log; (rc, reason)."""
    started = state["started"]
    with open(os.path.join(job_dir, LOG), "w", encoding="utf-8") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started))
        log.write(f"# inferhost source build, started {stamp}\n# cwd: {cwd}\n# command: {' '.join(argv)}\n")
        for key, value in sorted(info.get("environment_resolved", {}).items()):
            log.write(f"# env {key}={value}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        except OSError as err:
            log.write(f"# cannot start the build: {err}\n")
            return 127, f"cannot start the build: {err}"
        state["child_pid"] = proc.pid
        _write_json(os.path.join(job_dir, STATE), state)
        try:
            rc = proc.wait(timeout=timeout_s)
            reason = "" if rc == 0 else f"the build exited with status {rc}"
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc, reason = 124, f"the build ran past its timeout of {timeout_s} s and was stopped"
        log.write(f"\n# finished after {format_elapsed(time.time() - started)}: {reason or 'ok'}\n")
    return rc, reason


def _stop(proc):
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _finish(job_dir, staging, info, state, rc, reason):  # noqa: PLR0917 (internal step of run)
    finished = time.time()
    built = sorted(f for f in os.listdir(staging) if f.endswith(".whl"))
    if rc == 0 and len(built) != 1:
        rc, reason = 1, f"the build succeeded but left {len(built)} wheels in {staging}: {built}"
    state.update(rc=rc, finished=finished, elapsed=round(finished - state["started"], 1))
    if rc != 0:
        state.update(status="failed", reason=reason)
        _write_json(os.path.join(job_dir, STATE), state)
        return state
    wheel = os.path.join(job_dir, built[0])
    os.replace(os.path.join(staging, built[0]), wheel)
    shutil.rmtree(staging, ignore_errors=True)
    _write_json(os.path.join(job_dir, INFO), dict(info, wheel=built[0], elapsed=state["elapsed"], finished=finished))
    state.update(status="succeeded", wheel=wheel)
    _write_json(os.path.join(job_dir, STATE), state)
    return state


def wait(job_dir, wait_s, *, poll_s=2.0, lines=15, clock=time.monotonic, sleep=time.sleep, start_grace_s=0.0):
    """Wait up to ``wait_s`` for the job to end; report its status, elapsed time and log tail.

    A job just started in the background reads as absent until it has taken its lock: for the first
    ``start_grace_s`` seconds absent is no end, and is reported as ``starting`` (not done).
    """
    begun = clock()
    deadline = begun + wait_s
    while True:
        current = status(job_dir)
        starting = current == "absent" and clock() < begun + start_grace_s
        if (current != "running" and not starting) or clock() >= deadline:
            break
        sleep(min(poll_s, max(0.0, deadline - clock())))
    if starting:
        current = "starting"
    state = read_state(job_dir) or {}
    started = state.get("started")
    end = state.get("finished") or time.time()
    elapsed = round(end - started, 1) if started else None
    return {
        "status": current,
        "done": current not in ("running", "starting"),
        "elapsed": elapsed,
        "elapsed_human": format_elapsed(elapsed) if elapsed is not None else "",
        "rc": state.get("rc"),
        "reason": state.get("reason") or (LOST if current == "lost" else ""),
        "wheel": state.get("wheel"),
        "log": os.path.join(job_dir, LOG),
        "tail": tail(os.path.join(job_dir, LOG), lines),
    }


def wait_name(name_dir, wait_s, **kwargs):
    """wait() for the build of this name that runs now, whatever its key; ``idle`` when none runs.

    The report adds ``job_dir`` and ``key`` of the build followed (None when idle).
    """
    job_dir = running_job(name_dir)
    if job_dir is None:
        return {
            "status": "idle",
            "done": True,
            "elapsed": None,
            "elapsed_human": "",
            "rc": None,
            "reason": "",
            "wheel": None,
            "log": None,
            "tail": [],
            "job_dir": None,
            "key": None,
        }
    report = wait(job_dir, wait_s, **kwargs)
    report.update(job_dir=job_dir, key=os.path.basename(job_dir))
    return report


def format_elapsed(seconds):
    if seconds is None:
        return ""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
