"""Fixtures of the host-tier unit tests."""

import pytest
from pve_testlib import fake_host

GPUS = [
    {"address": "0000:01:00.0", "group": 10, "numa": 0, "driver": "nvidia", "minor": 0},
    {"address": "0000:81:00.0", "group": 20, "numa": 1, "driver": "vfio-pci"},
]
BRIDGE = {"address": "0000:00:01.1", "class": "0x060400", "vendor": "0x1022", "group": 10, "driver": "pcieport"}
NIC = {"address": "0000:02:00.0", "class": "0x020000", "group": 11, "driver": "igb"}


@pytest.fixture
def make_host(tmp_path):
    """make_host(**spec) -> root of a fake host tree (sys/, proc/, lib/modules/) with two GPUs by default."""

    def make(**spec):
        spec.setdefault("gpus", GPUS)
        spec.setdefault("others", [BRIDGE, NIC])
        return str(fake_host.build(str(tmp_path / "host"), spec))

    return make
