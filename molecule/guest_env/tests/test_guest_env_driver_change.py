"""Day two in the guests: after the host moved to a newer driver, the container's userspace and the VM's
driver follow it, and follow it back.

NVIDIA's pinning packages exclude each other (the stand-in repository's do too), so the new version's takes
the place of the old one's. One ansible-playbook run per step on both instances (the bookworm one is the
container, the trixie one the VM); the journey ends where the converge left them, with a run and a --check
run that change nothing. It runs after test_guest_env.py (file order).
"""

import re
from pathlib import Path

from molecule_play import installed

SCENARIO = Path(__file__).resolve().parents[1]
OLD, NEW = "590.48.01", "595.45.04"


def _on(version):
    return ["-e", f"nvidia_userspace_version={version}", "-e", f"nvidia_userspace_host_driver_version={version}"]


STEPS = [("follow", _on(NEW)), ("back", _on(OLD)), ("converge", _on(OLD)), ("check", ["--check", *_on(OLD)])]


def _state(host):
    smi = re.search(r"Driver Version: (\S+)", host.run("nvidia-smi").stdout)
    return {"packages": installed(host, "nvidia-*", "libnvidia-*"), "smi": smi.group(1)}


# The journey the at fixture reports (molecule_play, through tests/conftest.py): a run of the playbook per step.
JOURNEY = (SCENARIO / "driver_change.yml", STEPS, _state)


def _on_driver(state, host, version):
    driver = ["nvidia-open"] if host.backend.host.endswith("-trixie") else ["libnvidia-compute", "nvidia-utils"]
    for name in driver:
        assert state["packages"][name] == ("hi", f"{version}-1"), name
    pins = sorted(name for name in state["packages"] if name.startswith("nvidia-driver-pinning"))
    assert pins == [f"nvidia-driver-pinning-{version}"], pins
    assert state["smi"] == version


def test_the_guest_follows_the_host_to_the_new_driver(at, host):
    assert at["follow"]["changed"] > 0
    _on_driver(at["follow"], host, NEW)


def test_the_guest_follows_the_host_back(at, host):
    assert at["back"]["changed"] > 0
    _on_driver(at["back"], host, OLD)


def test_after_the_way_back_a_converge_and_a_check_change_nothing(at, host):
    assert at["converge"]["changed"] == 0
    assert at["check"]["changed"] == 0
    _on_driver(at["check"], host, OLD)
