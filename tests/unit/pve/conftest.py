"""Fixtures of the host-tier unit tests."""

import pytest
from pve_testlib import BRIDGE, GPUS, NIC, fake_host


@pytest.fixture
def make_host(tmp_path):
    """make_host(**spec) -> root of a fake host tree (sys/, proc/, lib/modules/) with two GPUs by default."""

    def make(**spec):
        spec.setdefault("gpus", GPUS)
        spec.setdefault("others", [BRIDGE, NIC])
        return str(fake_host.build(str(tmp_path / "host"), spec))

    return make
