#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import re

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible.module_utils.gpu_switch.entries import (
    EntryError,
    canonical_dev,
    canonical_hostpci,
    hostpci_id,
    parse_dev,
    parse_hostpci,
)
from ansible.module_utils.pve_api import (
    MODULE_OPTIONS,
    Client,
    Login,
    check_login_params,
    connection_spec,
    error_text,
    explain,
    log_in_or_fail,
    status_code,
)
from ansible.module_utils.pve_guest_gpu_config import apply, config_text, covers, dev_value, hostpci_value, plan

DOCUMENTATION = r"""
---
module: pve_guest_gpu_config
short_description: Manage the GPU entries of a Proxmox guest's config (a container's devN, a VM's hostpciN)
description:
  - For a container (O(type=lxc)), makes its C(devN) entries pass exactly the O(devices) among the device nodes
    it manages (paths matching O(manage_pattern)); for a VM (O(type=qemu)), makes its C(hostpciN) entries pass
    exactly the O(hostpci) devices among those it manages (the wanted ones and O(managed_hosts)).
  - Every other line of the guest's config stays as it is, other C(devN) and C(hostpciN) entries included. An entry
    already right keeps its key; a new one takes the lowest free index; the write carries the config digest, so a
    concurrent edit makes it fail instead of being overwritten.
  - Validates every entry itself (a fake or a real PVE may accept a malformed C(hostpciN) string and fail only
    when the VM starts), and checks that C(pcie=1) meets a C(q35) machine.
  - PVE lets only C(root@pam) set C(devN) and raw C(hostpciN); an API token is never C(root@pam). The module says so
    when PVE refuses, with what to use instead.
version_added: "0.1.0"
author: inferhost contributors
options:
  node:
    description: The PVE node the guest is on.
    type: str
    required: true
  vmid:
    description: The guest's id.
    type: int
    required: true
  type:
    description: C(lxc) for a container (devN entries), C(qemu) for a VM (hostpciN entries).
    type: str
    choices: [lxc, qemu]
    required: true
  devices:
    description: For O(type=lxc), the device nodes to pass, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Device node under C(/dev), for example C(/dev/nvidia0).
        type: str
        required: true
      mode:
        description: Access mode inside the container, for example C(0666).
        type: str
      uid:
        description: Owner inside the container.
        type: int
      gid:
        description: Group inside the container.
        type: int
      deny_write:
        description: Pass the device read-only.
        type: bool
        default: false
  manage_pattern:
    description: For O(type=lxc), regular expression of the device paths this module owns; other devN stay.
    type: str
    default: "^/dev/nvidia"
  hostpci:
    description:
      - For O(type=qemu), the PCI devices to pass, in order; each names exactly one of O(hostpci[].host) and
        O(hostpci[].mapping).
    type: list
    elements: dict
    default: []
    suboptions:
      host:
        description:
          - PCI address; a slot without function (C(0000:01:00)) passes every function of the GPU.
          - A raw address: PVE lets only C(root@pam) logged in with a password set it.
        type: str
      mapping:
        description:
          - Id of a cluster PCI resource mapping (C(/cluster/mapping/pci)) that names the GPU on the VM's node.
          - A login with C(Mapping.Use) on C(/mapping/pci/<id>) and C(VM.Config.HWType) on the VM may set it, an
            API token included.
        type: str
      pcie:
        description: Attach as PCI Express (needs C(machine q35)).
        type: bool
        default: true
      rombar:
        description: Make the ROM visible to the guest (PVE default on).
        type: bool
      x_vga:
        description: Primary GPU of the VM.
        type: bool
      driver:
        description: C(vfio) (bind to vfio-pci at start) or C(keep) (PVE 9 only).
        type: str
        choices: [vfio, keep]
      romfile:
        description: ROM file under C(/usr/share/kvm).
        type: str
  managed_hosts:
    description:
      - For O(type=qemu), more PCI addresses whose hostpciN entries this module owns and removes when they are not
        in O(hostpci) (for example every GPU of the host, so a GPU taken out of the list leaves the VM).
    type: list
    elements: str
    default: []
  managed_mappings:
    description:
      - For O(type=qemu), ids of PCI mappings whose hostpciN entries this module owns and removes when they are not
        in O(hostpci) (for example the mappings of every GPU of the host).
    type: list
    elements: str
    default: []
  state:
    description: C(present) makes the entries match; C(absent) removes every entry the module owns.
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - pve_api
  - attributes.edit
"""

