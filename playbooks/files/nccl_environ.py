"""The NCCL_* variables of this process as the C library has them, for the programs of this folder that run
collectives (validate-nccl-init.py, allreduce-latency.py): a playbook copies this file next to them.

os.environ is a copy taken at start-up: it misses what NCCL itself set (setenv) from /etc/nccl.conf during its init.
"""

import ctypes
import os


def nccl_environment():
    """NCCL_* name -> value, sorted by name; os.environ's where the C library's environ cannot be reached."""
    try:
        environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError):
        return {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}
    found, index = {}, 0
    while environ[index]:
        name, _, value = environ[index].decode(errors="replace").partition("=")
        if name.startswith("NCCL_"):
            found[name] = value
        index += 1
    return dict(sorted(found.items()))
