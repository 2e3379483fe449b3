#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.pve_host_probe import probe

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
  - With O(packages), O(paths), O(apt_sources_naming) and O(units) it also reads the rest of what the role
    decides on before it changes anything, so that a converge with nothing to change asks the host once, not a
    round trip for each file and command.
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
  packages:
    description: Package names or dpkg patterns whose installed versions and holds to report in RV(packages).
    type: list
    elements: str
    default: []
  paths:
    description: Paths whose existence and size to report in RV(paths).
    type: list
    elements: path
    default: []
  apt_sources_naming:
    description: Text (a repository's URL) to look for in the apt sources of O(apt_sources_dir); none when empty.
    type: str
    default: ""
  apt_sources_dir:
    description: Where the apt sources are (C(.list) and C(.sources) files).
    type: path
    default: /etc/apt/sources.list.d
  units:
    description: systemd units whose enablement to report in RV(units).
    type: list
    elements: str
    default: []
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
packages:
  description:
    - The installed packages of O(packages), each with C(name), C(version), C(held) (dpkg's selection is hold)
      and C(entry) (C(name=version)). Packages dpkg knows but has not installed are left out.
  returned: always
  type: list
  elements: dict
  sample:
    - {name: nvidia-kernel-open-dkms, version: 590.48.01-1, held: true, entry: nvidia-kernel-open-dkms=590.48.01-1}
paths:
  description: For each path of O(paths), C(exists) and C(size) (null when it does not exist).
  returned: always
  type: dict
  sample: {/etc/kernel/proxmox-boot-uuids: {exists: true, size: 10}}
apt_sources:
  description: The apt source files that contain O(apt_sources_naming), sorted.
  returned: always
  type: list
  elements: str
units:
  description:
    - What C(systemctl is-enabled) says of each unit of O(units) (C(enabled), C(disabled), C(static), ...),
      C(not-found) for a unit systemd does not know, C(unknown) where there is no systemctl.
  returned: always
  type: dict
  sample: {nvidia-persistenced.service: enabled}
"""

# One line a package: "hi nvidia-modprobe=590.48.01-1" (Status-Abbrev, then name=version).
DPKG_FORMAT = "${db:Status-Abbrev}${Package}=${Version}\n"


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


def parse_packages(output):
    """dpkg-query's DPKG_FORMAT lines: the installed packages (current state "i"), with their holds."""
    found = []
    for line in output.splitlines():
        if line[1:2] != "i" or "=" not in line[3:]:
            continue
        name, version = line[3:].split("=", 1)
        found.append({"name": name, "version": version, "held": line.startswith("h"), "entry": line[3:]})
    return found


def installed_packages(module, patterns):
    if not patterns:
        return []
    command = ["dpkg-query", "--show", "--showformat", DPKG_FORMAT, *patterns]
    rc, out, err = module.run_command(command, expand_user_and_vars=False)
    # dpkg-query exits 1 when a name or pattern matches no package; the lines it printed still stand.
    if rc not in (0, 1):
        module.fail_json(msg=f"dpkg-query exited {rc}: {err.strip()}")
    return parse_packages(out)


def path_states(paths):
    states = {}
    for path in paths:
        exists = os.path.lexists(path)
        states[path] = {"exists": exists, "size": os.stat(path).st_size if os.path.exists(path) else None}
    return states


def sources_naming(directory, text):
    """The .list and .sources files of directory whose content contains text."""
    if not text or not os.path.isdir(directory):
        return []
    found = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not name.endswith((".list", ".sources")) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as handle:
            if text in handle.read():
                found.append(path)
    return found


def unit_states(module, units):
    systemctl = module.get_bin_path("systemctl") if units else None
    states = {}
    for unit in units:
        if not systemctl:
            states[unit] = "unknown"
            continue
        _, out, _ = module.run_command([systemctl, "is-enabled", unit])
        # A unit systemd does not know prints its error on stderr only (older systemd) or "not-found".
        states[unit] = out.strip().splitlines()[-1] if out.strip() else "not-found"
    return states


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
            packages=dict(type="list", elements="str", default=[]),
            paths=dict(type="list", elements="path", default=[]),
            apt_sources_naming=dict(type="str", default=""),
            apt_sources_dir=dict(type="path", default="/etc/apt/sources.list.d"),
            units=dict(type="list", elements="str", default=[]),
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
    result["packages"] = installed_packages(module, p["packages"])
    result["paths"] = path_states(p["paths"])
    result["apt_sources"] = sources_naming(p["apt_sources_dir"], p["apt_sources_naming"])
    result["units"] = unit_states(module, p["units"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
