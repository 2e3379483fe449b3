"""devN and hostpciN entries: validation (fakepve and PVE accept some malformed ones), canonical form, planning."""

import re

import pve_guest_gpu_config
import pytest
from gpu_switch import entries
from gpu_switch.entries import EntryError, canonical_dev, canonical_hostpci, parse_hostpci
from pve_guest_gpu_config import config_text, covers, dev_value, hostpci_value, plan

# --- both kinds: one spelling, and the reason a malformed entry is refused --------------------------------

# devN and hostpciN entries in the spellings PVE accepts, and the one spelling they compare in.
SPELLINGS = [
    ("dev", "/dev/nvidia0", "/dev/nvidia0"),
    ("dev", "path=/dev/nvidia0", "/dev/nvidia0"),
    ("dev", "path=/dev/nvidia0,deny-write=0", "/dev/nvidia0"),
    ("dev", "/dev/nvidia-uvm,mode=0666,gid=044", "/dev/nvidia-uvm,gid=44,mode=0666"),
    ("dev", "/dev/nvidia0,deny-write=yes", "/dev/nvidia0,deny-write=1"),
    ("dev", "/dev/nvidia-caps/nvidia-cap1,deny-write=1,uid=0", "/dev/nvidia-caps/nvidia-cap1,deny-write=1,uid=0"),
    ("hostpci", "0000:01:00,pcie=1", "0000:01:00,pcie=1"),
    ("hostpci", "01:00,pcie=on", "0000:01:00,pcie=1"),
    ("hostpci", "host=0000:01:00.0;0000:01:00.1,pcie=1,x-vga=0", "0000:01:00.0;0000:01:00.1,pcie=1,x-vga=0"),
    ("hostpci", "0000:C1:00,rombar=0,pcie=1", "0000:c1:00,pcie=1,rombar=0"),
    ("hostpci", "mapping=gpu0,pcie=1", "mapping=gpu0,pcie=1"),
    ("hostpci", "0000:01:00,device-id=0x2BB5,driver=keep", "0000:01:00,device-id=0x2bb5,driver=keep"),
]
# Malformed entries by the words of the reason they are refused with.
MALFORMED = [
    ("dev", "is not a device path under /dev/", ["nvidia0", "/dev/../etc/shadow"]),
    ("dev", "is not an octal mode", ["/dev/nvidia0,mode=999", "/dev/nvidia0,mode=666"]),
    ("dev", "is not a non-negative integer", ["/dev/nvidia0,uid=root"]),
    ("dev", "is not a boolean", ["/dev/nvidia0,deny-write=perhaps"]),
    ("dev", "unknown option 'rw'", ["/dev/nvidia0,rw=1"]),
    ("dev", "path given twice", ["/dev/nvidia0,path=/dev/nvidia1"]),
    ("dev", "empty property", ["/dev/nvidia0,,mode=0666"]),
    ("dev", "mode given twice", ["/dev/nvidia0,mode=0666,mode=0644"]),
    ("hostpci", "is not a PCI address", ["0000:1:00,pcie=1", "0000:01:00.9", "10de:2bb5"]),
    ("hostpci", "is not a boolean", ["0000:01:00,pcie=maybe"]),
    ("hostpci", "must be one of vfio, keep", ["0000:01:00,driver=nvidia"]),
    ("hostpci", "unknown option 'vga'", ["0000:01:00,vga=1"]),
    ("hostpci", "is not a file name", ["0000:01:00,romfile=../../etc/passwd"]),
    ("hostpci", "needs exactly one of host= or mapping=", ["pcie=1", "0000:01:00,mapping=gpu0"]),
    ("hostpci", "names a device twice", ["0000:01:00;0000:01:00"]),
    ("hostpci", "is not a hexadecimal id", ["0000:01:00,device-id=xyz", "0000:01:00,device-id=2bb5"]),
]
CANONICAL = {"dev": canonical_dev, "hostpci": canonical_hostpci}
PARSE = {"dev": canonical_dev, "hostpci": parse_hostpci}


@pytest.mark.parametrize(("kind", "value", "canonical"), SPELLINGS)
def test_entries_compare_in_one_spelling(kind, value, canonical):
    assert CANONICAL[kind](value) == canonical


@pytest.mark.parametrize(
    ("kind", "value", "why"), [(kind, value, why) for kind, why, values in MALFORMED for value in values]
)
def test_malformed_entries_are_refused_with_the_reason(kind, value, why):
    with pytest.raises(EntryError, match=re.escape(why)):
        PARSE[kind](value)


# --- devN ---------------------------------------------------------------------------------------------


