"""gpu-switch: move the GPUs between the LXC container and the VM of a Proxmox host, safely, with rollback.

One implementation behind three front ends (the ``gpu-switch`` command, the ``gpu_switch`` Ansible module
and ``playbooks/gpu_switch.yml``). Imports are relative, so the package works both as ``gpu_switch`` and as
``ansible.module_utils.gpu_switch``.
"""

from .config import Config, load_config, parse_config
from .errors import (
    EXIT_OK,
    EXIT_ROLLED_BACK,
    EXIT_STRANDED,
    EXIT_USAGE,
    ApiError,
    ConfigError,
    GpuSwitchError,
    Refused,
    WriteTimeout,
)
from .outcome import Outcome
from .switch import Switcher

__all__ = [
    "EXIT_OK",
    "EXIT_ROLLED_BACK",
    "EXIT_STRANDED",
    "EXIT_USAGE",
    "ApiError",
    "Config",
    "ConfigError",
    "GpuSwitchError",
    "Outcome",
    "Refused",
    "Switcher",
    "WriteTimeout",
    "load_config",
    "parse_config",
]
