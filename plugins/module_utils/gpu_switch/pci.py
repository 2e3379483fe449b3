"""Reading PCI state from sysfs: functions of each GPU, bound drivers, IOMMU groups, NUMA nodes.

Everything is read below a sysfs root (``/sys`` on a host, a plain directory tree in tests), through
symlinks as the kernel lays them out: ``bus/pci/devices/<address>/driver -> .../drivers/<name>`` and
``.../iommu_group -> .../kernel/iommu_groups/<n>``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .config import Config, normalise_address
from .errors import ConfigError

BRIDGE_CLASS = "0x0604"  # PCI-to-PCI bridges share groups with their devices and are never rebound
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers


@dataclass
class PciFunction:
    address: str
    vendor: str = ""
    device: str = ""
    pci_class: str = ""
    driver: str | None = None
    override: str | None = None

    def as_dict(self) -> dict:
        return {"address": self.address, "driver": self.driver}


@dataclass
class Gpu:
    address: str
    functions: list[PciFunction] = field(default_factory=list)
    iommu_group: int | None = None
    numa_node: int | None = None
    group_members: list[str] = field(default_factory=list)

    @property
    def slot(self) -> str:
        """domain:bus:slot, the form hostpciN takes for all functions at once."""
        return self.address.rsplit(".", 1)[0]

    @property
    def primary(self) -> PciFunction:
        return next(f for f in self.functions if f.address == self.address)

    def as_dict(self) -> dict:
        return {
            "address": self.address,
            "iommu_group": self.iommu_group,
            "numa_node": self.numa_node,
            "functions": [f.as_dict() for f in self.functions],
        }


class Sysfs:
    """Read-only view of the PCI part of a sysfs tree."""

    def __init__(self, root: str):
        self.root = root
        self.devices = os.path.join(root, "bus", "pci", "devices")
        self.drivers = os.path.join(root, "bus", "pci", "drivers")
        self.groups = os.path.join(root, "kernel", "iommu_groups")

    def path(self, address: str, attr: str = "") -> str:
        return os.path.join(self.devices, address, attr) if attr else os.path.join(self.devices, address)

    def exists(self, address: str) -> bool:
        return os.path.isdir(self.path(address))

    def attr(self, address: str, name: str) -> str | None:
        try:
            with open(self.path(address, name), encoding="ascii", errors="replace") as fh:
                return fh.read().strip()
        except OSError:
            return None

    def _link_name(self, path: str) -> str | None:
        try:
            return os.path.basename(os.readlink(path))
        except OSError:
            return None

    def driver(self, address: str) -> str | None:
        """Name of the bound driver, or None when the function is unbound."""
        return self._link_name(self.path(address, "driver"))

    def override(self, address: str) -> str | None:
        value = self.attr(address, "driver_override")
        return None if value in (None, "", "(null)") else value

    def iommu_group(self, address: str) -> int | None:
        name = self._link_name(self.path(address, "iommu_group"))
        return int(name) if name and name.isdigit() else None

    def group_members(self, group: int) -> list[str]:
        try:
            return sorted(os.listdir(os.path.join(self.groups, str(group), "devices")))
        except OSError:
            return []

    def iommu_enabled(self) -> bool:
        try:
            return bool(os.listdir(self.groups))
        except OSError:
            return False

    def numa_node(self, address: str) -> int | None:
        value = self.attr(address, "numa_node")
        try:
            node = int(value) if value is not None else -1
        except ValueError:
            return None
        return node if node >= 0 else None

    def driver_loaded(self, name: str) -> bool:
        return os.path.isdir(os.path.join(self.drivers, name))

    def all_addresses(self) -> list[str]:
        try:
            return sorted(os.listdir(self.devices))
        except OSError:
            return []

    def function(self, address: str) -> PciFunction:
        return PciFunction(
            address=address,
            vendor=self.attr(address, "vendor") or "",
            device=self.attr(address, "device") or "",
            pci_class=self.attr(address, "class") or "",
            driver=self.driver(address),
            override=self.override(address),
        )

    def slot_functions(self, address: str) -> list[str]:
        """Every function in the GPU's slot (the audio function and any USB/UCSI ones), in order."""
        slot = address.rsplit(".", 1)[0] + "."
        return [a for a in self.all_addresses() if a.startswith(slot)]


def _class_matches(pci_class: str, prefixes) -> bool:
    return any(pci_class.lower().startswith(p.lower()) for p in prefixes)


