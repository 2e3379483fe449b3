"""The lab that the lab's test modules share: brought up once per run with one host, deployed once in the README's
order; the modules that follow test_lab.py take it as it is left (test_lab_cluster.py adds the second host and
gives it back, test_lab_driver_change.py, which changes the host's driver, comes last)."""

import pytest

from inferhost import lab as labmod


@pytest.fixture(scope="session")
def lab():
    labmod.cmd_down(None)
    the_lab = labmod.Lab.from_inventory(1)
    labmod.bring_up(the_lab)
    yield the_lab
    labmod.cmd_down(None)


@pytest.fixture(scope="session")
def deployed(lab):
    """host.yml, the host's reboot, host.yml, container.yml, validate.yml, gpu-switch to-vm, vm.yml, gpu-switch
    to-ct, in that order."""
    return {name: (seconds, result) for name, seconds, _, result in labmod.deploy_in_order(lab)}