EXAMPLES = r"""
- name: Pass the GPU device nodes to the container
  pve_guest_gpu_config:
    api_password: "{{ vault_proxmox_password }}"
    ca_path: /etc/pve/pve-root-ca.pem
    node: pve1
    vmid: 101
    type: lxc
    devices:
      - {path: /dev/nvidia0}
      - {path: /dev/nvidiactl}
      - {path: /dev/nvidia-uvm}
      - {path: /dev/nvidia-uvm-tools}

- name: Pass two GPUs, every function, to the VM
  pve_guest_gpu_config:
    api_backend: local
    node: pve1
    vmid: 201
    type: qemu
    hostpci:
      - {host: "0000:01:00"}
      - {host: "0000:81:00"}

- name: Pass a GPU through its cluster PCI mapping (an API token with Mapping.Use may do it)
  pve_guest_gpu_config:
    api_user: ansible@pve
    api_token_id: gpus
    api_token_secret: "{{ vault_proxmox_token_secret }}"
    node: pve1
    vmid: 201
    type: qemu
    hostpci:
      - {mapping: gpu-0000-01-00}
    managed_hosts: ["0000:01:00"]
"""

RETURN = r"""
entries:
  description: The managed entries after the change (what they would be, in check mode).
  returned: success
  type: dict
  sample: {dev0: /dev/nvidia0, dev1: /dev/nvidiactl}
updates:
  description: The keys set and their values.
  returned: success
  type: dict
deleted:
  description: The keys removed.
  returned: success
  type: list
  elements: str
pending:
  description: Managed keys that wait for the guest's next start (a running guest takes them then).
  returned: success
  type: list
  elements: str
"""


def entry_list(rules=None, **options):
    """The spec of a list of entries (devN, hostpciN), each a dict with these options; empty by default."""
    return dict(type="list", elements="dict", default=[], options=options, **(rules or {}))


def module_args():
    return dict(
        node=dict(type="str", required=True),
        vmid=dict(type="int", required=True),
        type=dict(type="str", required=True, choices=["lxc", "qemu"]),
        devices=entry_list(
            path=dict(type="str", required=True),
            mode=dict(type="str"),
            uid=dict(type="int"),
            gid=dict(type="int"),
            deny_write=dict(type="bool", default=False),
        ),
        manage_pattern=dict(type="str", default="^/dev/nvidia"),
        hostpci=entry_list(
            rules=dict(required_one_of=[("host", "mapping")], mutually_exclusive=[("host", "mapping")]),
            host=dict(type="str"),
            mapping=dict(type="str"),
            pcie=dict(type="bool", default=True),
            rombar=dict(type="bool"),
            x_vga=dict(type="bool"),
            driver=dict(type="str", choices=["vfio", "keep"]),
            romfile=dict(type="str"),
        ),
        managed_hosts=dict(type="list", elements="str", default=[]),
        managed_mappings=dict(type="list", elements="str", default=[]),
        state=dict(type="str", choices=["present", "absent"], default="present"),
    )


