"""Reading sysfs, the simulated kernel's strictness, the rebinder and the sysfs writers."""

from __future__ import annotations

import errno
import os
import time

import pytest
from gpu_switch.config import parse_config
from gpu_switch.errors import ConfigError, RebindError, WriteTimeout
from gpu_switch.pci import Sysfs, discover, foreign_group_members, nvidia_device_paths
from gpu_switch.rebind import Rebinder
from gpu_switch.writer import ProcessWriter
from gpu_switch_rig import NODES_OF_TWO_GPUS

from inferhost.sim.gpu_api import ThreadWriter
from inferhost.sim.gpu_kernel import FakeKernel


def test_discover_reads_functions_groups_numa_and_drivers(make_rig):
    rig = make_rig(gpus=2, functions=4)
    gpus = discover(rig.config, Sysfs(rig.sysfs))
    assert [g.address for g in gpus] == ["0000:01:00.0", "0000:02:00.0"]
    first = gpus[0]
    assert [f.address for f in first.functions] == [f"0000:01:00.{n}" for n in range(4)]
    assert [f.driver for f in first.functions] == ["nvidia", "snd_hda_intel", "xhci_hcd", None]
    assert (first.iommu_group, first.numa_node, gpus[1].numa_node) == (1, 0, 1)
    assert first.slot == "0000:01:00"
    assert first.as_dict()["functions"][1] == {"address": "0000:01:00.1", "driver": "snd_hda_intel"}


def test_gpu_match_finds_the_gpus_by_vendor_and_class(make_rig):
    rig = make_rig(gpus=3)
    data = dict(rig.data)
    data.pop("gpus")
    data["gpu_match"] = {"vendor": "0x10de", "class": "0x0300"}
    gpus = discover(parse_config(data, environ={}), Sysfs(rig.sysfs))
    assert [g.address for g in gpus] == rig.addresses


def test_a_configured_gpu_that_does_not_exist_is_a_config_error(make_rig):
    rig = make_rig(gpus=1)
    data = dict(rig.data, gpus=["0000:09:00.0"])
    with pytest.raises(ConfigError, match="no PCI device 0000:09:00.0"):
        discover(parse_config(data, environ={}), Sysfs(rig.sysfs))
    data = dict(rig.data, gpus=["0000:01:00.0", "0000:01:00.1"])
    with pytest.raises(ConfigError, match="0000:01:00.1 is a function of GPU 0000:01:00.0"):
        discover(parse_config(data, environ={}), Sysfs(rig.sysfs))


def test_foreign_group_members_ignore_bridges(make_rig):
    rig = make_rig(gpus=1)
    rig.kernel.add_device("0000:00:01.0", pci_class="0x060400", group=1, native="pcieport")
    sysfs = Sysfs(rig.sysfs)
    assert foreign_group_members(discover(rig.config, sysfs), sysfs) == []
    rig.kernel.add_device(
        "0000:05:00.0", vendor="0x1b21", pci_class="0x0c0330", group=1, native="xhci_hcd", driver="xhci_hcd"
    )
    gpus = discover(rig.config, sysfs)
    assert [m for _, m in foreign_group_members(gpus, sysfs)] == ["0000:05:00.0"]


def test_device_paths_come_from_the_proc_minors_and_leave_other_gpus_out(make_rig):
    rig = make_rig(gpus=3)
    rig.make_node("nvidia-caps/nvidia-cap1")
    data = dict(rig.data, gpus=rig.addresses[:2])
    gpus = discover(parse_config(data, environ={}), Sysfs(rig.sysfs))
    paths, missing = nvidia_device_paths(gpus, rig.proc, rig.dev)
    assert paths == NODES_OF_TWO_GPUS
    assert missing == []


# ---------------------------------------------------------------- the simulator is as strict as the kernel


@pytest.fixture
def kernel(tmp_path):
    k = FakeKernel.create(str(tmp_path / "sys"), str(tmp_path / "proc"), str(tmp_path / "dev"))
    for driver in ("nvidia", "vfio-pci", "snd_hda_intel"):
        k.add_driver(driver)
    k.add_gpu(1, minor=0)
    return k


def path(kernel, *parts):
    return os.path.join(kernel.root, *parts)


def test_unbind_of_a_function_not_bound_to_that_driver_fails_like_the_kernel(kernel):
    with pytest.raises(OSError) as err:
        kernel.write(path(kernel, "bus/pci/drivers/vfio-pci/unbind"), "0000:01:00.0")
    assert err.value.errno == errno.ENODEV
    kernel.write(path(kernel, "bus/pci/drivers/nvidia/unbind"), "0000:01:00.0")
    assert kernel.driver_of("0000:01:00.0") is None
    assert not os.path.exists(path(kernel, "bus/pci/devices/0000:01:00.0/driver"))
    with pytest.raises(OSError) as err:
        kernel.write(path(kernel, "bus/pci/devices/0000:01:00.0/driver/unbind"), "0000:01:00.0")
    assert err.value.errno == errno.ENOENT


