#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: pve_kernel_cmdline
short_description: Manage arguments in a one-line kernel command line file (/etc/kernel/cmdline)
description:
  - Proxmox VE hosts that boot through systemd-boot (ZFS root on UEFI) take their kernel command line from
    C(/etc/kernel/cmdline), one line, which C(proxmox-boot-tool refresh) copies into every boot entry.
  - Ensures every argument of O(args) is on the line, in place of any argument with the same key, and removes
    the arguments whose key is in O(remove_keys) unless they are wanted. Every other argument (C(root=),
    C(boot=zfs), ...) stays where it is.
  - Keeps a backup and shows the change with C(--diff); check mode reports without writing.
version_added: "0.1.0"
author: inferhost contributors
options:
  path:
    description: The command line file; it must exist (the installer writes it on systemd-boot hosts).
    type: path
    default: /etc/kernel/cmdline
  args:
    description: Arguments that must be present, as C(key=value) or a bare flag.
    type: list
    elements: str
    default: []
  remove_keys:
    description: Keys whose arguments are removed unless they appear in O(args) exactly.
    type: list
    elements: str
    default: []
  backup:
    description: Keep a timestamped copy of the file before changing it.
    type: bool
    default: true
extends_documentation_fragment:
  - attributes.edit
"""

EXAMPLES = r"""
- name: Turn the IOMMU on for passthrough
  pve_kernel_cmdline:
    args: [amd_iommu=on, iommu=pt]
    remove_keys: [intel_iommu, amd_iommu, iommu]
"""

RETURN = r"""
cmdline:
  description: The command line after the change (what it would be, in check mode).
  returned: always
  type: str
backup_file:
  description: The backup of the original, when one was written.
  returned: changed and backup
  type: str
"""


def key_of(arg):
    return arg.split("=", 1)[0]


def reconcile(current, args, remove_keys):
    """The new argument list: wanted args replace same-key ones in place, unwanted managed keys go."""
    wanted = {key_of(a): a for a in args}
    managed = set(remove_keys) | set(wanted)
    out, placed = [], set()
    for token in current:
        key = key_of(token)
        if key not in managed:
            out.append(token)
        elif key in wanted and key not in placed:
            out.append(wanted[key])
            placed.add(key)
    out.extend(wanted[k] for k in wanted if k not in placed)
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/kernel/cmdline"),
            args=dict(type="list", elements="str", default=[]),
            remove_keys=dict(type="list", elements="str", default=[]),
            backup=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    path = module.params["path"]
    for arg in module.params["args"]:
        if not arg or any(c.isspace() for c in arg) or '"' in arg:
            module.fail_json(msg=f"args: {arg!r} is not a single kernel argument (no spaces or quotes)")
    if not os.path.isfile(path):
        module.fail_json(
            msg=f"{path} does not exist. Hosts that boot through systemd-boot keep their kernel command line "
            "there (proxmox-boot-tool); write the current line (cat /proc/cmdline, without the "
            "BOOT_IMAGE= part) into it, or choose the grub boot loader."
        )
    with open(path, encoding="utf-8") as fh:
        before = fh.read()
    lines = [line for line in before.splitlines() if line.strip()]
    if len(lines) > 1:
        module.fail_json(msg=f"{path} has {len(lines)} lines; proxmox-boot-tool expects exactly one.")
    current = lines[0].split() if lines else []
    after_args = reconcile(current, module.params["args"], module.params["remove_keys"])
    after = " ".join(after_args) + "\n"
    changed = after != before
    result = {
        "changed": changed,
        "cmdline": after.strip(),
        "diff": {"before": before, "after": after, "before_header": path, "after_header": path},
    }
    if changed and not module.check_mode:
        if module.params["backup"]:
            result["backup_file"] = module.backup_local(path)
        tmp = os.path.join(module.tmpdir, "cmdline")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(after)
        module.atomic_move(tmp, path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
