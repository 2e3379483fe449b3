#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import re

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible.module_utils.gpu_switch.entries import (
    EntryError,
    canonical_mapping_entry,
    format_mapping_entry,
    parse_mapping_entry,
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
)

DOCUMENTATION = r"""
---
module: pve_pci_mapping
short_description: Keep one node's entry in cluster PCI resource mappings of Proxmox VE
description:
  - Makes each mapping in O(mappings) exist in the cluster (C(/cluster/mapping/pci)) with exactly one entry for
    O(node), holding the device's path, vendor:device id, subsystem id and IOMMU group as the node has them. The
    entries of other nodes stay as they are, so every host of a cluster keeps its own entry of the same mapping.
  - A VM's C(hostpciN) may then name the mapping (C(mapping=<id>)) instead of a raw address; PVE lets a login with
    C(Mapping.Use) on C(/mapping/pci/<id>) and C(VM.Config.HWType) set that, an API token included, where a raw
    address is C(root@pam)'s alone. PVE checks the entry against the node's hardware at every VM start.
  - Creating or changing a mapping needs C(Mapping.Modify) on C(/mapping/pci). Idempotent, with check mode and
    diff; an update carries the digest of the mappings' file, so a concurrent edit makes it fail.
version_added: "0.1.0"
author: inferhost contributors
options:
  node:
    description: The PVE node whose entries are managed.
    type: str
    required: true
  mappings:
    description: The mappings, one per device.
    type: list
    elements: dict
    required: true
    suboptions:
      id:
        description: The mapping's id (a letter, then letters, digits, C(_) or C(-)).
        type: str
        required: true
      path:
        description: PCI address on O(node); a slot without function (C(0000:01:00)) maps every function.
        type: str
        required: true
      device_id:
        description: Vendor and device id of the device (of its first function for a slot), such as C(10de:2335).
        type: str
        required: true
      subsystem_id:
        description: Subsystem vendor and device id; PVE refuses the start without it when the device has one.
        type: str
      iommu_group:
        description: The device's IOMMU group on O(node).
        type: int
      description:
        description: The mapping's description, set when the module creates it.
        type: str
extends_documentation_fragment:
  - pve_api
  - attributes.edit
"""

EXAMPLES = r"""
- name: Map the host's GPU for the VMs
  pve_pci_mapping:
    api_user: ansible@pve
    api_token_id: gpus
    api_token_secret: "{{ vault_proxmox_token_secret }}"
    node: pve1
    mappings:
      - id: gpu-0000-01-00
        path: "0000:01:00"
        device_id: "10de:2335"
        subsystem_id: "10de:18be"
        iommu_group: 14
"""

RETURN = r"""
mappings:
  description: Each mapping's entries after the change (what they would be, in check mode), every node's.
  returned: success
  type: dict
  sample: {gpu-0000-01-00: ["node=pve1,path=0000:01:00,id=10de:2335,subsystem-id=10de:18be,iommugroup=14"]}
created:
  description: The mappings created.
  returned: success
  type: list
  elements: str
updated:
  description: The mappings whose entry for the node was added or changed.
  returned: success
  type: list
  elements: str
"""

CONFIGID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]+$")


def module_args():
    return dict(
        node=dict(type="str", required=True),
        mappings=dict(
            type="list",
            elements="dict",
            required=True,
            options=dict(
                id=dict(type="str", required=True),
                path=dict(type="str", required=True),
                device_id=dict(type="str", required=True),
                subsystem_id=dict(type="str"),
                iommu_group=dict(type="int"),
                description=dict(type="str"),
            ),
        ),
    )


def wanted_entry(node, mapping):
    """The canonical map entry for node from one item of the mappings option; EntryError when malformed."""
    if not CONFIGID.match(str(mapping["id"])):
        raise EntryError(f"id {mapping['id']!r} is not a mapping id (a letter, then letters, digits, _ or -)")
    entry = {"node": node, "path": mapping["path"], "id": mapping["device_id"]}
    if mapping.get("subsystem_id"):
        entry["subsystem-id"] = mapping["subsystem_id"]
    if mapping.get("iommu_group") is not None:
        entry["iommugroup"] = str(mapping["iommu_group"])
    return canonical_mapping_entry(format_mapping_entry(entry))


