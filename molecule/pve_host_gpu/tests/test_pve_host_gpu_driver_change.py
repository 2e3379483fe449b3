"""Day two on the converged hosts: the driver moved to a newer version and back, by the role as a user runs it.

The stand-in repository's pinning packages behave as NVIDIA's: each Provides, Conflicts with and Replaces
nvidia-driver-pinning and ships the same preferences file, so the installed one must make way for another
(and apt refuses while it is held). One ansible-playbook run per step, on both instances; the state of each
instance is read after every step. The journey ends where the converge left the hosts (590.48.01), with a
run and a --check run that change nothing. It runs after the other verify modules (file order).
"""

import re
from pathlib import Path

from molecule_play import installed

SCENARIO = Path(__file__).resolve().parents[1]
OLD, NEW = "590.48.01", "595.45.04"
PACKAGES = ["nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-persistenced", "nvidia-modprobe"]
PIN_FILE = "/etc/apt/preferences.d/nvidia-driver-pinning.pref"
MARKER = "/run/inferhost/reboot-required"
ALLOW = ["-e", "pve_host_gpu_allow_driver_change=true"]

# (step, ansible-playbook arguments): the change, the way back, and the day after. ALLOW is the documented
# command line: a string "true" to Ansible.
STEPS = [
    ("upgrade", ["-e", f"pve_host_gpu_driver_version={NEW}", *ALLOW]),
    ("rollback", ALLOW),
    ("converge", []),
    ("check", ["--check"]),
]


def _state(host):
    policy = host.check_output("apt-cache policy nvidia-driver-cuda")
    return {
        "packages": installed(host, "nvidia-*"),
        "pin": host.file(PIN_FILE).content_string if host.file(PIN_FILE).exists else "",
        "candidate": re.search(r"Candidate: (\S+)", policy).group(1),
        "module": host.check_output("cat /lib/modules/*/updates/dkms/nvidia.ko"),
        "reasons": [r for r in host.file(MARKER).content_string.splitlines() if not r.startswith("#")],
    }


# The journey the at fixture reports (molecule_play, through tests/conftest.py): a run of the playbook per step.
JOURNEY = (SCENARIO / "converge.yml", STEPS, _state)


def _pinned_to(state, version):
    pins = [name for name in state["packages"] if name.startswith("nvidia-driver-pinning")]
    assert pins == [f"nvidia-driver-pinning-{version}"], f"one pinning package, {version}'s: {pins}"
    assert state["packages"][pins[0]][0] == "hi", "the pinning package is held"
    assert f"Pin: version {version}-*" in state["pin"]
    assert state["candidate"] == f"{version}-1", "apt's candidate follows the pin"
    for name in PACKAGES:
        assert state["packages"][name] == ("hi", f"{version}-1"), name
    assert f"stand-in nvidia {version}" in state["module"], "DKMS built the new module"


def test_an_allowed_upgrade_replaces_the_pin_releases_and_sets_the_holds(at):
    assert at["upgrade"]["changed"] > 0
    _pinned_to(at["upgrade"], NEW)


def test_the_upgrade_is_a_reason_to_reboot_naming_both_versions(at):
    assert f"NVIDIA driver {NEW} installed (replacing {OLD})" in at["upgrade"]["reasons"]


def test_the_rollback_downgrades_to_the_old_pin(at):
    assert at["rollback"]["changed"] > 0
    _pinned_to(at["rollback"], OLD)
    assert f"NVIDIA driver {OLD} installed (replacing {NEW})" in at["rollback"]["reasons"]


def test_after_the_rollback_a_converge_and_a_check_change_nothing(at):
    assert at["converge"]["changed"] == 0
    assert at["check"]["changed"] == 0
    _pinned_to(at["check"], OLD)
