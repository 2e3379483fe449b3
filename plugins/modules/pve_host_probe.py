#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.pve_host_inventory import probe

DOCUMENTATION = r"""
---
module: pve_host_probe
short_description: Read the GPU host's PCI, IOMMU, firmware, swap, kernel and module state
description:
  - Reads, never writes. Every path is below an overridable root (O(sysfs_root), O(proc_root),
    O(modules_root)), so the checks built on it can be driven by a fake tree in tests.
  - Lists the GPUs (all NVIDIA display-class functions, or the O(addresses) given) with every function of
    their slot, their IOMMU group and the foreign devices in it, NUMA node, bound driver and device minor;
    whether the IOMMU is active; the Secure Boot state and, when it is on, whether the DKMS signing key
    O(mok_key) is enrolled; active swap; the CPU vendor; the installed kernels and whether the driver
    module is built for each; the loaded modules' versions and parameters.
  - An address that is not a GPU is reported in RV(missing), not as a failure, so the caller can name
    its own variable in the message.
version_added: "0.1.0"
author: inferhost contributors
options:
  sysfs_root:
    description: Where sysfs is mounted.
    type: path
    default: /sys
  proc_root:
    description: Where procfs is mounted.
    type: path
    default: /proc
  modules_root:
    description: The kernel modules tree.
    type: path
    default: /lib/modules
  addresses:
    description: PCI addresses of the GPUs (C(0000:01:00.0)); empty means every NVIDIA GPU found.
    type: list
    elements: str
    default: []
  vendor:
    description:
      - PCI vendor id of the GPUs (display-class functions); NVIDIA's by default.
      - The real-kernel tests point it at an emulated display device, since QEMU cannot present NVIDIA's id.
    type: str
    default: "0x10de"
  kernel_pattern:
    description: Regular expression selecting the kernels (directory names under O(modules_root)) to report.
    type: str
    default: "-pve$"
  modules:
    description: Kernel modules whose version and parameters to read when loaded.
    type: list
    elements: str
    default: [nvidia, nvidia_uvm]
  module_options:
    description:
      - Module parameters as configured, a dict of dicts (module, then parameter and value); each loaded module's
        parameters are compared with them (C(1) matches the C(Y) sysfs shows for a boolean).
    type: dict
    default: {}
  mok_key:
    description: The DKMS module-signing certificate whose enrolment matters when Secure Boot is on.
    type: path
    default: /var/lib/dkms/mok.pub
  mokutil:
    description: The mokutil command used to test the enrolment.
    type: str
    default: mokutil
extends_documentation_fragment:
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Probe the host
  pve_host_probe:
    addresses: ["0000:01:00.0", "0000:81:00.0"]
  register: probe
"""

RETURN = r"""
gpus:
  description: One entry per GPU, ordered by address.
  returned: always
  type: list
  elements: dict
  sample:
    - index: 0
      address: "0000:01:00.0"
      slot: "0000:01:00"
      functions: [{address: "0000:01:00.0", class: "0x030200", driver: nvidia}]
      iommu_group: 12
      foreign_group_members: []
      numa_node: 0
      driver: nvidia
      minor: 0
missing:
  description: Requested addresses that are not GPUs, each with the reason.
  returned: always
  type: list
  elements: dict
iommu_active:
  description: Whether the kernel has IOMMU groups.
  returned: always
  type: bool
secure_boot:
  description: C(enabled), C(disabled), or C(bios) when the host did not boot through UEFI.
  returned: always
  type: str
mok_enrolled:
  description: Whether O(mok_key) is enrolled; null when Secure Boot is not enabled.
  returned: always
  type: bool
mok_detail:
  description: Why RV(mok_enrolled) is what it is.
  returned: always
  type: str
swaps:
  description: Active swap areas.
  returned: always
  type: list
  elements: str
cpu_vendor:
  description: C(amd), C(intel), or null.
  returned: always
  type: str
kernels:
  description: Installed kernels with C(headers) (a build link exists) and C(module_built).
  returned: always
  type: list
  elements: dict
modules:
  description: For each module of O(modules) and O(module_options), null or its C(version) and C(parameters).
  returned: always
  type: dict
module_mismatches:
  description:
    - Loaded modules' parameters that differ from O(module_options).
    - Each has C(module), C(parameter), C(wanted), C(actual) and a C(message) saying what to do.
  returned: always
  type: list
  elements: dict
cmdline:
  description: The running kernel's command line, split into arguments.
  returned: always
  type: list
  elements: str
"""


def mok_state(module, secure_boot, key, mokutil):
    """(enrolled, detail) for the DKMS key; (None, ...) when Secure Boot does not apply."""
    if secure_boot != "enabled":
        return None, f"Secure Boot is {secure_boot}"
    if not os.path.exists(key):
        return False, f"{key} does not exist (DKMS has not generated a signing key yet)"
    tool = module.get_bin_path(mokutil) if not os.path.isabs(mokutil) else mokutil
    if not tool or not os.path.exists(tool):
        return False, f"{mokutil} is not installed, so the enrolment of {key} cannot be checked"
    rc, out, err = module.run_command([tool, "--test-key", key])
    text = (out + err).strip()
    if "already enrolled" in text:
        return True, text
    return False, text or f"mokutil --test-key exited {rc}"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            proc_root=dict(type="path", default="/proc"),
            modules_root=dict(type="path", default="/lib/modules"),
            addresses=dict(type="list", elements="str", default=[]),
            vendor=dict(type="str", default="0x10de"),
            kernel_pattern=dict(type="str", default="-pve$"),
            modules=dict(type="list", elements="str", default=["nvidia", "nvidia_uvm"]),
            module_options=dict(type="dict", default={}),
            mok_key=dict(type="path", default="/var/lib/dkms/mok.pub"),
            mokutil=dict(type="str", default="mokutil"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    result = probe(
        p["sysfs_root"],
        p["proc_root"],
        p["modules_root"],
        addresses=p["addresses"],
        kernel_pattern=p["kernel_pattern"],
        modules=tuple(p["modules"]),
        vendor=p["vendor"].lower(),
        module_options=p["module_options"],
    )
    result["mok_enrolled"], result["mok_detail"] = mok_state(module, result["secure_boot"], p["mok_key"], p["mokutil"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
