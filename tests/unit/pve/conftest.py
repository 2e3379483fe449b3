"""Fixtures of the host-tier unit tests."""

import pytest
from pve_testlib import BRIDGE, GPUS, NIC, host_tree


@pytest.fixture
def make_host(tmp_path):
    """make_host(**spec) -> root of a fake host tree (sys/, proc/, lib/modules/) with two GPUs by default."""

    built = []

    def make(**spec):
        spec.setdefault("gpus", GPUS)
        spec.setdefault("others", [BRIDGE, NIC])
        built.append(tmp_path / f"host{len(built)}")
        return str(host_tree.build(str(built[-1]), spec))

    return make
