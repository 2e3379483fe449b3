"""The PCI address of each CUDA index, from the host's published GPUs or the inventory's (filter gpu_pci_by_index)."""

import pytest
from ansible.errors import AnsibleFilterError
from gpu_index import gpu_pci_by_index

# A site that lists its GPUs out of PCI order: CUDA (CUDA_DEVICE_ORDER=PCI_BUS_ID) still numbers them by bus.
OUT_OF_ORDER = [
    {"address": "0000:81:00.0", "numa_node": 1},
    {"address": "0000:01:00.0", "numa_node": 0},
    {"address": "0000:C1:00.0", "numa_node": 1},
    {"address": "0000:41:00.0", "numa_node": 0},
]
BUS_ORDER = {0: "0000:01:00.0", 1: "0000:41:00.0", 2: "0000:81:00.0", 3: "0000:c1:00.0"}


def test_the_inventory_is_put_in_bus_order_not_taken_in_its_own():
    assert gpu_pci_by_index([], OUT_OF_ORDER) == BUS_ORDER


def test_the_hosts_published_indices_win():
    published = [{"index": i, "address": a} for i, a in sorted(BUS_ORDER.items(), reverse=True)]
    # The inventory's own order would give index 0 to 0000:81:00.0.
    assert gpu_pci_by_index(published, OUT_OF_ORDER) == BUS_ORDER


def test_bus_order_is_numeric_across_domains_and_buses():
    assert gpu_pci_by_index(None, ["0001:02:00.0", "0000:10:00.0", "0000:09:00.0"]) == {
        0: "0000:09:00.0",
        1: "0000:10:00.0",
        2: "0001:02:00.0",
    }


def test_a_malformed_address_is_named():
    with pytest.raises(AnsibleFilterError, match="'01:00' is not a PCI address"):
        gpu_pci_by_index([], ["01:00"])
