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
    ("value", "parsed", "canonical"),
    [
        ("0000:01:00,pcie=1", (["0000:01:00"], None, {"pcie": "1"}), "0000:01:00,pcie=1"),
        (
            "host=0000:01:00.0;0000:01:00.1,pcie=1,x-vga=1",
            (["0000:01:00.0", "0000:01:00.1"], None, {"pcie": "1", "x-vga": "1"}),
            "0000:01:00.0;0000:01:00.1,pcie=1,x-vga=1",
        ),
        ("01:00,rombar=0", (["0000:01:00"], None, {"rombar": "0"}), "0000:01:00,rombar=0"),
        ("mapping=gpu0,pcie=1", ([], "gpu0", {"pcie": "1"}), "mapping=gpu0,pcie=1"),
        # driver= is qemu-server's since 9.0.25 (PVE 9.1): vfio (the default) or keep.
        ("0000:01:00,driver=vfio", (["0000:01:00"], None, {"driver": "vfio"}), "0000:01:00,driver=vfio"),
        (
            "0000:01:00,driver=keep,pcie=on,device-id=0x2BB5",
            (["0000:01:00"], None, {"driver": "keep", "pcie": "1", "device-id": "0x2bb5"}),
            "0000:01:00,device-id=0x2bb5,driver=keep,pcie=1",
        ),
    ],
)
def test_valid_hostpci_values(value, parsed, canonical):
    hosts, mapping, options = parsed
    assert entries.parse_hostpci(value) == {"host": hosts, "mapping": mapping, "options": options}
    assert entries.canonical_hostpci(value) == canonical


# Malformed values of both kinds, each with the words it is refused with.
@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        ("hostpci", "0000:01:00,pcie=yes-please", "is not a boolean"),
        ("hostpci", "0000:1:00,pcie=1", "is not a PCI address"),
        ("hostpci", "0000:01:00;junk", "'junk' is not a PCI address"),
        ("hostpci", "pcie=1", "needs exactly one of host= or mapping="),
        ("hostpci", "0000:01:00,mapping=gpu0", "needs exactly one of host= or mapping="),
        ("hostpci", "0000:01:00,colour=red", "unknown option 'colour'"),
        ("hostpci", "0000:01:00,,pcie=1", "empty property"),
        ("hostpci", "0000:01:00,pcie=1,pcie=0", "pcie given twice"),
        ("hostpci", "0000:01:00,driver=nouveau", "must be one of vfio, keep"),
        ("dev", "nvidia0", "not a device path under /dev/"),
        ("dev", "/dev/../etc/shadow", "not a device path under /dev/"),
        ("dev", "/dev/nvidia0,mode=666", "not an octal mode"),
        ("dev", "/dev/nvidia0,deny-write=perhaps", "is not a boolean"),
        ("dev", "/dev/nvidia0,uid=-1", "not a non-negative integer"),
        ("dev", "/dev/nvidia0,rw=1", "unknown option 'rw'"),
    ],
)
def test_malformed_values_are_refused(kind, value, message):
    parse = entries.parse_hostpci if kind == "hostpci" else entries.parse_dev
    with pytest.raises(entries.EntryError, match=message):
        parse(value)


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
    "value",
    [
        "/dev/nvidia0",
        "path=/dev/nvidia-caps/nvidia-cap1,mode=0666",
        "/dev/nvidiactl,uid=0,gid=44,deny-write=1",
        "/dev/nvidiactl,deny-write=yes",
    ],
)
def test_valid_dev_values(value):
    assert entries.parse_dev(value)["path"].startswith("/dev/")


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        # PVE's domain has four digits or more: a longer one (Intel VMD) stays whole, leading zeros go.
        ("10000:01:00,pcie=1", "10000:01:00,pcie=1"),
        ("00000:01:00.0", "0000:01:00.0"),
        # Booleans in any of PVE's spellings, hexadecimal ids in PVE's 0x form, written in lower case.
        ("01:00,pcie=ON,rombar=no", "0000:01:00,pcie=1,rombar=0"),
        ("0000:01:00,vendor-id=0x10DE,sub-device-id=0x2bb5", "0000:01:00,sub-device-id=0x2bb5,vendor-id=0x10de"),
        ("mapping=gpu_0,mdev=nvidia-63", "mapping=gpu_0,mdev=nvidia-63"),
        # A devN's deny-write takes PVE's boolean spellings too, and is left out when off, as PVE writes it.
        ("/dev/nvidia0,deny-write=yes,uid=007", "/dev/nvidia0,deny-write=1,uid=7"),
        ("path=/dev/nvidia0,deny-write=off,mode=0660", "/dev/nvidia0,mode=0660"),
        # Values PVE (or fakepve) accepts at config time and fails on at guest start, or refuses outright.
        ("0000:01:20", "is not a PCI address"),  # a device number has 5 bits: 00-1f
        ("0000:01:00.8", "is not a PCI address"),  # a function has 3 bits: 0-7
        ("0000:01:00;0000:01:00.0;0000:01:00", "names a device twice"),
        ("0000:01:00,vendor-id=10de", "is not a hexadecimal id"),  # PVE's pattern is ^0x[0-9a-fA-F]{4}$
        ("mapping=9gpu", "is not a mapping id"),  # pve-configid starts with a letter
        ("mapping=gpu.0", "is not a mapping id"),
        ("0000:01:00,mdev=nvidia.63", "is not a mediated device type"),  # PVE refuses '/', '.' and ':'
        ("0000:01:00,romfile=../../etc/passwd", "is not a file name under /usr/share/kvm"),
        ("/dev/nvidia0,mode=666", "is not an octal mode"),  # PVE's pattern is 0[0-7]{3}
        ("/dev/nvidia0,mode=438", "is not an octal mode"),  # YAML's unquoted 0666, read as a number
        ("/dev/./nvidia0", "is not a device path under /dev/"),  # PVE refuses . and .. components
        ("/dev/nvidia-caps/..", "is not a device path under /dev/"),
    ],
)
def test_one_grammar_for_gpu_switch_and_the_ansible_module(value, canonical):
    """gpu-switch and pve_guest_gpu_config share this parser: one canonical form, one set of refusals."""
    canonical_of = entries.canonical_dev if value.startswith(("/", "path=")) else entries.canonical_hostpci
    if canonical.startswith("is not") or canonical.startswith("names"):
        with pytest.raises(entries.EntryError, match=canonical):
            canonical_of(value)
    else:
        assert canonical_of(value) == canonical
        assert canonical_of(canonical) == canonical, "the canonical form is a fixed point"


def test_free_keys_fill_gaps_and_respect_the_limit():
    assert entries.free_keys({"dev0": "x", "dev2": "y"}, entries.DEV_KEY, "dev", 256, 3) == ["dev1", "dev3", "dev4"]
    with pytest.raises(entries.EntryError, match="no free hostpciN key"):
        entries.free_keys({f"hostpci{n}": "x" for n in range(15)}, entries.HOSTPCI_KEY, "hostpci", 16, 2)


def test_a_missing_ca_file_is_named():
    api = PveApi(ProxmoxConfig(node="pve1", ca_file="/nonexistent/ca.pem"), "secret", sleep=lambda s: None)
    with pytest.raises(ApiError, match="proxmox.ca_file /nonexistent/ca.pem does not exist"):
        api.status("lxc", 101)
