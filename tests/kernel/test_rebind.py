"""gpu-switch's sysfs code against a real kernel: IOMMU groups, per-address rebinding to vfio-pci and back.

The package is copied into the machine as it is and driven there with the machine's own Python; the
"GPU" is the twin of the management NIC (same vendor:device id), so a rebinding by id instead of by
address would take the management NIC too and cut this very ssh connection.
"""

import json
import shlex

import pytest

from .conftest import MGMT_MAC, TWIN_MAC

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def machine(vm):
    vm.put_gpu_switch("/opt/inferhost")
    vm.check("modprobe vfio-pci")
    return vm


def py(vm, code: str) -> dict:
    """Run code with gpu_switch importable; it prints one JSON object."""
    prelude = "import json, sys; sys.path.insert(0, '/opt/inferhost'); from gpu_switch import pci, rebind, writer\n"
    return json.loads(vm.check(f"python3 -c {shlex.quote(prelude + code)}"))


def test_the_iommu_is_on_and_each_function_has_its_own_group(machine):
    twin, mgmt = machine.address_of_mac(TWIN_MAC), machine.address_of_mac(MGMT_MAC)
    e1000 = machine.address_of_id("0x8086", "0x100e")
    addresses = [twin, mgmt, e1000]
    got = py(
        machine,
        f"s = pci.Sysfs('/sys'); addresses = {addresses!r}\n"
        "print(json.dumps({'on': s.iommu_enabled(), 'groups': {a: s.iommu_group(a) for a in addresses},"
        " 'members': {a: s.group_members(s.iommu_group(a)) for a in addresses}}))",
    )
    assert got["on"] is True
    assert len(set(got["groups"].values())) == 3, got
    for address, members in got["members"].items():
        assert members == [address], f"{address} shares its IOMMU group: {members}"


def test_rebinding_by_address_moves_the_twin_and_leaves_the_management_nic(machine):
    twin, mgmt = machine.address_of_mac(TWIN_MAC), machine.address_of_mac(MGMT_MAC)
    assert machine.driver(twin) == machine.driver(mgmt) == "virtio-pci"
    got = py(
        machine,
        "s = pci.Sysfs('/sys'); r = rebind.Rebinder(s, writer.ProcessWriter(), timeout=20)\n"
        f"changed = r.bind({twin!r}, 'vfio-pci', final_override='vfio-pci')\n"
        f"print(json.dumps({{'changed': changed, 'driver': s.driver({twin!r}), 'override': s.override({twin!r}),"
        f" 'group': s.iommu_group({twin!r})}}))",
    )
    assert got["changed"] is True
    assert got["driver"] == "vfio-pci" and got["override"] == "vfio-pci"
    machine.check(f"test -c /dev/vfio/{got['group']}")
    assert machine.driver(mgmt) == "virtio-pci"

    again = py(
        machine,
        "s = pci.Sysfs('/sys'); r = rebind.Rebinder(s, writer.ProcessWriter(), timeout=20)\n"
        f"print(json.dumps({{'changed': r.bind({twin!r}, 'vfio-pci', final_override='vfio-pci')}}))",
    )
    assert again["changed"] is False, "binding to the driver it already has must change nothing"

    back = py(
        machine,
        "s = pci.Sysfs('/sys'); r = rebind.Rebinder(s, writer.ProcessWriter(), timeout=20)\n"
        f"changed = r.release({twin!r}, away_from='vfio-pci')\n"
        f"print(json.dumps({{'changed': changed, 'driver': s.driver({twin!r}), 'override': s.override({twin!r})}}))",
    )
    assert back == {"changed": True, "driver": "virtio-pci", "override": None}
    machine.check(f"test ! -e /dev/vfio/{got['group']}")


def test_an_unloaded_driver_is_named_in_the_error(machine):
    e1000 = machine.address_of_id("0x8086", "0x100e")
    out = machine.ssh(
        "python3 -c "
        + shlex.quote(
            "import sys; sys.path.insert(0, '/opt/inferhost'); from gpu_switch import pci, rebind, writer\n"
            "s = pci.Sysfs('/sys'); r = rebind.Rebinder(s, writer.ProcessWriter(), timeout=20)\n"
            f"r.bind({e1000!r}, 'no_such_driver')"
        )
    )
    assert out.returncode != 0
    assert b"no_such_driver is not loaded" in out.stderr
    # The refusal must leave the function usable: put it back on its own driver.
    machine.check(f"echo > /sys/bus/pci/devices/{e1000}/driver_override; echo {e1000} > /sys/bus/pci/drivers_probe")
    assert machine.driver(e1000) == "e1000"


def test_the_e1000_moves_to_vfio_pci_and_back(machine):
    e1000 = machine.address_of_id("0x8086", "0x100e")
    code = (
        "s = pci.Sysfs('/sys'); r = rebind.Rebinder(s, writer.ProcessWriter(), timeout=20)\n"
        f"a = r.bind({e1000!r}, 'vfio-pci', final_override='vfio-pci'); mid = s.driver({e1000!r})\n"
        f"b = r.release({e1000!r}, away_from='vfio-pci')\n"
        f"print(json.dumps({{'there': [a, mid], 'back': [b, s.driver({e1000!r}), s.override({e1000!r})]}}))"
    )
    assert py(machine, code) == {"there": [True, "vfio-pci"], "back": [True, "e1000", None]}


def test_the_proc_scan_names_a_process_holding_a_device_node(machine):
    # A stand-in /dev/nvidia0 (the null device's numbers) held open by a real process of the real kernel.
    machine.check("mknod -m 666 /dev/nvidia0 c 1 3 && (setsid sleep 600 < /dev/nvidia0 > /dev/null 2>&1 &)")
    try:
        pid = int(machine.check("pgrep -x -n sleep").strip())
        got = py(
            machine,
            "from gpu_switch import holders\n"
            "print(json.dumps([[h.pid, h.command, h.path] for h in holders.find_holders('/proc')]))",
        )
        assert [pid, "sleep", "/dev/nvidia0"] in [[p, c.split()[0], path] for p, c, path in got], got
    finally:
        machine.ssh("pkill -x sleep; rm -f /dev/nvidia0")
