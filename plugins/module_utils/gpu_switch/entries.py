"""The GPU entries of guest configs: ``hostpciN`` for the VM, ``devN`` for the container.

PVE (and fakepve) accept some malformed strings at config time and fail only at guest start, so every
entry we write, and every existing entry we rely on, is parsed and validated here first, by PVE's schema of
the two formats, stricter only where PVE would fail at start anyway. Parsing also brings a value to one
canonical spelling (``canonical_dev``, ``canonical_hostpci``), so that the API's spelling of an entry compares
equal to ours. gpu-switch uses this module, and so does the ``pve_guest_gpu_config`` Ansible module (through
``pve_guest_gpu_config``): one grammar for both. It imports nothing from outside this package, which is
installed on its own as the ``gpu-switch`` command.
"""

from __future__ import annotations

import re

from .config import HOSTPCI_OPTION, normalise_address

HOSTPCI_KEY = re.compile(r"^hostpci(\d+)$")
DEV_KEY = re.compile(r"^dev(\d+)$")
MAX_HOSTPCI = 16  # hostpci0..hostpci15 (qm.conf)
MAX_DEV = 256  # dev0..dev255 (pct.conf)
# PVE's HOSTPCIID: [domain:]bus:device[.function], hexadecimal; without a function, every function. PVE takes
# a domain of four or more digits, and any two digits for the device and one for the function; a device
# number has 5 bits (00-1f) and a function 3 (0-7), so anything beyond fails at VM start.
HOSTPCI_ID = re.compile(r"^(?:([0-9a-f]{4,}):)?([0-9a-f]{2}):([01][0-9a-f])(?:\.([0-7]))?$")
BOOL_TRUE, BOOL_FALSE = {"1", "yes", "on", "true"}, {"0", "no", "off", "false"}  # PVE's, in any case
# hostpciN options: PVE's pve-qm-hostpci format (qemu-server's PCI.pm). A kind names a check in _OPTION_CHECKS, or
# lists the values. driver= came with qemu-server 9.0.25 (PVE 9.1); PVE 8 refuses it itself, at config time.
HOSTPCI_OPTIONS = {
    "host": "ids",
    "mapping": "configid",
    "pcie": "bool",
    "rombar": "bool",
    "x-vga": "bool",
    "legacy-igd": "bool",
    "romfile": "file",
    "mdev": "mdev",
    "driver": ("vfio", "keep"),
    "vendor-id": "hex",
    "device-id": "hex",
    "sub-vendor-id": "hex",
    "sub-device-id": "hex",
}
_OPTION_CHECKS = {
    # PVE's pve-configid format.
    "configid": (re.compile(r"^[A-Za-z][A-Za-z0-9_-]+$"), "a mapping id (a letter, then letters, digits, _ or -)"),
    # PVE takes any text and prefixes /usr/share/kvm/; we take a plain relative file name there.
    "file": (re.compile(r"^[A-Za-z0-9._/-]+$"), "a file name under /usr/share/kvm"),
    # PVE's pattern: anything without '/', '.' or ':'.
    "mdev": (re.compile(r"^[^/.:]+$"), "a mediated device type"),
    # PVE's pattern: 0x and four hexadecimal digits.
    "hex": (re.compile(r"^0x[0-9a-fA-F]{4}$"), "a hexadecimal id such as 0x10de"),
}
# devN: pct.conf's options, in the canonical order (path first, then by name).
DEV_OPTIONS = ("path", "deny-write", "gid", "mode", "uid")
DEV_PATH = re.compile(r"^/dev/[A-Za-z0-9._+-]+(?:/[A-Za-z0-9._+-]+)*$")
DEV_MODE = re.compile(r"^0[0-7]{3}$")  # PVE's pattern: 666 or 0o666 are refused, so is YAML's 0666 as 438


class EntryError(ValueError):
    """A malformed hostpciN or devN value; the message says what is wrong."""


def split_props(text: str, default_key: str) -> dict[str, str]:
    """{key: value} of a PVE property string; a bare first value belongs to ``default_key`` (host=, path=)."""
    props = {}
    for n, raw in enumerate(str(text).split(",")):
        part = raw.strip()
        if not part:
            raise EntryError(f"empty property in {text!r}")
        key, eq, value = part.partition("=")
        if not eq:
            if n:
                raise EntryError(f"{part!r} in {text!r} is not key=value")
            key, value = default_key, part
        if key in props:
            raise EntryError(f"{key} given twice in {text!r}")
        props[key] = value
    return props