def test_drivers_probe_honours_driver_override(kernel):
    address = "0000:01:00.0"
    kernel.write(path(kernel, f"bus/pci/devices/{address}/driver_override"), "vfio-pci\n")
    assert kernel.driver_of(address) == "nvidia"  # writing the override does not unbind
    kernel.write(path(kernel, "bus/pci/drivers/nvidia/unbind"), address)
    kernel.write(path(kernel, "bus/pci/drivers_probe"), address)
    assert kernel.driver_of(address) == "vfio-pci"
    assert not os.path.exists(os.path.join(kernel.proc, "driver/nvidia/gpus", address))
    kernel.write(path(kernel, "bus/pci/drivers/vfio-pci/unbind"), address)
    kernel.write(path(kernel, f"bus/pci/devices/{address}/driver_override"), "\n")
    kernel.write(path(kernel, "bus/pci/drivers_probe"), address)
    assert kernel.driver_of(address) == "nvidia"
    assert os.path.exists(os.path.join(kernel.proc, "driver/nvidia/gpus", address, "information"))


def test_bind_of_an_unknown_or_unmatched_device_fails(kernel):
    with pytest.raises(OSError) as err:
        kernel.write(path(kernel, "bus/pci/drivers/vfio-pci/bind"), "0000:09:00.0")
    assert err.value.errno == errno.ENODEV
    with pytest.raises(OSError) as err:
        kernel.write(path(kernel, "bus/pci/drivers/vfio-pci/bind"), "0000:01:00.0")
    assert err.value.errno == errno.EBUSY
    kernel.write(path(kernel, "bus/pci/drivers/nvidia/unbind"), "0000:01:00.0")
    with pytest.raises(OSError) as err:  # no override: vfio-pci does not match an NVIDIA id
        kernel.write(path(kernel, "bus/pci/drivers/vfio-pci/bind"), "0000:01:00.0")
    assert err.value.errno == errno.ENODEV
    with pytest.raises(OSError) as err:
        kernel.write(path(kernel, "bus/pci/drivers_probe"), "0000:09:00.0")
    assert err.value.errno == errno.ENODEV


def test_new_id_is_refused_so_nothing_ever_binds_by_vendor_id(kernel):
    with pytest.raises(OSError) as err:
        kernel.write(path(kernel, "bus/pci/drivers/vfio-pci/new_id"), "10de 2bb5")
    assert err.value.errno == errno.EPERM


def test_a_hung_path_blocks_and_the_thread_writer_gives_up(kernel):
    kernel.hang("bus/pci/drivers/nvidia/unbind")
    writer = ThreadWriter(kernel.write)
    start = time.monotonic()
    with pytest.raises(WriteTimeout, match="did not return within 0.2 s"):
        writer.write(path(kernel, "bus/pci/drivers/nvidia/unbind"), "0000:01:00.0", 0.2)
    assert time.monotonic() - start < 2
    assert kernel.driver_of("0000:01:00.0") == "nvidia"


# ---------------------------------------------------------------- the rebinder


def test_rebinder_moves_one_function_by_address_and_restores_it(kernel):
    sysfs = Sysfs(kernel.root)
    seen = []
    rebinder = Rebinder(sysfs, ThreadWriter(kernel.write), 1.0, lambda address, p, v: seen.append(os.path.basename(p)))
    assert rebinder.bind("0000:01:00.1", "vfio-pci", "vfio-pci") is True
    assert (sysfs.driver("0000:01:00.1"), sysfs.override("0000:01:00.1")) == ("vfio-pci", "vfio-pci")
    assert sysfs.driver("0000:01:00.0") == "nvidia"  # the twin function was not touched
    assert seen == ["driver_override", "unbind", "drivers_probe"]
    assert rebinder.bind("0000:01:00.1", "vfio-pci", "vfio-pci") is False
    rebinder.restore("0000:01:00.1", "snd_hda_intel", None)
    assert (sysfs.driver("0000:01:00.1"), sysfs.override("0000:01:00.1")) == ("snd_hda_intel", None)
    assert not any("new_id" in p for p, _ in kernel.writes)


def test_release_lets_the_kernel_pick_the_native_driver(kernel):
    sysfs = Sysfs(kernel.root)
    rebinder = Rebinder(sysfs, ThreadWriter(kernel.write), 1.0)
    rebinder.bind("0000:01:00.1", "vfio-pci", "vfio-pci")
    assert rebinder.release("0000:01:00.1", "vfio-pci") is True
    assert sysfs.driver("0000:01:00.1") == "snd_hda_intel"


def test_rebinder_reports_a_driver_that_is_not_loaded(kernel):
    kernel.remove_driver("vfio-pci")
    rebinder = Rebinder(Sysfs(kernel.root), ThreadWriter(kernel.write), 1.0)
    with pytest.raises(RebindError, match="bound to no driver after drivers_probe, expected vfio-pci"):
        rebinder.bind("0000:01:00.1", "vfio-pci")


def test_process_writer_writes_reports_errno_and_times_out(tmp_path):
    writer = ProcessWriter()
    target = tmp_path / "attr"
    target.write_text("")
    writer.write(str(target), "vfio-pci\n", 10)
    assert target.read_text() == "vfio-pci\n"
    with pytest.raises(OSError) as err:
        writer.write(str(tmp_path / "missing" / "attr"), "x", 10)
    assert err.value.errno == errno.ENOENT
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening a FIFO for writing with no reader blocks, like a stuck unbind
    start = time.monotonic()
    with pytest.raises(WriteTimeout):
        writer.write(str(fifo), "0000:01:00.0", 0.5)
    assert time.monotonic() - start < 5