def is_gpu(sysfs: Sysfs, address: str, vendor: str | None, classes=GPU_CLASSES) -> bool:
    """Whether the function is the vendor's (such as 0x10de) and of one of the classes (prefixes of its class code)."""
    ours = (sysfs.attr(address, "vendor") or "").lower() == vendor
    return ours and _class_matches(sysfs.attr(address, "class") or "", classes)


def read_gpu(sysfs: Sysfs, address: str) -> Gpu:
    """The GPU whose primary function is at ``address``, as it is now: its slot's functions, IOMMU group, NUMA node."""
    group = sysfs.iommu_group(address)
    return Gpu(
        address=address,
        functions=[sysfs.function(a) for a in sysfs.slot_functions(address)],
        iommu_group=group,
        numa_node=sysfs.numa_node(address),
        group_members=sysfs.group_members(group) if group is not None else [],
    )


def discover(config: Config, sysfs: Sysfs) -> list[Gpu]:
    """The configured GPUs with all their functions, as they are now. ConfigError if one does not exist."""
    if config.gpus:
        primaries = list(config.gpus)
        for n, address in enumerate(primaries):
            if not sysfs.exists(address):
                raise ConfigError(f"config {config.path}: gpus[{n}]: no PCI device {address} under {sysfs.devices}")
    else:
        match = config.gpu_match or {}
        primaries = [
            a for a in sysfs.all_addresses() if is_gpu(sysfs, a, match.get("vendor"), match.get("class", GPU_CLASSES))
        ]
        if not primaries:
            raise ConfigError(f"config {config.path}: gpu_match {match} matches no PCI device under {sysfs.devices}")
    gpus, seen = [], {}
    for address in primaries:
        slot = address.rsplit(".", 1)[0]
        if slot in seen:
            raise ConfigError(f"config {config.path}: {address} is a function of GPU {seen[slot]}: list each GPU once")
        seen[slot] = address
        gpus.append(read_gpu(sysfs, address))
    return gpus


def foreign_group_members(gpus: list[Gpu], sysfs: Sysfs) -> list[tuple[Gpu, str]]:
    """(gpu, address) for every device in a GPU's IOMMU group that is neither a GPU function nor a bridge."""
    ours = {f.address for g in gpus for f in g.functions}
    out = []
    for gpu in gpus:
        for member in gpu.group_members:
            if member in ours or (sysfs.attr(member, "class") or "").startswith(BRIDGE_CLASS):
                continue
            out.append((gpu, member))
    return out


def describe_device(sysfs: Sysfs, address: str) -> str:
    """A short description for error messages: address, class and driver."""
    return f"{address} (class {sysfs.attr(address, 'class') or '?'}, driver {sysfs.driver(address) or 'none'})"


MINOR = re.compile(r"^Device Minor:\s*(\d+)", re.M)


def nvidia_minors(proc_root: str) -> dict[str, int]:
    """PCI address -> /dev/nvidiaN minor, from /proc/driver/nvidia/gpus/<address>/information."""
    base = os.path.join(proc_root, "driver", "nvidia", "gpus")
    out = {}
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(base, name, "information"), encoding="ascii", errors="replace") as fh:
                m = MINOR.search(fh.read())
        except OSError:
            continue
        address = normalise_address(name)
        if m and address:
            out[address] = int(m.group(1))
    return out


SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def nvidia_device_paths(gpus: list[Gpu], proc_root: str, dev_root: str) -> tuple[list[str], list[str]]:
    """(paths, missing): the /dev paths the container needs for these GPUs, and those that do not exist.

    Per GPU its /dev/nvidiaN (minor from /proc), then the shared nodes the driver created (nvidiactl,
    nvidia-uvm, nvidia-uvm-tools, nvidia-modeset) and every /dev/nvidia-caps/* node. Other GPUs' nodes are
    left out, so a GPU the host keeps never reaches the container.
    """
    minors = nvidia_minors(proc_root)
    paths, missing = [], []
    for gpu in gpus:
        minor = minors.get(gpu.address)
        if minor is None:
            missing.append(f"/dev/nvidia? (no /proc/driver/nvidia/gpus/{gpu.address}/information)")
            continue
        path = f"/dev/nvidia{minor}"
        paths.append(path)
        if not os.path.exists(os.path.join(dev_root, path[len("/dev/") :])):
            missing.append(path)
    for name in SHARED_NODES:
        if os.path.exists(os.path.join(dev_root, name)):
            paths.append("/dev/" + name)
        elif name in ("nvidiactl", "nvidia-uvm"):
            missing.append("/dev/" + name)
    try:
        caps = sorted(os.listdir(os.path.join(dev_root, "nvidia-caps")))
    except OSError:
        caps = []
    paths += [f"/dev/nvidia-caps/{c}" for c in caps]
    return paths, missing
