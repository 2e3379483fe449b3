#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

from types import SimpleNamespace

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible.module_utils.gpu_switch.errors import ApiError, GpuSwitchError, TaskFailed
from ansible.module_utils.gpu_switch.guests import Guest, GuestControl
from ansible.module_utils.pve_api import (
    MODULE_OPTIONS,
    Client,
    Login,
    check_login_params,
    connection_spec,
    label,
)

DOCUMENTATION = r"""
---
module: pve_guest_power
short_description: Shut down a Proxmox node's guests cleanly and record which ran, or start the recorded ones again
description:
  - With O(state=stopped), reads the status of every guest in O(guests) before changing anything (a guest the node
    does not have is an error, and nothing is stopped), returns the ones that run in RV(running), and shuts those
    down cleanly, one after the other, in the order given.
  - A guest that does not shut down within O(timeout) is refused (the module fails, naming it and the guests it
    already stopped), or with O(force=true) stopped hard, as C(gpu-switch --force) does.
  - With O(state=started), starts every guest in O(guests) that is not running and waits for each start task to end
    and the guest to run; a running guest is left alone. Give it the RV(running) list of the stop, so only the guests
    that ran before are started.
  - Made for the maintenance of a host whose guests hold its GPUs by passthrough. Such a guest cannot migrate, so it
    is stopped before the host goes down, never left to HA.
version_added: "0.1.0"
author: inferhost contributors
options:
  node:
    description: The PVE node the guests are on.
    type: str
    required: true
  guests:
    description: The guests, each by id and type.
    type: list
    elements: dict
    required: true
    suboptions:
      vmid:
        description: The guest's id.
        type: int
        required: true
      type:
        description: C(lxc) for a container, C(qemu) for a VM.
        type: str
        choices: [lxc, qemu]
        required: true
  state:
    description: C(stopped) records and shuts down the running guests; C(started) starts the guests not running.
    type: str
    choices: [stopped, started]
    required: true
  timeout:
    description: Seconds each guest has to shut down cleanly (PVE's shutdown timeout).
    type: int
    default: 180
  force:
    description: Stop a guest hard when it has not shut down within O(timeout), instead of failing.
    type: bool
    default: false
  task_timeout:
    description: Seconds a start task, or the hard stop of O(force), may take.
    type: int
    default: 600
extends_documentation_fragment:
  - pve_api
attributes:
  check_mode:
    support: full
    details: Reads the guests' status and reports what it would stop or start, changing nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Shut down the running GPU guests of pve1, and remember which ran
  pve_guest_power:
    api_password: "{{ vault_proxmox_password }}"
    ca_path: /etc/pve/pve-root-ca.pem
    node: pve1
    state: stopped
    guests:
      - {vmid: 101, type: lxc}
      - {vmid: 201, type: qemu}
    timeout: 300
  register: gpu_guests

- name: Start again the guests that ran
  pve_guest_power:
    api_password: "{{ vault_proxmox_password }}"
    ca_path: /etc/pve/pve-root-ca.pem
    node: pve1
    state: started
    guests: "{{ gpu_guests.running }}"
"""

RETURN = r"""
running:
  description: The guests that were running when the module began (O(state=stopped)), as O(guests) takes them.
  returned: success and on a failed shutdown
  type: list
  elements: dict
  sample: [{vmid: 101, type: lxc}]
stopped:
  description: The guests shut down (that would be, in check mode), as C(CT 101), C(VM 201).
  returned: success and on a failed shutdown
  type: list
  elements: str
started:
  description: The guests started (that would be, in check mode).
  returned: success
  type: list
  elements: str
msg:
  description: What was done, naming the node and the guests.
  returned: always
  type: str
"""


# gpu-switch's word for each kind of guest.
ROLES = {"lxc": "container", "qemu": "vm"}


class PowerApi(Client):
    """The shared client raising gpu-switch's errors, which its shutdown and start (gpu_switch.guests) catch."""

    api_error = ApiError
    task_failed = TaskFailed


def guest_control(api, task_timeout: int) -> GuestControl:
    """gpu-switch's power steps (clean shutdown, then refuse or stop hard; start and check) on this client: of its
    context they read only the API and the timeout of a Proxmox task."""
    return GuestControl(SimpleNamespace(api=api, cfg=SimpleNamespace(timeouts=SimpleNamespace(task=task_timeout))))


def module_args():
    return dict(
        node=dict(type="str", required=True),
        guests=dict(
            type="list",
            elements="dict",
            required=True,
            options=dict(
                vmid=dict(type="int", required=True),
                type=dict(type="str", required=True, choices=["lxc", "qemu"]),
            ),
        ),
        state=dict(type="str", required=True, choices=["stopped", "started"]),
        timeout=dict(type="int", default=180),
        force=dict(type="bool", default=False),
        task_timeout=dict(type="int", default=600),
    )


