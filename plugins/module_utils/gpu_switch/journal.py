"""The journal of a move, and the host-wide lock.

The journal is a JSON file replaced atomically (write, fsync, rename, fsync of the directory) before each
change to sysfs and after each step, so that ``recover`` always knows what an interrupted move was doing.
It carries the boot id: after a reboot the kernel has rebound everything, and only the intent still counts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading

from .errors import Refused


def boot_id(proc_root: str) -> str:
    try:
        with open(os.path.join(proc_root, "sys", "kernel", "random", "boot_id"), encoding="ascii") as fh:
            return fh.read().strip() or "unknown"
    except OSError:
        return "unknown"


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Journal:
    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()  # parallel rebinding writes it from several threads

    def load(self) -> dict | None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            # A journal we cannot read must not be ignored: the host may be mid-move.
            raise Refused(f"journal {self.path} is unreadable ({exc}); inspect it, then remove it") from None
        return data if isinstance(data, dict) else None

    def write(self, data: dict) -> None:
        """Replace the journal atomically and durably; the directory is synced when the file first appears."""
        with self._lock:
            directory = os.path.dirname(self.path)
            os.makedirs(directory, mode=0o700, exist_ok=True)
            created = not os.path.exists(self.path)
            tmp = f"{self.path}.tmp"
            payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, payload)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            if created:
                _fsync_dir(directory)

    def clear(self) -> None:
        with self._lock:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            _fsync_dir(os.path.dirname(self.path))


class HostLock:
    """flock on a file under the run root: one move at a time per host; released by the kernel on death."""

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None

    def holder(self) -> str:
        try:
            with open(self.path, encoding="ascii") as fh:
                return fh.read().strip() or "?"
        except OSError:
            return "?"

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise Refused(f"another gpu-switch is running (pid {self.holder()}, lock {self.path})") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def busy(self) -> bool:
        """True if another process holds the lock (for status; takes nothing)."""
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
