#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    from ansible.module_utils.gpu_switch.command import failure, run
    from ansible.module_utils.gpu_switch.config import load_config
    from ansible.module_utils.gpu_switch.errors import GpuSwitchError
    from ansible.module_utils.gpu_switch.outcome import drivers_view
    from ansible.module_utils.gpu_switch.switch import Switcher

    IMPORT_ERROR = None
except ImportError as exc:  # PyYAML or proxmoxer missing on the host
    IMPORT_ERROR = exc

DOCUMENTATION = r"""
---
module: gpu_switch
short_description: Move the GPUs of a Proxmox host between its LXC container and its VM, with rollback
description:
  - The Ansible front end of C(gpu-switch) (the same Python package as the command on the host, installed by
    the C(gpu_switch) role); it runs on the Proxmox host because it writes sysfs there.
  - O(command=to-vm) and O(command=to-ct) stop the giving guest, rebind every PCI function of every GPU by
    address (C(driver_override), unbind, C(drivers_probe)), give the receiving guest its C(hostpciN) or C(devN)
    entries and start it. A failure rolls every step back; a sysfs write that hangs in the kernel marks the GPU
    as needing a host reboot. O(command=recover) finishes or undoes an interrupted move from its journal.
  - O(command=hookscripts) attaches the pre-start hookscript O(hookscript) to both guests and allows snippets on
    its storage, through the API.
  - Asking for where the GPUs already are changes nothing. In check mode the module plans and changes nothing.
version_added: "0.1.0"
author: inferhost contributors
options:
  command:
    description: What to do.
    type: str
    choices: [status, to-vm, to-ct, recover, hookscripts]
    default: status
  config:
    description: The gpu-switch configuration file (written by the C(gpu_switch) role).
    type: path
    default: /etc/gpu-switch/config.yml
  force:
    description: Stop the giving guest hard when it does not shut down within O(timeout).
    type: bool
    default: false
  timeout:
    description: Seconds the giving guest gets to shut down (default from the configuration, 120).
    type: float
  hookscript:
    description: The snippet volume for O(command=hookscripts), C(<storage>:snippets/<file>).
    type: str
  proxmox_password:
    description: The root@pam password, instead of the configuration's C(password_file).
    type: str
requirements:
  - proxmoxer and PyYAML on the Proxmox host (Debian packages python3-proxmoxer, python3-yaml)
attributes:
  check_mode:
    support: full
    details: The plan is computed and returned in RV(steps); nothing is changed.
  diff_mode:
    support: full
    details: Where the GPUs are (owner and the driver of each function) before and after.
notes:
  - Exit codes of the command map to failures here; RV(rc) carries them (1 rolled back, 2 configuration,
    3 not fully rolled back).
"""

EXAMPLES = r"""
- name: Give the GPUs to the VM
  gpu_switch:
    command: to-vm

- name: Plan the move back without changing anything
  gpu_switch:
    command: to-ct
  check_mode: true

- name: Attach the guard hookscript to both guests
  gpu_switch:
    command: hookscripts
    hookscript: local:snippets/gpu-switch-hook.py
"""

RETURN = r"""
owner:
  description: Who has the GPUs after the command, C(ct), C(vm), C(split) or C(none).
  returned: always
  type: str
  sample: vm
gpus:
  description: Each GPU with its IOMMU group, NUMA node and functions (address, driver).
  returned: always
  type: list
  elements: dict
  sample: [{"address": "0000:01:00.0", "iommu_group": 12, "numa_node": 0,
            "functions": [{"address": "0000:01:00.0", "driver": "vfio-pci"},
                          {"address": "0000:01:00.1", "driver": "vfio-pci"}]}]
container:
  description: The container's vmid, status and GPU entries of its config.
  returned: always
  type: dict
  sample: {"vmid": 101, "status": "stopped", "config": {"dev0": "/dev/nvidia0"}}
vm:
  description: The VM's vmid, status and GPU entries of its config.
  returned: always
  type: dict
  sample: {"vmid": 201, "status": "running", "config": {"hostpci0": "0000:01:00,pcie=1"}}
steps:
  description: The steps done (or, in check mode, planned), each with name, detail and state.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "stop-guest", "detail": "shut down CT 101 (timeout 120 s)", "state": "done"}]
rolled_back:
  description: On failure, whether everything was put back as it was.
  returned: failure
  type: bool
rc:
  description: The command's exit code (0 done, 1 rolled back, 2 configuration, 3 not fully rolled back).
  returned: always
  type: int
"""

FLAT = {
    "owner",
    "gpus",
    "container",
    "vm",
    "steps",
    "command",
    "dry_run",
    "would_change",
    "error",
    "rolled_back",
    "needs_reboot",
    "holders",
    "journal",
    "recovery",
    "what_to_do",
    "busy",
    "before",
}


def planned(result: dict, command: str, host_driver: str, passthrough: str) -> dict:
    """Where the GPUs will be after a planned move (for the diff in check mode)."""
    if command not in ("to-vm", "to-ct") or not result.get("would_change"):
        return drivers_view(result)
    drivers = {}
    for gpu in result.get("gpus", []):
        for fn in gpu["functions"]:
            if command == "to-vm":
                drivers[fn["address"]] = passthrough
            elif fn["address"] == gpu["address"]:
                drivers[fn["address"]] = host_driver
            else:
                drivers[fn["address"]] = fn["driver"] if fn["driver"] != passthrough else "(native driver)"
    return {"owner": command[3:], "drivers": drivers}


def main():
    module = AnsibleModule(
        argument_spec={
            "command": {
                "type": "str",
                "default": "status",
                "choices": ["status", "to-vm", "to-ct", "recover", "hookscripts"],
            },
            "config": {"type": "path", "default": "/etc/gpu-switch/config.yml"},
            "force": {"type": "bool", "default": False},
            "timeout": {"type": "float"},
            "hookscript": {"type": "str"},
            "proxmox_password": {"type": "str", "no_log": True},
        },
        required_if=[("command", "hookscripts", ["hookscript"])],
        supports_check_mode=True,
    )
    if IMPORT_ERROR is not None:
        module.fail_json(
            msg=missing_required_lib("proxmoxer and PyYAML (python3-proxmoxer, python3-yaml)"),
            exception=str(IMPORT_ERROR),
        )
    params = module.params
    command = params["command"]
    try:
        config = load_config(params["config"])
        switcher = Switcher(config, secret=params["proxmox_password"])
        if command == "hookscripts":
            result = switcher.ensure_hookscripts(params["hookscript"], check_mode=module.check_mode)
            module.exit_json(rc=0, **result)
    except GpuSwitchError as exc:
        outcome = failure(command, exc)
        module.fail_json(msg=outcome.reason, rc=outcome.exit_code, changed=False)
    dry_run = module.check_mode and command != "status"
    outcome = run(command, switcher, dry_run=dry_run, force=params["force"], timeout=params["timeout"])
    result = outcome.result
    changed = bool(result.get("would_change") if dry_run else result.get("changed"))
    before = result.get("before") or drivers_view(result)
    after = planned(result, command, config.host_driver, config.passthrough_driver) if dry_run else drivers_view(result)
    flat = {k: v for k, v in result.items() if k in FLAT}
    if outcome.exit_code:
        module.fail_json(msg=outcome.reason, rc=outcome.exit_code, changed=changed, **flat)
    module.exit_json(changed=changed, rc=0, diff={"before": before, "after": after}, **flat)


if __name__ == "__main__":
    main()