def test_the_module_validates_with_gpu_switchs_parser():
    # One grammar for the Ansible module and gpu-switch (tests/unit/gpu_switch/test_pve_entries.py).
    assert pve_guest_gpu_config.entries is entries
    with pytest.raises(EntryError, match="is not an octal mode"):
        dev_value({"path": "/dev/nvidia0", "mode": "666"})  # PVE's pattern is 0[0-7]{3}
    with pytest.raises(EntryError, match="is not a PCI address"):
        hostpci_value({"host": "0000:01:20"})  # a device number has 5 bits


def test_dev_value_from_the_role_data():
    assert dev_value({"path": "/dev/nvidia0"}) == "/dev/nvidia0"
    assert dev_value({"path": "/dev/nvidia0", "mode": "0666", "gid": 44, "deny_write": True}) == (
        "/dev/nvidia0,deny-write=1,gid=44,mode=0666"
    )


# --- hostpciN -----------------------------------------------------------------------------------------


def test_hostpci_value_from_the_role_data_defaults_to_all_functions_as_pcie():
    assert hostpci_value({"host": "0000:01:00", "pcie": True}) == "0000:01:00,pcie=1"
    assert hostpci_value({"host": "0000:01:00", "pcie": False, "rombar": False, "driver": "vfio"}) == (
        "0000:01:00,driver=vfio,pcie=0,rombar=0"
    )


@pytest.mark.parametrize(
    ("ids", "address", "covered"),
    [
        (["0000:01:00"], "0000:01:00.1", True),
        (["0000:01:00.0"], "0000:01:00", True),
        (["0000:01:00.0"], "0000:01:00.1", False),
        (["0000:81:00"], "0000:01:00", False),
    ],
)
def test_a_slot_covers_its_functions(ids, address, covered):
    assert covers(ids, address) is covered


# --- planning -----------------------------------------------------------------------------------------


def nvidia(value, raw):
    path = value.split(",")[0] if value else raw
    return path.startswith("/dev/nvidia")


def test_new_entries_take_the_lowest_free_keys_and_others_stay():
    config = {"dev0": "/dev/dri/renderD128", "dev2": "/dev/fuse", "hostname": "ct"}
    updates, deletes, warnings = plan(config, ["/dev/nvidia0", "/dev/nvidiactl"], "dev", nvidia)
    assert updates == {"dev1": "/dev/nvidia0", "dev3": "/dev/nvidiactl"}
    assert deletes == [] and warnings == []


def test_a_right_entry_keeps_its_key_a_changed_one_is_updated_in_place_a_stale_one_goes():
    config = {"dev4": "path=/dev/nvidia0", "dev5": "/dev/nvidia-uvm,mode=0600", "dev6": "/dev/nvidia1"}
    updates, deletes, _ = plan(config, ["/dev/nvidia0", "/dev/nvidia-uvm,mode=0666"], "dev", nvidia)
    assert updates == {"dev5": "/dev/nvidia-uvm,mode=0666"}
    assert deletes == ["dev6"]


def test_a_malformed_entry_of_ours_is_replaced_one_of_others_is_left_with_a_warning():
    config = {"dev0": "/dev/nvidia0,mode=bad", "dev1": "/srv/not-a-device"}
    updates, deletes, warnings = plan(config, ["/dev/nvidia0"], "dev", nvidia)
    assert updates == {"dev2": "/dev/nvidia0"} and deletes == ["dev0"]
    assert "dev0" in warnings[0] and "replacing it" in warnings[0]
    assert "dev1" in warnings[1] and "left as it is" in warnings[1]


def test_a_changed_hostpci_for_the_same_gpu_is_updated_under_its_key():
    def ours(value, raw):
        return "0000:01:00" in (value or raw)

    config = {"hostpci0": "0000:41:00.0,pcie=1", "hostpci3": "0000:01:00.0,x-vga=1"}
    updates, deletes, _ = plan(config, ["0000:01:00,pcie=1"], "hostpci", ours)
    assert updates == {"hostpci3": "0000:01:00,pcie=1"} and deletes == []


def test_no_free_key_is_an_error():
    config = {f"hostpci{i}": f"0000:{i + 16:02x}:00,pcie=1" for i in range(16)}
    with pytest.raises(EntryError, match="no free hostpciN key"):
        plan(config, ["0000:01:00,pcie=1"], "hostpci", lambda v, raw: False)


def test_config_text_orders_keys_numerically_without_the_digest():
    text = config_text({"dev10": "/dev/b", "dev2": "/dev/a", "digest": "abc", "arch": "amd64"})
    assert text == "arch: amd64\ndev2: /dev/a\ndev10: /dev/b\n"
