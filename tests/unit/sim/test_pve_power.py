"""The lab's container machines get their device nodes as LXC makes them from devN entries (sim/pve_power.py)."""

import os
import subprocess
import types

import pytest
from fakepve.model import TaskError

from inferhost.sim import pve_power


def node_rooted_at(root):
    """podman exec NODE ... run here, with the node's paths under root where root has them (else this machine's)."""

    def run(*argv):
        assert argv[:2] == ("exec", "node")
        local = [str(root) + a if a.startswith("/") and os.path.lexists(str(root) + a) else a for a in argv[2:]]
        return subprocess.run(local, capture_output=True, text=True, check=False)

    return run


def test_devn_entries_are_read_in_their_numeric_order_with_their_options():
    config = {"dev10": "/dev/c", "dev1": "path=/dev/b,mode=0600", "dev0": "/dev/a,uid=1000,gid=44", "hostname": "x"}
    assert pve_power.device_entries(config) == [
        {"path": "/dev/a", "uid": "1000", "gid": "44"},
        {"path": "/dev/b", "mode": "0600"},
        {"path": "/dev/c"},
    ]


def test_a_path_the_node_lacks_fails_the_start_as_on_pve(tmp_path):
    with pytest.raises(TaskError, match="Device /dev/inferhost-no-such-node does not exist"):
        pve_power.read_devices(
            "node", {"dev0": "/dev/null", "dev1": "/dev/inferhost-no-such-node"}, node_rooted_at(tmp_path)
        )


def test_each_node_is_made_as_the_node_has_it(tmp_path):
    """A character device with its numbers and mode (the entry's mode wins), a plain file (the simulated GPUs')
    as a plain file."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch(mode=0o640)
    config = {"dev0": "/dev/null", "dev1": "/dev/nvidia0,mode=0666,uid=5"}
    made = dict(pve_power.read_devices("node", config, node_rooted_at(tmp_path)))
    major, minor = os.major(os.stat("/dev/null").st_rdev), os.minor(os.stat("/dev/null").st_rdev)
    assert made["/dev/null"] == f"mkdir -p /dev && mknod -m 666 /dev/null c {major} {minor} && chown 0:0 /dev/null"
    assert (
        made["/dev/nvidia0"] == "mkdir -p /dev && : > /dev/nvidia0 && chmod 0666 /dev/nvidia0 && chown 5:0 /dev/nvidia0"
    )


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


class _Recording(pve_power.Machines):
    def __init__(self, *args):
        super().__init__(*args)
        self.calls = []

    def podman(self, *argv):
        self.calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_a_guests_hookscript_runs_on_its_own_nodes_machine():
    """In a cluster each node runs its own guests' hookscripts: the machine of the guest's node, not another's."""
    machines = _Recording({101: "ct1", 102: "ct2"}, {"pve1": "node1", "pve2": "node2"})
    guest = types.SimpleNamespace(vmid=102, node="pve2", config={"hookscript": "local:snippets/guard"})
    machines.hook(guest, "pre-start")
    assert machines.calls == [("exec", "node2", "/var/lib/vz/snippets/guard", "102", "pre-start")]
    # A guest of a node the lab has no machine for runs no hook (fakepve's own behaviour).
    machines.calls.clear()
    machines.hook(types.SimpleNamespace(vmid=103, node="pve3", config=guest.config), "pre-start")
    assert machines.calls == []
