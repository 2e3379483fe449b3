"""The lab's container machines get their device nodes as LXC makes them from devN entries (sim/pve_power.py)."""

import os
import subprocess

import pytest
from fakepve.model import TaskError

from inferhost.sim import pve_power


def on_this_machine(*argv):
    """podman exec NODE ... run here: the node's paths are this machine's."""
    assert argv[:2] == ("exec", "node")
    return subprocess.run(list(argv[2:]), capture_output=True, text=True, check=False)


def test_devn_entries_are_read_in_their_numeric_order_with_their_options():
    config = {"dev10": "/dev/c", "dev1": "path=/dev/b,mode=0600", "dev0": "/dev/a,uid=1000,gid=44", "hostname": "x"}
    assert pve_power.device_entries(config) == [
        ("/dev/a", {"uid": "1000", "gid": "44"}),
        ("/dev/b", {"mode": "0600"}),
        ("/dev/c", {}),
    ]


def test_a_path_the_node_lacks_fails_the_start_as_on_pve(tmp_path):
    with pytest.raises(TaskError, match=f"Device {tmp_path}/nvidia9 does not exist"):
        pve_power.read_devices("node", {"dev0": "/dev/null", "dev1": f"{tmp_path}/nvidia9"}, on_this_machine)


def test_each_node_is_made_as_the_node_has_it(tmp_path):
    """A character device with its numbers and mode (the entry's mode wins), a plain file (the simulated GPUs')
    as a plain file."""
    plain = tmp_path / "nvidia0"
    plain.touch(mode=0o640)
    made = dict(
        pve_power.read_devices("node", {"dev0": "/dev/null", "dev1": f"{plain},mode=0666,uid=5"}, on_this_machine)
    )
    major, minor = os.major(os.stat("/dev/null").st_rdev), os.minor(os.stat("/dev/null").st_rdev)
    assert made["/dev/null"] == f"mkdir -p /dev && mknod -m 666 /dev/null c {major} {minor} && chown 0:0 /dev/null"
    assert made[str(plain)] == f"mkdir -p {tmp_path} && : > {plain} && chmod 0666 {plain} && chown 5:0 {plain}"


def test_the_machine_gets_the_nodes_it_lacks_and_then_its_init_runs(tmp_path):
    calls = []

    def machine(*argv):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    pve_power.pass_devices("ct", [("/dev/nvidia0", "MAKE0"), ("/dev/nvidiactl", "MAKE1")], machine)
    (argv,) = calls
    assert argv[:4] == ("exec", "ct", "sh", "-c")
    assert argv[4] == (
        "set -e; [ -e /dev/nvidia0 ] || { MAKE0; }; [ -e /dev/nvidiactl ] || { MAKE1; }; "
        f"touch {pve_power.PRESTART_DONE}"
    )
    assert pve_power.PRESTART_DONE in pve_power.PRESTART_WAIT and "exec /sbin/init" in pve_power.PRESTART_WAIT


def test_a_node_that_cannot_be_made_fails_the_start_before_init_runs(tmp_path):
    def machine(*argv):
        assert argv[:2] == ("exec", "ct")
        return subprocess.run(list(argv[2:]), capture_output=True, text=True, check=False)

    with pytest.raises(TaskError, match="making the device nodes in ct failed"):
        pve_power.pass_devices("ct", [(str(tmp_path / "absent"), "false"), (str(tmp_path / "b"), "true")], machine)
    assert not os.path.exists(pve_power.PRESTART_DONE)
