"""The API client's task waiting and retries (with a scripted proxmoxer stand-in), and our own validation of
hostpciN and devN strings, which fakepve (and PVE at config time) accepts even when malformed."""

from __future__ import annotations

import pytest
from gpu_switch import entries
from gpu_switch.config import ProxmoxConfig
from gpu_switch.errors import ApiError, TaskFailed
from gpu_switch.pve import PveApi


class Resource:
    """proxmoxer's attribute-path object, answering from a script of responses per (method, path)."""

    def __init__(self, script, path=()):
        self.script, self.path = script, path

    def __getattr__(self, name):
        return Resource(self.script, (*self.path, name))

    def __call__(self, *args):
        return Resource(self.script, self.path + tuple(str(a) for a in args))

    def _answer(self, method, **params):
        key = (method, "/".join(self.path))
        self.script.setdefault("calls", []).append((*key, params))
        answers = self.script[key]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def get(self, **params):
        return self._answer("GET", **params)

    def post(self, **params):
        return self._answer("POST", **params)

    def put(self, **params):
        return self._answer("PUT", **params)

    def delete(self, **params):
        return self._answer("DELETE", **params)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


UPID = "UPID:pve1:00001000:00007000:65000000:qmstart:201:root@pam:"
TASK = f"nodes/pve1/tasks/{UPID}/status"


def client(script, clock=None):
    clock = clock or Clock()
    return PveApi(
        ProxmoxConfig(node="pve1"), "secret", clock=clock, sleep=clock.sleep, poll=1.0, factory=lambda: Resource(script)
    )


def test_a_task_that_never_ends_is_a_failure_not_a_none():
    script = {("GET", TASK): [{"status": "running"}], ("DELETE", f"nodes/pve1/tasks/{UPID}"): [None]}
    clock = Clock()
    with pytest.raises(TaskFailed) as err:
        client(script, clock).wait(UPID, 30, "start VM 201")
    assert err.value.exitstatus is None and "task still running after 30 s" in err.value.reason
    assert 30 <= clock.now <= 32
    assert ("DELETE", f"nodes/pve1/tasks/{UPID}", {}) in script["calls"]  # asked PVE to stop it


def test_a_task_that_ends_in_error_carries_its_exit_status():
    script = {("GET", TASK): [{"status": "running"}, {"status": "stopped", "exitstatus": "TASK ERROR: boom"}]}
    with pytest.raises(TaskFailed, match="start VM 201: task failed: TASK ERROR: boom"):
        client(script).wait(UPID, 30, "start VM 201")
    script = {("GET", TASK): [{"status": "stopped"}]}
    with pytest.raises(TaskFailed, match="no exit status"):
        client(script).wait(UPID, 30, "start VM 201")


def test_reads_are_retried_on_network_errors_and_give_up_with_a_reason():
    path = "nodes/pve1/lxc/101/status/current"
    script = {("GET", path): [ConnectionError("reset"), ConnectionError("reset"), {"status": "running"}]}
    assert client(script).status("lxc", 101) == "running"
    script = {("GET", path): [ConnectionError("reset")]}
    with pytest.raises(ApiError, match="unreachable after 5 attempts"):
        client(script).status("lxc", 101)


def test_a_power_action_is_not_repeated_when_it_already_happened():
    script = {
        ("POST", "nodes/pve1/lxc/101/status/shutdown"): [ConnectionError("reset")],
        ("GET", "nodes/pve1/lxc/101/status/current"): [{"status": "stopped"}],
    }
    client(script).act("lxc", 101, "shutdown", "stopped", 60, timeout=60)
    assert [c[0] for c in script["calls"]] == ["POST", "GET"]


def test_a_config_put_lost_on_the_network_is_checked_before_it_is_repeated():
    put, get = ("PUT", "nodes/pve1/qemu/201/config"), ("GET", "nodes/pve1/qemu/201/config")
    script = {put: [ConnectionError("reset")], get: [{"hostpci0": "0000:01:00,pcie=1", "digest": "d2"}]}
    client(script).set_config("qemu", 201, {"hostpci0": "0000:01:00,pcie=1"}, digest="d1")
    assert [c[0] for c in script["calls"]] == ["PUT", "GET"]


