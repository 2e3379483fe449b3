"""The GPU entries of guest configs: ``hostpciN`` for the VM, ``devN`` for the container.

PVE (and fakepve) accept some malformed strings at config time and fail only at guest start, so every
entry we write, and every existing entry we rely on, is parsed and validated here first.
"""

from __future__ import annotations

import re

from .config import HOSTPCI_OPTION, normalise_bdf

HOSTPCI_KEY = re.compile(r"^hostpci(\d+)$")
DEV_KEY = re.compile(r"^dev(\d+)$")
MAX_HOSTPCI = 16
MAX_DEV = 256
# PVE's HOSTPCIID: [domain:]bus:dev[.func], hexadecimal.
HOSTPCI_ID = re.compile(r"^(?:([0-9a-f]{4,}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?$")
BOOLEAN = {"0", "1", "yes", "no", "on", "off", "true", "false"}
HOSTPCI_OPTIONS = {
    "pcie": "bool",
    "rombar": "bool",
    "x-vga": "bool",
    "legacy-igd": "bool",
    "romfile": "str",
    "mdev": "str",
    "device-id": "hex",
    "vendor-id": "hex",
    "sub-device-id": "hex",
    "sub-vendor-id": "hex",
    "driver": ("vfio", "keep"),
    "host": "ids",
    "mapping": "str",
}
DEV_OPTIONS = {"path", "deny-write", "gid", "uid", "mode"}


class EntryError(ValueError):
    """A malformed hostpciN or devN value; the message says what is wrong."""


def split_props(text: str) -> tuple[str | None, dict[str, str]]:
    first, props = None, {}
    for n, raw in enumerate(str(text).split(",")):
        part = raw.strip()
        if not part:
            raise EntryError(f"empty property in {text!r}")
        key, eq, value = part.partition("=")
        if not eq:
            if n:
                raise EntryError(f"{part!r} in {text!r} is not key=value")
            first = part
            continue
        if key in props:
            raise EntryError(f"{key} given twice in {text!r}")
        props[key] = value
    return first, props


def _hostpci_id(text: str) -> str:
    """The canonical form: domain:bus:slot for all functions, or domain:bus:slot.fn."""
    m = HOSTPCI_ID.match(text.strip().lower())
    if not m:
        raise EntryError(f"{text!r} is not a PCI id ([domain:]bus:slot[.function])")
    domain = (m.group(1) or "0000")[-4:]
    base = f"{domain}:{m.group(2)}:{m.group(3)}"
    return f"{base}.{m.group(4)}" if m.group(4) is not None else base


def parse_hostpci(value: str) -> dict:
    """{'host': [ids], 'mapping': str|None, 'options': {...}}; EntryError if PVE would refuse the value."""
    first, props = split_props(value)
    if first is not None:
        if "host" in props:
            raise EntryError(f"{value!r} names the host device twice")
        props["host"] = first
    for key, val in props.items():
        kind = HOSTPCI_OPTIONS.get(key)
        if kind is None:
            raise EntryError(f"unknown option {key!r} in {value!r}")
        if kind == "bool" and val.lower() not in BOOLEAN:
            raise EntryError(f"{key}={val!r} in {value!r} is not a boolean")
        if kind == "hex" and not re.match(r"^(0x)?[0-9a-fA-F]{1,4}$", val):
            raise EntryError(f"{key}={val!r} in {value!r} is not a hexadecimal id")
        if isinstance(kind, tuple) and val not in kind:
            raise EntryError(f"{key}={val!r} in {value!r} must be one of {', '.join(kind)}")
        if kind == "str" and not val:
            raise EntryError(f"{key} is empty in {value!r}")
    if ("host" in props) == ("mapping" in props):
        raise EntryError(f"{value!r} needs exactly one of host= or mapping=")
    hosts = [_hostpci_id(h) for h in props["host"].split(";")] if "host" in props else []
    return {
        "host": hosts,
        "mapping": props.get("mapping"),
        "options": {k: v for k, v in props.items() if k not in ("host", "mapping")},
    }


def make_hostpci(slot: str, options: str) -> str:
    """The hostpciN value for all functions of a GPU, validated."""
    for option in filter(None, options.split(",")):
        if not HOSTPCI_OPTION.match(option):
            raise EntryError(f"hostpci option {option!r} is not allowed")
    value = ",".join(filter(None, [slot, options]))
    parse_hostpci(value)
    return value


def hostpci_coverage(value: str, slot: str, functions: list[str]) -> str:
    """'all' if the entry passes every function of the GPU in this slot, 'some', or 'none'."""
    ids = parse_hostpci(value)["host"]
    if slot in ids:
        return "all"
    covered = {i for i in ids if normalise_bdf(i) in functions}
    if not covered:
        return "none"
    return "all" if covered == set(functions) else "some"


def parse_dev(value: str) -> dict:
    """{'path': /dev/..., options}; EntryError if PVE would refuse it at container start."""
    first, props = split_props(value)
    if first is not None:
        if "path" in props:
            raise EntryError(f"{value!r} names the path twice")
        props["path"] = first
    unknown = sorted(set(props) - DEV_OPTIONS)
    if unknown:
        raise EntryError(f"unknown option {unknown[0]!r} in {value!r}")
    path = props.get("path", "")
    if not re.match(r"^/dev/[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$", path) or "/../" in path + "/":
        raise EntryError(f"{path!r} in {value!r} is not a device path under /dev/")
    if "deny-write" in props and props["deny-write"] not in ("0", "1"):
        raise EntryError(f"deny-write={props['deny-write']!r} in {value!r} must be 0 or 1")
    for key in ("uid", "gid"):
        if key in props and not props[key].isdigit():
            raise EntryError(f"{key}={props[key]!r} in {value!r} is not a non-negative integer")
    if "mode" in props and not re.fullmatch(r"0[0-7]{3}", props["mode"]):
        raise EntryError(f"mode={props['mode']!r} in {value!r} is not an octal mode such as 0660")
    return props


def make_dev(path: str) -> str:
    parse_dev(path)
    return path


def free_keys(config: dict, pattern: re.Pattern, prefix: str, limit: int, count: int) -> list[str]:
    used = {int(m.group(1)) for k in config if (m := pattern.match(k))}
    free = [f"{prefix}{n}" for n in range(limit) if n not in used][:count]
    if len(free) < count:
        raise EntryError(f"no free {prefix}N key left ({limit} at most)")
    return free


def gpu_entries(kind: str, config: dict, slots: list[str], functions: list[str]) -> dict:
    """The entries of a guest config that concern the GPUs (for status): hostpciN naming them, devN nvidia."""
    out = {}
    for key, value in sorted(config.items()):
        if kind == "qemu" and HOSTPCI_KEY.match(key):
            try:
                ids = parse_hostpci(str(value))["host"]
            except EntryError:
                ids = []
            if any(i in slots or normalise_bdf(i) in functions for i in ids):
                out[key] = value
        elif kind == "lxc" and DEV_KEY.match(key):
            path = str(value).split(",")[0].removeprefix("path=")
            if path.startswith("/dev/nvidia"):
                out[key] = value
    return dict(sorted(out.items(), key=lambda kv: (kv[0].rstrip("0123456789"), int(re.sub(r"\D", "", kv[0])))))