class GuestPower:
    """Read every status first, then act on the guests one by one. api is the shared client (reads retried, power
    actions waited for); tests give it against fakepve."""

    def __init__(self, module, api):
        self.module, self.api, self.p = module, api, module.params
        self.guests = [(g["type"], g["vmid"]) for g in self.p["guests"]]
        self.control = guest_control(api, self.p["task_timeout"])

    def fail(self, msg, **kw):
        prefix = f"{self.p['context']}: " if self.p["context"] else ""
        self.module.fail_json(msg=prefix + msg, **kw)

    def statuses(self) -> dict[tuple[str, int], str]:
        """Each guest's status; a guest the node lacks (or an unreadable one) fails before any change."""
        known = {
            (str(row.get("type")), int(row["vmid"])): str(row.get("status", "unknown"))
            for row in self.api.resources("vm")
            if row.get("node") == self.p["node"] and "vmid" in row
        }
        missing = [label(k, v) for k, v in self.guests if (k, v) not in known]
        if missing:
            self.fail(
                f"node {self.p['node']} has no {', '.join(missing)}: check the guests' ids in the inventory; "
                "nothing was stopped or started"
            )
        return {g: known[g] for g in self.guests}

    def stop(self) -> dict:
        node, timeout = self.p["node"], self.p["timeout"]
        status = self.statuses()
        running = [g for g in self.guests if status[g] == "running"]
        result = {
            "running": [{"vmid": v, "type": k} for k, v in running],
            "stopped": [],
            "started": [],
        }
        for kind, vmid in running:
            if not self.module.check_mode:
                try:
                    self.control.shutdown(Guest(kind, ROLES[kind], vmid), timeout, self.p["force"])
                except GpuSwitchError as exc:
                    # gpu-switch's advice names its command line options; say it in this module's terms.
                    reason = exc.reason.split("; rerun with --force")[0]
                    done = ", ".join(result["stopped"]) or "none"
                    self.fail(
                        f"{reason} (guests shut down so far on {node}: {done}); {node} was not rebooted: raise the "
                        "shutdown timeout, allow a hard stop, or shut the guest down by hand",
                        changed=bool(result["stopped"]),
                        **result,
                    )
            result["stopped"].append(label(kind, vmid))
        was = ", ".join(label(k, v) for k, v in running) or "none"
        result["msg"] = f"{node}: running GPU guests {was}; " + (
            f"{'would shut down' if self.module.check_mode else 'shut down'} {', '.join(result['stopped'])}"
            if running
            else "nothing to shut down"
        )
        return dict(changed=bool(running), **result)

    def start(self) -> dict:
        node = self.p["node"]
        status = self.statuses()
        result = {"running": [], "stopped": [], "started": []}
        for kind, vmid in self.guests:
            if status[(kind, vmid)] == "running":
                continue
            if not self.module.check_mode:
                try:
                    self.control.start(Guest(kind, ROLES[kind], vmid))
                except GpuSwitchError as exc:
                    done = ", ".join(result["started"]) or "none"
                    todo = [label(k, v) for k, v in self.guests if status[(k, v)] != "running"]
                    todo = ", ".join(todo[len(result["started"]) :])
                    self.fail(
                        f"{exc.reason} (started on {node}: {done}; not started: {todo})",
                        changed=bool(result["started"]),
                        **result,
                    )
            result["started"].append(label(kind, vmid))
        already = [label(k, v) for k, v in self.guests if status[(k, v)] == "running"]
        verb = "would start" if self.module.check_mode else "started"
        result["msg"] = f"{node}: {verb} {', '.join(result['started']) or 'none'}" + (
            f"; already running: {', '.join(already)}" if already else ""
        )
        return dict(changed=bool(result["started"]), **result)


def main():
    module = AnsibleModule(argument_spec={**connection_spec(env_fallback), **module_args()}, **MODULE_OPTIONS)
    p = module.params
    prefix = f"{p['context']}: " if p["context"] else ""
    for name in ("timeout", "task_timeout"):
        if p[name] < 1:
            module.fail_json(msg=f"{prefix}{name} is {p[name]}; expected a number of seconds of at least 1")
    check_login_params(module)
    login = Login.from_params(p)
    power = GuestPower(module, PowerApi(login, p["node"]))
    try:
        module.exit_json(**(power.stop() if p["state"] == "stopped" else power.start()))
    except (ApiError, GpuSwitchError) as exc:
        module.fail_json(msg=f"{prefix}{p['node']}: {exc.reason}")


if __name__ == "__main__":
    main()
