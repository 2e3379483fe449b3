"""Running things on this machine for a test: a playbook over the local connection, a server on a free port."""

import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_playbook(playbook, *extra):
    """ansible-playbook on localhost (local connection, this environment's Python); the finished process."""
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]
    return subprocess.run([*argv, str(playbook), *extra], cwd=ROOT, capture_output=True, text=True, check=False)


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port, tries=300):
    """Wait until something accepts connections on 127.0.0.1:port (up to tries x 20 ms); raise if nothing does."""
    for _ in range(tries):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")