def _bool(key: str, value: str, text: str) -> str:
    """'1' or '0' for any of PVE's spellings of a boolean."""
    low = str(value).strip().lower()
    if low in BOOL_TRUE | BOOL_FALSE:
        return "1" if low in BOOL_TRUE else "0"
    raise EntryError(f"{key}={value!r} in {text!r} is not a boolean")


def key_order(key: str) -> tuple[str, int]:
    """Sort key of a config key: dev2 before dev10 (a key without a number first among its name)."""
    m = re.match(r"^(\D+)(\d+)$", key)
    return (m.group(1), int(m.group(2))) if m else (key, -1)


# --- hostpciN -----------------------------------------------------------------------------------------


def hostpci_id(text: str) -> str:
    """The canonical form: domain:bus:slot for all functions, or domain:bus:slot.function."""
    m = HOSTPCI_ID.match(str(text).strip().lower())
    if not m:
        raise EntryError(f"{text!r} is not a PCI address ([domain:]bus:slot[.function], hexadecimal)")
    domain = f"{int(m.group(1) or '0', 16):04x}"
    base = f"{domain}:{m.group(2)}:{m.group(3)}"
    return f"{base}.{m.group(4)}" if m.group(4) is not None else base


def _hostpci_option(key: str, val: str, value: str) -> str:
    """The canonical value of one hostpciN option; EntryError if PVE would refuse it."""
    kind = HOSTPCI_OPTIONS.get(key)
    if kind is None:
        raise EntryError(f"unknown option {key!r} in {value!r}")
    if kind == "ids":
        return val  # parsed by parse_hostpci, id by id
    if kind == "bool":
        return _bool(key, val, value)
    if isinstance(kind, tuple):
        if val not in kind:
            raise EntryError(f"{key}={val!r} in {value!r} must be one of {', '.join(kind)}")
        return val
    pattern, what = _OPTION_CHECKS[kind]
    if not pattern.match(val) or (kind == "file" and ".." in val.split("/")):
        raise EntryError(f"{key}={val!r} in {value!r} is not {what}")
    return val.lower() if kind == "hex" else val


def parse_hostpci(value: str) -> dict:
    """{'host': [ids], 'mapping': str|None, 'options': {...}} in canonical form; EntryError if PVE would refuse
    the value, at config time or at VM start."""
    props = split_props(value, "host")
    options = {key: _hostpci_option(key, val, value) for key, val in props.items()}
    if ("host" in props) == ("mapping" in props):
        raise EntryError(f"{value!r} needs exactly one of host= or mapping=")
    hosts = [hostpci_id(h) for h in props["host"].split(";")] if "host" in props else []
    if len(set(hosts)) != len(hosts):
        raise EntryError(f"{value!r} names a device twice")
    for key in ("host", "mapping"):
        options.pop(key, None)
    return {"host": hosts, "mapping": props.get("mapping"), "options": options}


def format_hostpci(parsed: dict) -> str:
    head = ";".join(parsed["host"]) if parsed["host"] else f"mapping={parsed['mapping']}"
    return ",".join([head] + [f"{k}={parsed['options'][k]}" for k in sorted(parsed["options"])])


def canonical_hostpci(value: str) -> str:
    return format_hostpci(parse_hostpci(value))


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
    covered = {i for i in ids if normalise_address(i) in functions}
    if not covered:
        return "none"
    return "all" if covered == set(functions) else "some"


# --- PCI resource mappings ---------------------------------------------------------------------------

# One node's entry of a cluster PCI mapping (/cluster/mapping/pci): PVE's map format, in the order we write it.
MAPPING_ENTRY_KEYS = ("node", "path", "id", "subsystem-id", "iommugroup", "description")
MAPPING_PATH = re.compile(r"^[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?$")
MAPPING_HEX_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")


