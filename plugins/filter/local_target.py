# SPDX-License-Identifier: Apache-2.0
"""Whether a play's target is the machine the controller runs on, and why.

A reboot of such a target reboots the controller in the middle of its play. Three signs, any one enough:

- the connection plugin runs commands on the controller: ``local`` or ``chroot`` in any spelling
  (``local``, ``ansible.builtin.local``, ``ansible.legacy.local``, ``community.general.chroot``, ...);
- the host's address is a name or address of the loopback interface;
- the host runs the controller's kernel: the same ``/proc/sys/kernel/random/boot_id`` on both (the
  controller reached over SSH by its own name or address, or a container on it).

``{{ ansible_connection | local_target_reason(ansible_host, target_boot_id, controller_boot_id) }}``
gives the first sign found as a phrase, or an empty string for a target elsewhere.
"""

from __future__ import annotations

import ipaddress

# Connection plugins that run every command on the controller itself (the last part of the plugin's name).
LOCAL_CONNECTIONS = frozenset({"local", "chroot"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "localhost6", "ip6-localhost", "ip6-loopback"})


def connection_is_local(connection) -> bool:
    """True for a connection plugin that runs on the controller, whatever collection prefix it is named with."""
    return str(connection or "").strip().rsplit(".", 1)[-1].lower() in LOCAL_CONNECTIONS


def address_is_loopback(address) -> bool:
    host = str(address or "").strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_target_reason(connection, address="", boot_id="", controller_boot_id="") -> str:
    """Why tasks on this target run on the controller's machine, or '' when they do not."""
    if connection_is_local(connection):
        return f"the connection {connection} runs the tasks on the controller itself"
    if address_is_loopback(address):
        return f"the host address {address} is the controller itself"
    target, controller = str(boot_id or "").strip(), str(controller_boot_id or "").strip()
    if target and target == controller:
        return f"the host runs the controller's own kernel (boot id {target})"
    return ""


class FilterModule:
    def filters(self):
        return {"local_target_reason": local_target_reason}
