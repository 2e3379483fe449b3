"""guests.yml's GPU index -> PCI address map for the inference guard, rendered by ansible-playbook as the play
renders it: the expressions are read from guests.yml itself, on an inventory that lists its GPUs out of PCI order.
"""

import json
import sys

import pytest
import yaml
from localhost import ROOT
from playbook_testlib import PLAYBOOK, run_ansible

GUESTS = ROOT / "playbooks/guests.yml"
# The inventory's order is not the bus order: index i must still be the i-th GPU on the bus, as CUDA numbers them
# with CUDA_DEVICE_ORDER=PCI_BUS_ID (and nvidia-smi does).
LISTED = ["0000:c1:00.0", "0000:01:00.0", "0000:81:00.0", "0000:41:00.0"]
BUS_ORDER = {"0": "0000:01:00.0", "1": "0000:41:00.0", "2": "0000:81:00.0", "3": "0000:c1:00.0"}


def guest_play_vars():
    """The play's variable of the host's GPU facts and the guard's map, as guests.yml writes them."""
    play = next(p for p in yaml.safe_load(GUESTS.read_text()) if "roles" in p)
    service = next(r for r in play["roles"] if r["role"] == "inference_service")
    return {
        "__inferhost_host_gpus": play["vars"]["__inferhost_host_gpus"],
        "gpu_pci": service["vars"]["inference_service_gpu_pci"],
    }


def rendered_map(tmp_path, published=None):
    """The guard's map a container of host pve1 gets; published: the GPU facts the host play left, if any."""
    out = tmp_path / "gpu_pci.json"
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "hosts": {
                "pve1": {"inferhost_gpus": [{"address": a, "numa_node": 0} for a in LISTED]},
                "ct1": {"inferhost_pve_host": "pve1"},
            },
        }
    }
    plays = [
        {
            "name": "The host play's facts, kept in memory as pve_host_gpu keeps them",
            "hosts": "pve1",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.set_fact": {"ansible_local": {"inferhost_gpu_facts": {"gpus": published}}}}]
            if published is not None
            else [],
        },
        {
            "name": "The guest play's map",
            "hosts": "ct1",
            "gather_facts": False,
            "vars": guest_play_vars(),
            "tasks": [{"ansible.builtin.copy": {"content": "{{ gpu_pci | to_json }}", "dest": str(out)}}],
        },
    ]
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    # No fact cache: facts another run cached for a host named pve1 must not count here.
    done = run_ansible(PLAYBOOK, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def test_without_the_hosts_facts_the_inventory_is_put_in_bus_order(tmp_path):
    assert rendered_map(tmp_path) == BUS_ORDER


@pytest.mark.parametrize("order", ["bus", "listed"])
def test_the_indices_the_host_published_give_each_gpus_address(tmp_path, order):
    # The host numbers its GPUs in bus order (discover_gpus of pve_host_probe.py); the list it publishes may come
    # in any order, and only each GPU's own index counts.
    published = [{"index": int(i), "address": a} for i, a in BUS_ORDER.items()]
    if order == "listed":
        published.sort(key=lambda gpu: LISTED.index(gpu["address"]))
    assert rendered_map(tmp_path, published) == BUS_ORDER


def test_the_host_published_indices_win_over_the_inventory(tmp_path):
    # A host whose facts name one GPU fewer than the inventory lists: the host's own numbering is taken whole,
    # nothing is filled in from the inventory.
    published = [{"index": 0, "address": "0000:41:00.0"}, {"index": 1, "address": "0000:81:00.0"}]
    assert rendered_map(tmp_path, published) == {"0": "0000:41:00.0", "1": "0000:81:00.0"}
