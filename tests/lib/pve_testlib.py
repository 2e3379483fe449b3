"""Helpers of the host-tier unit tests: load our Ansible modules, run them, build fake host trees."""

from pathlib import Path

from module_runner import load_module, run_module

from inferhost.sim import host_tree

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["BRIDGE", "GPUS", "NIC", "ROOT", "host_tree", "load_module", "run_module"]

# The default fake host: two GPUs (one on nvidia, one on vfio-pci), a bridge in the first GPU's IOMMU
# group (never foreign) and a NIC in a group of its own.
GPUS = [
    {"address": "0000:01:00.0", "group": 10, "numa": 0, "driver": "nvidia", "minor": 0},
    {"address": "0000:81:00.0", "group": 20, "numa": 1, "driver": "vfio-pci"},
]
BRIDGE = {"address": "0000:00:01.1", "class": "0x060400", "vendor": "0x1022", "group": 10, "driver": "pcieport"}
NIC = {"address": "0000:02:00.0", "class": "0x020000", "group": 11, "driver": "igb"}
