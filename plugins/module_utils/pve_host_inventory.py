"""Read what the Proxmox host's kernel and firmware say about its GPUs, below overridable roots.

Every reader takes the root it reads from (``/sys``, ``/proc``, ``/lib/modules`` on a host; a plain
directory tree in tests), so the same code runs against a fake tree, a real kernel in a VM and the real
host. Nothing here writes, and nothing imports Ansible: the ``pve_host_probe`` module wraps it.
"""

from __future__ import annotations

import os
import re

NVIDIA = "0x10de"
DISPLAY_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers
BRIDGE_CLASSES = ("0x0604",)  # PCI bridges share a group with what sits behind them and never move
# EFI global variable GUID; SecureBoot's value is the fifth byte (the first four are attributes).
EFI_GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
ADDRESS = re.compile(r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-1][0-9a-f])(?:\.([0-7]))?$")
CPU_VENDORS = {"AuthenticAMD": "amd", "GenuineIntel": "intel", "HygonGenuine": "amd"}


def normalise_address(text):
    """The canonical spelling of a PCI function address (0000:01:00.0), or None.

    A short form (01:00.0) gets domain 0000; a slot without function (0000:01:00) means function 0.
    """
    m = ADDRESS.match(str(text).strip().lower())
    if not m:
        return None
    return "{}:{}:{}.{}".format(m.group(1) or "0000", m.group(2), m.group(3), m.group(4) or "0")


def _read(path):
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _link_name(path):
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


class Sysfs:
    """The PCI, IOMMU, module and firmware parts of a sysfs tree."""

    def __init__(self, root="/sys"):
        self.root = root
        self.devices = os.path.join(root, "bus", "pci", "devices")
        self.groups = os.path.join(root, "kernel", "iommu_groups")

    def attr(self, address, name):
        return _read(os.path.join(self.devices, address, name))

    def exists(self, address):
        return os.path.isdir(os.path.join(self.devices, address))

    def addresses(self):
        return _listdir(self.devices)

    def driver(self, address):
        return _link_name(os.path.join(self.devices, address, "driver"))

    def iommu_group(self, address):
        name = _link_name(os.path.join(self.devices, address, "iommu_group"))
        return int(name) if name and name.isdigit() else None

    def group_members(self, group):
        return _listdir(os.path.join(self.groups, str(group), "devices"))

    def iommu_active(self):
        return bool(_listdir(self.groups))

    def numa_node(self, address):
        value = self.attr(address, "numa_node")
        try:
            node = int(value)
        except (TypeError, ValueError):
            return None
        return node if node >= 0 else None

    def pci_class(self, address):
        return (self.attr(address, "class") or "").lower()

    def vendor(self, address):
        return (self.attr(address, "vendor") or "").lower()

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


def _is_class(pci_class, prefixes):
    return any(pci_class.startswith(p) for p in prefixes)


def device_minor(proc_root, address):
    """The /dev/nvidiaN minor the driver gave this GPU, from /proc/driver/nvidia/gpus/<address>/information."""
    text = _read(os.path.join(proc_root, "driver", "nvidia", "gpus", address, "information")) or ""
    m = re.search(r"^Device Minor:\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def discover_gpus(sysfs, proc_root="/proc", addresses=None, vendor=NVIDIA):
    """(gpus, missing): the GPUs with all their functions, and the requested addresses that are not GPUs.

    With no addresses, every display-class function of the vendor is a GPU. A requested address is
    missing if no such PCI function exists or it is not a display-class function of the vendor.
    """
    missing = []
    if addresses:
        primaries = []
        for text in addresses:
            address = normalise_address(text)
            if address is None or not sysfs.exists(address):
                missing.append({"address": str(text), "reason": "no such PCI function"})
            elif sysfs.vendor(address) != vendor or not _is_class(sysfs.pci_class(address), DISPLAY_CLASSES):
                missing.append(
                    {
                        "address": str(text),
                        "reason": "vendor {} class {} is not a {} GPU".format(
                            sysfs.vendor(address) or "?", sysfs.pci_class(address) or "?", vendor
                        ),
                    }
                )
            else:
                primaries.append(address)
    else:
        primaries = [
            a for a in sysfs.addresses() if sysfs.vendor(a) == vendor and _is_class(sysfs.pci_class(a), DISPLAY_CLASSES)
        ]
    gpus = []
    all_addresses = sysfs.addresses()
    for index, address in enumerate(sorted(set(primaries))):
        slot = address.rsplit(".", 1)[0]
        functions = [a for a in all_addresses if a.startswith(slot + ".")]
        group = sysfs.iommu_group(address)
        members = sysfs.group_members(group) if group is not None else []
        foreign = [m for m in members if m not in functions and not _is_class(sysfs.pci_class(m), BRIDGE_CLASSES)]
        gpus.append(
            {
                "index": index,
                "address": address,
                "slot": slot,
                "vendor": sysfs.vendor(address),
                "device": (sysfs.attr(address, "device") or "").lower(),
                "functions": [
                    {"address": f, "class": sysfs.pci_class(f), "driver": sysfs.driver(f)} for f in functions
                ],
                "iommu_group": group,
                "iommu_group_members": members,
                "foreign_group_members": [
                    {"address": m, "class": sysfs.pci_class(m), "driver": sysfs.driver(m)} for m in foreign
                ],
                "numa_node": sysfs.numa_node(address),
                "driver": sysfs.driver(address),
                "minor": device_minor(proc_root, address),
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
        "iommu_active": sysfs.iommu_active(),
        "secure_boot": sysfs.secure_boot(),
        "swaps": swaps(proc_root),
        "cpu_vendor": cpu_vendor(proc_root),
        "kernels": kernels(modules_root, kernel_pattern),
        "modules": loaded,
        "module_mismatches": mismatches,
        "cmdline": (_read(os.path.join(proc_root, "cmdline")) or "").split(),
    }
