"""docs/host.md's driver change on the lab, last of the lab's modules: it leaves the host on the next driver."""

import json

import pytest
from lab_testlib import on

from inferhost import lab as labmod

pytestmark = pytest.mark.lab


def test_the_driver_change_reaches_the_container_after_the_hosts_reboot(lab, deployed):
    """docs/host.md's driver change on a user's road: the new pin, host.yml with the change allowed, the host's
    reboot, then container.yml alone with a cold fact cache. The container's userspace follows the module the
    host runs after the reboot, not the facts host.yml wrote before it."""
    current, new = lab.hosts["lab-pve"]["lab_standin_repo"]["driver_versions"]
    pin = {"inferhost_nvidia_driver_version": new}
    host = labmod.playbook(
        labmod.ROOT / "playbooks" / "host.yml",
        extravars={**pin, "pve_host_gpu_allow_driver_change": True},
        fact_cache=labmod.cold_fact_cache("driver-change-host"),
    )
    assert f"NVIDIA driver {new} installed (replacing {current})" in labmod.reboot_reasons(host)
    assert on(lab, "lab-pve", "dpkg-query -W -f '${Version}' nvidia-kernel-open-dkms") == new + "-1"
    facts = json.loads(on(lab, "lab-pve", "cat /etc/ansible/facts.d/inferhost_gpu_facts.fact"))
    assert (facts["driver_version"], facts["loaded_driver_version"]) == (new, current)

    assert labmod.reboot_host(lab) == f"lab-pve rebooted, nvidia module {new}"
    # With the host's facts alone (loaded: the old module) the container would refuse the new pin.
    labmod.playbook(
        labmod.ROOT / "playbooks" / "container.yml",
        # No service: the guard test above left it stopped, and the engine's start is not what this proves.
        extravars={**pin, "inference_service_active": ""},
        fact_cache=labmod.cold_fact_cache("driver-change-container"),
    )
    assert on(lab, "lab-ct", "dpkg-query -W -f '${Version}' libnvidia-compute") == new + "-1"
