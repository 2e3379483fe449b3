# SPDX-License-Identifier: Apache-2.0
"""The PCI address of each CUDA index in a guest that has all of its host's GPUs.

The services run with CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA's index i is the i-th GPU in PCI bus order, whatever
order an inventory lists them in. The host publishes each GPU's index in that order (role pve_host_gpu's facts,
``ansible_local.inferhost_gpu_facts.gpus``); before it has (a guest play run without its host's facts), the inventory's
addresses are put in PCI bus order here.

``{{ host_facts_gpus | gpu_pci_by_index(inventory_gpus) }}`` gives {index: address}.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def _bus_order(address):
    """An address's place in PCI bus order: domain, bus, device, function as numbers."""
    try:
        domain, bus, rest = str(address).lower().split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 8)
    except ValueError:
        raise AnsibleFilterError(f"gpu_pci_by_index: {address!r} is not a PCI address such as 0000:01:00.0") from None


def gpu_pci_by_index(published, inventory=()):
    """{index: address}: the host's published indices when it gave any, else the inventory's GPUs in bus order."""
    if published:
        return {int(gpu["index"]): str(gpu["address"]).lower() for gpu in published}
    addresses = [gpu["address"] if isinstance(gpu, dict) else gpu for gpu in inventory or []]
    return {index: str(address).lower() for index, address in enumerate(sorted(set(addresses), key=_bus_order))}


class FilterModule:
    def filters(self):
        return {"gpu_pci_by_index": gpu_pci_by_index}