class GuestGpuConfig:
    """Read, plan, write: the API calls sit in get_config/put_config/get_pending/guest_type so tests can watch
    them. api is the shared client (module_utils/pve_api.py): reads retried on network errors, the write
    repeated only after a read shows it did not happen."""

    def __init__(self, module, api=None):
        self.module = module
        self.p = module.params
        self.api = api
        self.where = f"{self.p['type']} {self.p['vmid']} on node {self.p['node']}"

    def fail(self, msg, **kw):
        prefix = f"{self.p['context']}: " if self.p["context"] else ""
        self.module.fail_json(msg=prefix + msg, **kw)

    def get_config(self):
        return self.api.config(self.p["type"], self.p["vmid"])

    def put_config(self, updates, deletes, digest):
        self.api.set_config(self.p["type"], self.p["vmid"], updates, delete=deletes, digest=digest)

    def get_pending(self):
        return self.api.pending(self.p["type"], self.p["vmid"])

    def effective(self):
        """(config as the guest's next start will use it, keys still pending): pending values applied.

        PVE's GET /config applies pending values by default, but not every implementation does, and a running
        guest keeps most changes pending until its next start; reading /pending makes both cases alike.
        """
        config = dict(self.get_config())
        try:
            rows = self.get_pending()
        except Exception:  # noqa: BLE001 - older or partial APIs: the config alone is what we know
            return config, []
        keys = []
        for row in rows:
            if row.get("delete"):
                config.pop(row["key"], None)
                keys.append(row["key"])
            elif "pending" in row:
                config[row["key"]] = row["pending"]
                keys.append(row["key"])
        return config, sorted(keys)

    def guest_type(self):
        """('lxc'|'qemu', node) of the vmid anywhere in the cluster, or (None, None)."""
        for row in self.api.resources("vm"):
            if int(row.get("vmid", -1)) == self.p["vmid"]:
                return row.get("type"), row.get("node")
        return None, None

    # --- wanted entries ------------------------------------------------------------------------------

    def wanted(self):
        kind = "devices" if self.p["type"] == "lxc" else "hostpci"
        other = "hostpci" if kind == "devices" else "devices"
        if self.p[other]:
            self.fail(
                f"{other} is for {'VMs (type qemu)' if other == 'hostpci' else 'containers (type lxc)'}, "
                f"vmid {self.p['vmid']} is given as type {self.p['type']}"
            )
        if self.p["state"] == "absent":
            return []
        out = []
        for n, entry in enumerate(self.p[kind]):
            try:
                value = dev_value(entry) if kind == "devices" else hostpci_value(entry)
            except EntryError as exc:
                self.fail(f"{kind}[{n}]: {exc}")
            if kind == "devices" and not re.search(self.p["manage_pattern"], parse_dev(value)["path"]):
                self.fail(
                    f"{kind}[{n}]: {entry['path']} does not match manage_pattern {self.p['manage_pattern']!r}, "
                    "so the module could not tell it is its own on the next run"
                )
            out.append(value)
        if len(set(out)) != len(out):
            self.fail(f"{kind} names the same device twice")
        return out

    def owner(self, wanted):
        """owns(canonical_or_None, raw) for plan()."""
        if self.p["type"] == "lxc":
            pattern = re.compile(self.p["manage_pattern"])

            def owns_dev(value, raw):
                path = parse_dev(value)["path"] if value else str(raw).split(",")[0].replace("path=", "")
                return bool(pattern.search(path))

            return owns_dev
        managed = set()
        for text in list(self.p["managed_hosts"]) + [h for v in wanted for h in parse_hostpci(v)["host"]]:
            try:
                managed.add(hostpci_id(text))
            except EntryError as exc:
                self.fail(f"managed_hosts: {exc}")
        mappings = set(self.p["managed_mappings"]) | {parse_hostpci(v)["mapping"] for v in wanted} - {None}

        def owns_pci(value, raw):
            if value is None:
                return any(m in str(raw).lower() for m in managed) or any(
                    re.search(rf"(^|,)mapping={re.escape(m)}(,|$)", str(raw)) for m in mappings
                )
            parsed = parse_hostpci(value)
            if parsed["mapping"]:
                return parsed["mapping"] in mappings
            ids = parsed["host"]
            return any(covers(ids, m) or covers([m], i) for m in managed for i in ids)

        return owns_pci

    # --- the run -------------------------------------------------------------------------------------

    def read(self):
        try:
            return self.effective()
        except Exception as exc:  # noqa: BLE001 - every API failure becomes a message
            if "does not exist" in error_text(exc) or status_code(exc) in (404, 500):
                kind, node = self.guest_type()
                if kind and kind != self.p["type"]:
                    noun = {"lxc": "a container", "qemu": "a VM"}
                    self.fail(
                        f"vmid {self.p['vmid']} is {noun[kind]} (type {kind}) on node {node}, not "
                        f"{noun[self.p['type']]}; check the vmid"
                    )
                if kind and node != self.p["node"]:
                    self.fail(f"vmid {self.p['vmid']} is on node {node}, not {self.p['node']}")
                if not kind:
                    self.fail(f"vmid {self.p['vmid']} does not exist in the cluster")
            self.fail(explain(exc, self.api.login, f"reading the config of {self.where}"))

    def check_machine(self, config, wanted):
        if self.p["type"] != "qemu":
            return
        if any(parse_hostpci(v)["options"].get("pcie") == "1" for v in wanted):
            machine = str(config.get("machine", ""))
            if "q35" not in machine:
                self.fail(
                    f"pcie=1 needs a q35 machine, and VM {self.p['vmid']} has machine "
                    f"{machine or 'i440fx (the default)'}; set machine: q35 on the VM, or pcie: false"
                )

    def run(self, wanted):
        config, pending = self.read()
        self.check_machine(config, wanted)
        kind = "dev" if self.p["type"] == "lxc" else "hostpci"
        owns = self.owner(wanted)
        try:
            updates, deletes, warnings = plan(config, wanted, kind, owns)
        except EntryError as exc:
            self.fail(str(exc))
        for warning in warnings:
            self.module.warn(f"{self.where}: {warning}")
        before = {k: v for k, v in config.items() if k != "digest"}
        after = apply(before, updates, deletes)
        changed = bool(updates or deletes)
        result = dict(
            changed=changed,
            updates=updates,
            deleted=deletes,
            diff=dict(
                before=config_text(before), after=config_text(after), before_header=self.where, after_header=self.where
            ),
        )
        if changed and not self.module.check_mode:
            setting = (
                "a container's devN entries (PVE has no resource mapping for them)"
                if kind == "dev"
                else "a VM's raw hostpciN entries (a login with Mapping.Use may set hostpciN: mapping=<id> instead, "
                "the GPUs given as cluster PCI mappings; an existing raw entry is root@pam's to change or remove)"
            )
            what = f"writing {', '.join(sorted(updates) + deletes)} of {self.where}"
            try:
                self.put_config(updates, deletes, config.get("digest"))
            except Exception as exc:  # noqa: BLE001 - every API failure becomes a message
                self.fail(
                    explain(exc, self.api.login, what, setting),
                    updates=updates,
                    deleted=deletes,
                )
            after, pending = self.effective()
            after.pop("digest", None)
        pattern = re.compile(rf"^{kind}\d+$")
        result["pending"] = [k for k in pending if pattern.match(k)]
        result["entries"] = {k: v for k, v in after.items() if pattern.match(k) and owns(_safe(kind, v), v)}
        return result


def _safe(kind, value):
    try:
        return canonical_dev(value) if kind == "dev" else canonical_hostpci(value)
    except EntryError:
        return None


def main():
    module = AnsibleModule(argument_spec={**connection_spec(env_fallback), **module_args()}, **MODULE_OPTIONS)
    check_login_params(
        module, "; devN and raw hostpciN need root@pam with its password, or api_backend: local on the node"
    )
    p = module.params
    login = Login.from_params(p)
    runner = GuestGpuConfig(module, Client(login, p["node"]))
    wanted = runner.wanted()  # every entry is validated before the first API call
    # The inventory variable is named: the password comes from the inventory through it (role pve_api).
    log_in_or_fail(
        module,
        runner.api,
        login,
        variable="pve_api_password",
        advice="; set the right password in the inventory (inventory/example: vault_proxmox_password, in the vault)",
    )
    module.exit_json(**runner.run(wanted))


if __name__ == "__main__":
    main()
