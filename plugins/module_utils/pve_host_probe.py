"""Read what the Proxmox host's kernel and firmware say about its GPUs, below overridable roots.

Every reader takes the root it reads from (``/sys``, ``/proc``, ``/lib/modules`` on a host; a plain
directory tree in tests), so the same code runs against a fake tree, a real kernel in a VM and the real
host. Nothing here writes, and nothing imports Ansible: the ``pve_host_probe`` module wraps it. The PCI
part (functions, drivers, IOMMU groups, NUMA nodes, device minors) is gpu-switch's reading of sysfs
(``gpu_switch/pci.py``), so that the host role and gpu-switch see the same GPUs; the ``gpu_switch`` package
imports nothing from here, since it is also installed on its own as a command.
"""

from __future__ import annotations

import os
import re

if __package__:  # ansible.module_utils.pve_host_probe, in a module (Ansible sends gpu_switch along)
    from .gpu_switch import entries, pci
else:  # plain pve_host_probe, with plugins/module_utils on sys.path (the unit tests)
    from gpu_switch import entries, pci

NVIDIA = "0x10de"
# EFI global variable GUID; SecureBoot's value is the fifth byte (the first four are attributes).
EFI_GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
CPU_VENDORS = {"AuthenticAMD": "amd", "GenuineIntel": "intel", "HygonGenuine": "amd"}


def normalise_address(text):
    """The canonical spelling of a PCI function address (0000:01:00.0), or None.

    A short form (01:00.0) gets domain 0000; a slot without function (0000:01:00) means function 0.
    """
    try:
        address = entries.hostpci_id(text)
    except entries.EntryError:
        return None
    return address if "." in address else address + ".0"


def _read(path):
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


class Sysfs(pci.Sysfs):
    """gpu-switch's view of the PCI part of a sysfs tree, with the module and firmware parts the host role needs."""

    def __init__(self, root="/sys"):
        super().__init__(root)

    def module(self, name):
        """{'version': str|None, 'parameters': {name: value}} of a loaded module, or None."""
        base = os.path.join(self.root, "module", name)
        if not os.path.isdir(base):
            return None
        params = {}
        for param in _listdir(os.path.join(base, "parameters")):
            value = _read(os.path.join(base, "parameters", param))
            if value is not None:
                params[param] = value
        return {"version": _read(os.path.join(base, "version")), "parameters": params}

    def secure_boot(self):
        """'enabled', 'disabled', or 'bios' when the host did not boot through UEFI."""
        if not os.path.isdir(os.path.join(self.root, "firmware", "efi")):
            return "bios"
        path = os.path.join(self.root, "firmware", "efi", "efivars", "SecureBoot-" + EFI_GLOBAL)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            return "disabled"
        return "enabled" if len(data) >= 5 and data[4] == 1 else "disabled"


def _function(function):
    return {"address": function.address, "class": function.pci_class.lower(), "driver": function.driver}


def discover_gpus(sysfs, proc_root="/proc", addresses=None, vendor=NVIDIA):
    """(gpus, missing): the GPUs with all their functions, and the requested addresses that are not GPUs.

    With no addresses, every display-class function of the vendor is a GPU. A requested address is
    missing if no such PCI function exists or it is not a display-class function of the vendor. A GPU's
    foreign group members are the devices of its IOMMU group that are neither its functions nor bridges.
    """
    missing = []
    if addresses:
        primaries = []
        for text in addresses:
            address = normalise_address(text)
            if address is None or not sysfs.exists(address):
                missing.append({"address": str(text), "reason": "no such PCI function"})
            elif not pci.is_gpu(sysfs, address, vendor):
                function = sysfs.function(address)
                missing.append(
                    {
                        "address": str(text),
                        "reason": "vendor {} class {} is not a {} GPU".format(
                            function.vendor.lower() or "?", function.pci_class.lower() or "?", vendor
                        ),
                    }
                )
            else:
                primaries.append(address)
    else:
        primaries = [a for a in sysfs.all_addresses() if pci.is_gpu(sysfs, a, vendor)]
    minors = pci.nvidia_minors(proc_root)
    gpus = []
    for index, address in enumerate(sorted(set(primaries))):
        gpu = pci.read_gpu(sysfs, address)
        foreign = [member for _, member in pci.foreign_group_members([gpu], sysfs)]
        gpus.append(
            {
                "index": index,
                "address": address,
                "slot": gpu.slot,
                "vendor": gpu.primary.vendor.lower(),
                "device": gpu.primary.device.lower(),
                # What a cluster PCI mapping of the GPU holds besides vendor:device and the IOMMU group, and PVE
                # checks at a VM's start; None where the device has none.
                "subsystem_vendor": (sysfs.attr(address, "subsystem_vendor") or "").lower() or None,
                "subsystem_device": (sysfs.attr(address, "subsystem_device") or "").lower() or None,
                "functions": [_function(f) for f in gpu.functions],
                "iommu_group": gpu.iommu_group,
                "iommu_group_members": gpu.group_members,
                "foreign_group_members": [_function(sysfs.function(m)) for m in foreign],
                "numa_node": gpu.numa_node,
                "driver": gpu.primary.driver,
                "minor": minors.get(address),
            }
        )
    return gpus, missing