def parse_mapping_entry(text: str) -> dict:
    """{'node', 'path', 'id', ...} of one map entry, ids lower case without 0x; EntryError if PVE would refuse it."""
    props = split_props(text, "node")
    unknown = sorted(set(props) - set(MAPPING_ENTRY_KEYS))
    if unknown:
        raise EntryError(f"unknown property {unknown[0]!r} in mapping entry {text!r}")
    for key in ("node", "path", "id"):
        if not props.get(key):
            raise EntryError(f"mapping entry {text!r} has no {key}")
    paths = props["path"].lower().split(";")
    if not all(MAPPING_PATH.match(p) for p in paths):
        raise EntryError(f"path {props['path']!r} in mapping entry {text!r} is not a PCI address list")
    out = {"node": props["node"], "path": ";".join(paths)}
    for key in ("id", "subsystem-id"):
        if key in props:
            value = props[key].lower().replace("0x", "")
            if not MAPPING_HEX_ID.match(value):
                raise EntryError(
                    f"{key}={props[key]!r} in mapping entry {text!r} is not vendor:device such as 10de:2335"
                )
            out[key] = value
    if "iommugroup" in props:
        if not re.fullmatch(r"-?[0-9]+", props["iommugroup"]):
            raise EntryError(f"iommugroup={props['iommugroup']!r} in mapping entry {text!r} is not an integer")
        out["iommugroup"] = str(int(props["iommugroup"]))
    if props.get("description"):
        out["description"] = props["description"]
    return out


def format_mapping_entry(parsed: dict) -> str:
    return ",".join(f"{k}={parsed[k]}" for k in MAPPING_ENTRY_KEYS if parsed.get(k) not in (None, ""))


def canonical_mapping_entry(text: str) -> str:
    return format_mapping_entry(parse_mapping_entry(text))


def mapped_ids(mappings: list[dict], node: str) -> dict[str, list[str]]:
    """{mapping id: the PCI ids its entries for node pass} from GET /cluster/mapping/pci; malformed entries skipped."""
    out = {}
    for mapping in mappings:
        ids = []
        for text in mapping.get("map") or []:
            try:
                entry = parse_mapping_entry(str(text))
            except EntryError:
                continue
            if entry["node"] == node:
                ids += [hostpci_id(p) for p in entry["path"].split(";")]
        if ids:
            out[str(mapping.get("id"))] = ids
    return out


# --- devN ---------------------------------------------------------------------------------------------


def parse_dev(value: str) -> dict:
    """{'path', 'deny-write', 'gid', 'mode', 'uid'} in canonical form, absent options (and deny-write off)
    left out; EntryError if PVE would refuse it, at config time or at container start."""
    props = split_props(value, "path")
    unknown = sorted(set(props) - set(DEV_OPTIONS))
    if unknown:
        raise EntryError(f"unknown option {unknown[0]!r} in {value!r} (allowed: {', '.join(DEV_OPTIONS)})")
    path = props.get("path", "")
    # PVE refuses . and .. as path components; the character set is ours.
    if not DEV_PATH.match(path) or {".", ".."} & set(path.split("/")):
        raise EntryError(f"{path!r} in {value!r} is not a device path under /dev/")
    out = {"path": path}
    if "mode" in props:
        if not DEV_MODE.match(props["mode"]):
            raise EntryError(f"mode={props['mode']!r} in {value!r} is not an octal mode such as 0666")
        out["mode"] = props["mode"]
    for key in ("uid", "gid"):
        if key in props:
            if not re.match(r"^\d+$", props[key]):
                raise EntryError(f"{key}={props[key]!r} in {value!r} is not a non-negative integer")
            out[key] = str(int(props[key]))
    if "deny-write" in props and _bool("deny-write", props["deny-write"], value) == "1":
        out["deny-write"] = "1"  # PVE leaves the flag out when it is off
    return out


def format_dev(parsed: dict) -> str:
    return ",".join([parsed["path"]] + [f"{k}={parsed[k]}" for k in DEV_OPTIONS[1:] if k in parsed])


def canonical_dev(value: str) -> str:
    return format_dev(parse_dev(value))


def make_dev(path: str) -> str:
    parse_dev(path)
    return path


# --- keys ---------------------------------------------------------------------------------------------


def free_keys(config: dict, pattern: re.Pattern, prefix: str, limit: int, count: int) -> list[str]:
    """The ``count`` lowest keys prefix0..prefix<limit-1> that ``config`` does not use; EntryError if too few."""
    used = {int(m.group(1)) for k in config if (m := pattern.match(k))}
    free = [f"{prefix}{n}" for n in range(limit) if n not in used][:count]
    if len(free) < count:
        raise EntryError(
            f"no free {prefix}N key left for {count} more entries (PVE allows {prefix}0-{prefix}{limit - 1})"
        )
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
            if any(i in slots or normalise_address(i) in functions for i in ids):
                out[key] = value
        elif kind == "lxc" and DEV_KEY.match(key):
            path = str(value).split(",")[0].removeprefix("path=")
            if path.startswith("/dev/nvidia"):
                out[key] = value
    return dict(sorted(out.items(), key=lambda kv: key_order(kv[0])))
