"""Fixtures of the gpu-switch unit tests (the rig itself is in gpu_switch_rig.py)."""

from __future__ import annotations

import pytest
from gpu_switch_rig import Rig


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)


@pytest.fixture
def make_rig(tmp_path):
    def make(**kwargs):
        return Rig(tmp_path, **kwargs)

    return make
