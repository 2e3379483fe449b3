"""Fixtures of the unit tests of more than one folder (a test's folder follows the code it tests, docs/layout.md).

The data and helpers they come from are in tests/lib: python_env_testlib.py, source_build_testlib.py,
inference_refdata.py, pve_testlib.py.
"""

import pytest
from inference_refdata import checkpoint, example_vars, hardware, services  # noqa: F401  (pytest fixtures)
from pve_testlib import BRIDGE, GPUS, NIC, host_tree
from python_env_testlib import venv  # noqa: F401  (pytest fixtures)
from source_build_testlib import source  # noqa: F401  (pytest fixtures)


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