# ------------------------------------------------------------------------------- entries


@pytest.mark.parametrize(
    "value",
    [
        "0000:01:00,pcie=1",
        "host=0000:01:00.0;0000:01:00.1,pcie=1,x-vga=1",
        "01:00,rombar=0",
        "mapping=gpu0,pcie=1",
        "0000:01:00,driver=vfio",
    ],
)
def test_valid_hostpci_values(value):
    entries.parse_hostpci(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0000:01:00,pcie=yes-please", "is not a boolean"),
        ("0000:1:00,pcie=1", "is not a PCI id"),
        ("0000:01:00;junk", "'junk' is not a PCI id"),
        ("pcie=1", "needs exactly one of host= or mapping="),
        ("0000:01:00,mapping=gpu0", "needs exactly one of host= or mapping="),
        ("0000:01:00,colour=red", "unknown option 'colour'"),
        ("0000:01:00,,pcie=1", "empty property"),
        ("0000:01:00,pcie=1,pcie=0", "pcie given twice"),
        ("0000:01:00,driver=nouveau", "must be one of vfio, keep"),
    ],
)
def test_malformed_hostpci_values_are_refused(value, message):
    with pytest.raises(entries.EntryError, match=message):
        entries.parse_hostpci(value)


def test_hostpci_coverage_of_a_gpu():
    functions = ["0000:01:00.0", "0000:01:00.1"]
    assert entries.hostpci_coverage("0000:01:00,pcie=1", "0000:01:00", functions) == "all"
    assert entries.hostpci_coverage("0000:01:00.0;0000:01:00.1", "0000:01:00", functions) == "all"
    assert entries.hostpci_coverage("0000:01:00.0", "0000:01:00", functions) == "some"
    assert entries.hostpci_coverage("0000:02:00", "0000:01:00", functions) == "none"
    assert entries.make_hostpci("0000:01:00", "pcie=1") == "0000:01:00,pcie=1"
    with pytest.raises(entries.EntryError):
        entries.make_hostpci("0000:01:00", "pcie=1,args=-foo")


@pytest.mark.parametrize(
    "value", ["/dev/nvidia0", "path=/dev/nvidia-caps/nvidia-cap1,mode=0666", "/dev/nvidiactl,uid=0,gid=44,deny-write=1"]
)
def test_valid_dev_values(value):
    assert entries.parse_dev(value)["path"].startswith("/dev/")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nvidia0", "not a device path under /dev/"),
        ("/dev/../etc/shadow", "not a device path under /dev/"),
        ("/dev/nvidia0,mode=666", "not an octal mode"),
        ("/dev/nvidia0,deny-write=yes", "must be 0 or 1"),
        ("/dev/nvidia0,uid=-1", "not a non-negative integer"),
        ("/dev/nvidia0,rw=1", "unknown option 'rw'"),
    ],
)
def test_malformed_dev_values_are_refused(value, message):
    with pytest.raises(entries.EntryError, match=message):
        entries.parse_dev(value)


def test_free_keys_fill_gaps_and_respect_the_limit():
    assert entries.free_keys({"dev0": "x", "dev2": "y"}, entries.DEV_KEY, "dev", 256, 3) == ["dev1", "dev3", "dev4"]
    with pytest.raises(entries.EntryError, match="no free hostpciN key"):
        entries.free_keys({f"hostpci{n}": "x" for n in range(15)}, entries.HOSTPCI_KEY, "hostpci", 16, 2)


def test_a_missing_ca_file_is_named():
    api = PveApi(ProxmoxConfig(node="pve1", ca_file="/nonexistent/ca.pem"), "secret", sleep=lambda s: None)
    with pytest.raises(ApiError, match="proxmox.ca_file /nonexistent/ca.pem does not exist"):
        api.status("lxc", 101)