def swaps(proc_root="/proc"):
    """Active swap areas from /proc/swaps (first column), header excluded."""
    text = _read(os.path.join(proc_root, "swaps")) or ""
    return [line.split()[0] for line in text.splitlines()[1:] if line.strip()]


def cpu_vendor(proc_root="/proc"):
    """'amd', 'intel' or None, from the first vendor_id line of /proc/cpuinfo."""
    text = _read(os.path.join(proc_root, "cpuinfo")) or ""
    m = re.search(r"^vendor_id\s*:\s*(\S+)", text, re.M)
    return CPU_VENDORS.get(m.group(1)) if m else None


def kernels(modules_root="/lib/modules", pattern=r"-pve$", module="nvidia"):
    """Installed kernels matching pattern, each with the built module files found for it.

    DKMS installs into updates/dkms/ on Debian; extra/ and kernel/drivers/video/ cover other layouts.
    """
    out = []
    regex = re.compile(pattern)
    for name in _listdir(modules_root):
        base = os.path.join(modules_root, name)
        if not os.path.isdir(base) or not regex.search(name):
            continue
        found = []
        for sub in ("updates/dkms", "updates", "extra", "kernel/drivers/video"):
            for entry in _listdir(os.path.join(base, sub)):
                if re.match(rf"^{re.escape(module)}\.ko(\.(xz|zst|gz))?$", entry):
                    found.append(os.path.join(base, sub, entry))
        out.append(
            {
                "name": name,
                "headers": os.path.exists(os.path.join(base, "build")),
                "module_files": sorted(set(found)),
                "module_built": bool(found),
            }
        )
    return out


def param_matches(wanted, actual):
    """Does a module parameter as sysfs shows it (Y/N for booleans) equal the value we configured?"""
    truthy, falsy = {"1", "y", "yes", "true", "on"}, {"0", "n", "no", "false", "off"}
    w, a = str(wanted).strip().lower(), str(actual).strip().lower()
    if w in truthy and a in truthy:
        return True
    if w in falsy and a in falsy:
        return True
    return w == a


def parameter_mismatches(loaded, wanted):
    """[(name, wanted, actual)] for every configured parameter a loaded module shows differently."""
    if loaded is None:
        return []
    params = loaded.get("parameters", {})
    return [
        (name, str(value), params.get(name))
        for name, value in sorted(wanted.items())
        if name not in params or not param_matches(value, params[name])
    ]


def probe(
    sysfs_root="/sys",
    proc_root="/proc",
    modules_root="/lib/modules",
    *,
    addresses=None,
    kernel_pattern=r"-pve$",
    modules=("nvidia", "nvidia_uvm"),
    vendor=NVIDIA,
    module_options=None,
):
    """Everything the host role decides on, as one JSON-ready dict.

    module_options ({module: {parameter: value}}) are compared with the loaded modules' parameters;
    a module that is not loaded has no mismatch (the options apply when it loads).
    """
    sysfs = Sysfs(sysfs_root)
    gpus, missing = discover_gpus(sysfs, proc_root, addresses, vendor)
    names = list(modules) + [m for m in (module_options or {}) if m not in modules]
    loaded = {name: sysfs.module(name) for name in names}
    mismatches = [
        {
            "module": name,
            "parameter": param,
            "wanted": wanted,
            "actual": actual,
            "message": "{} is loaded with {}={} (wanted {}): reload it with the GPUs idle, or reboot".format(
                name, param, "unset" if actual is None else actual, wanted
            ),
        }
        for name, options in sorted((module_options or {}).items())
        for param, wanted, actual in parameter_mismatches(loaded[name], options)
    ]
    return {
        "gpus": gpus,
        "missing": missing,
        "iommu_active": sysfs.iommu_enabled(),
        "secure_boot": sysfs.secure_boot(),
        "swaps": swaps(proc_root),
        "cpu_vendor": cpu_vendor(proc_root),
        "kernels": kernels(modules_root, kernel_pattern),
        "modules": loaded,
        "module_mismatches": mismatches,
        "cmdline": (_read(os.path.join(proc_root, "cmdline")) or "").split(),
    }
