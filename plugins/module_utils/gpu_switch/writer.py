"""Writing to sysfs with a timeout.

An unbind can hang in the kernel (a GPU still in use, a driver bug), and a thread stuck in such a write
cannot be cancelled: it would even keep the process from exiting. So each write runs in a
short-lived child process; if it does not return in time, the child is abandoned (it is unkillable while
the kernel holds it) and the caller gets WriteTimeout.
"""

from __future__ import annotations

import os
import subprocess
import sys

from .errors import WriteTimeout

# The child: one open, one write, one close; the exit status is the errno (0 on success).
_CHILD = (
    "import os,sys\n"
    "try:\n"
    " fd=os.open(sys.argv[1],os.O_WRONLY)\n"
    " try: os.write(fd,sys.argv[2].encode())\n"
    " finally: os.close(fd)\n"
    "except OSError as e: sys.exit(e.errno if 0<(e.errno or 0)<126 else 125)\n"
)


class ProcessWriter:
    """Writes each value in a child process, and gives up on it after the timeout."""

    def __init__(self, python: str | None = None):
        self.python = python or sys.executable or "/usr/bin/python3"

    def write(self, path: str, value: str, timeout: float) -> None:
        proc = subprocess.Popen(
            [self.python, "-I", "-S", "-c", _CHILD, path, value],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,
        )
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # does nothing while the kernel holds it in the write; reaped when the write returns
            raise WriteTimeout(path, value, timeout) from None
        if proc.returncode:
            code = proc.returncode
            if 0 < code < 125:
                raise OSError(code, os.strerror(code), path)
            raise OSError(f"write to {path} failed: {err.decode(errors='replace').strip() or code}")