def plan(node, wanted, existing):
    """(creates {id: [entries]}, updates {id: [entries]}, warnings) making every wanted mapping hold exactly its
    wanted entry for node; existing: {id: [entry strings]} as the API lists them, other nodes' entries kept."""
    creates, updates, warnings = {}, {}, []
    for mid, entry in wanted.items():
        if mid not in existing:
            creates[mid] = [entry]
            continue
        ours, others = [], []
        for text in existing[mid]:
            try:
                parsed = parse_mapping_entry(text)
            except EntryError as exc:
                warnings.append(f"mapping {mid}: {exc}; left as it is")
                others.append(text)
                continue
            (ours if parsed["node"] == node else others).append(canonical_mapping_entry(text))
        if ours != [entry]:
            updates[mid] = [*others, entry]
    return creates, updates, warnings


def mappings_text(mappings):
    """The mappings as lines for --diff: one 'id: entry' line per entry."""
    return "".join(f"{mid}: {entry}\n" for mid in sorted(mappings) for entry in mappings[mid])


class PciMappings:
    """Read, plan, write; the API calls go through the shared client (module_utils/pve_api.py)."""

    def __init__(self, module, api):
        self.module, self.api, self.p = module, api, module.params

    def fail(self, msg, **kw):
        prefix = f"{self.p['context']}: " if self.p["context"] else ""
        self.module.fail_json(msg=prefix + msg, **kw)

    def wanted(self):
        out = {}
        for n, mapping in enumerate(self.p["mappings"]):
            try:
                entry = wanted_entry(self.p["node"], mapping)
            except EntryError as exc:
                self.fail(f"mappings[{n}]: {exc}")
            if mapping["id"] in out:
                self.fail(f"mappings[{n}]: id {mapping['id']} is given twice")
            out[mapping["id"]] = entry
        return out

    def run(self, wanted):
        try:
            listed = self.api.pci_mappings()
        except Exception as exc:  # noqa: BLE001 - every API failure becomes a message
            self.fail(explain(exc, self.api.login, "listing the cluster's PCI mappings"))
        existing = {str(m.get("id")): [str(t) for t in m.get("map") or []] for m in listed}
        creates, updates, warnings = plan(self.p["node"], wanted, existing)
        for warning in warnings:
            self.module.warn(warning)
        before = {mid: existing[mid] for mid in wanted if mid in existing}
        after = {**before, **creates, **updates}
        description = {m["id"]: m.get("description") for m in self.p["mappings"]}
        if not self.module.check_mode:
            for mid, entries in creates.items():
                self.write(mid, lambda mid=mid, e=entries: self.api.create_pci_mapping(mid, e, description[mid]))
            for mid, entries in updates.items():
                self.write(
                    mid,
                    lambda mid=mid, e=entries: self.api.set_pci_mapping(
                        mid, e, self.api.pci_mapping(mid).get("digest")
                    ),
                )
        changed = bool(creates or updates)
        return dict(
            changed=changed,
            created=sorted(creates),
            updated=sorted(updates),
            mappings=after,
            diff=dict(
                before=mappings_text(before),
                after=mappings_text(after),
                before_header="/cluster/mapping/pci",
                after_header="/cluster/mapping/pci",
            ),
        )

    def write(self, mid, call):
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - every API failure becomes a message
            text = error_text(exc)
            hint = (
                " Creating or changing a mapping needs Mapping.Modify on /mapping/pci."
                if "Permission check failed" in text
                else ""
            )
            self.fail(f"writing PCI mapping {mid} for node {self.p['node']}: {text}.{hint}")


def main():
    module = AnsibleModule(argument_spec={**connection_spec(env_fallback), **module_args()}, **MODULE_OPTIONS)
    check_login_params(module)
    p = module.params
    login = Login.from_params(p)
    runner = PciMappings(module, Client(login, p["node"]))
    wanted = runner.wanted()  # every entry is validated before the first API call
    log_in_or_fail(module, runner.api, login)
    module.exit_json(**runner.run(wanted))


if __name__ == "__main__":
    main()
