"""The Proxmox API for gpu-switch: the shared client (``pve_api.py``), logged in as the configuration's
``proxmox`` section says, on its node, raising gpu-switch's own ApiError and TaskFailed (so that every front
end maps them to its exit codes).

``pve_api.py`` is the one module the package imports from outside itself. As ``ansible.module_utils.gpu_switch``
(in a module) it is the sibling module, which Ansible sends along; otherwise it lies beside the package on
``sys.path``: in the host's library directory (the ``gpu_switch`` role installs it there), and in
``plugins/module_utils`` for the tests and ``bin/gpu-switch``.
"""

from __future__ import annotations

from .config import ProxmoxConfig
from .errors import ApiError, TaskFailed

if "." in __package__:  # ansible.module_utils.gpu_switch
    from ..pve_api import KINDS, Client, Login, label
else:  # gpu_switch, with pve_api beside it
    from pve_api import KINDS, Client, Login, label

__all__ = ["KINDS", "PveApi", "label"]


class PveApi(Client):
    """The client as gpu-switch uses it: every read retried, power actions waited for (see ``pve_api``)."""

    api_error = ApiError
    task_failed = TaskFailed

    def __init__(self, proxmox: ProxmoxConfig, secret: str, **kwargs):
        login = Login(
            host=proxmox.host,
            port=proxmox.port,
            user=proxmox.user,
            secret=secret,
            token_name=proxmox.token_name,
            verify_ssl=proxmox.verify_ssl,
            ca_file=proxmox.ca_file,
            timeout=proxmox.timeout,
            ca_setting="proxmox.ca_file",
        )
        super().__init__(login, proxmox.node, **kwargs)
        self.cfg = proxmox
