"""The GPU entries of Proxmox guest configs: a container's ``devN`` and a VM's ``hostpciN``.

Pure functions, no Ansible and no API: parse and validate entries (PVE, and fakepve in tests, accept some
malformed ``hostpciN`` strings and bare ``devN`` paths at config time and fail only at guest start), bring
them to one canonical spelling so that the API's spelling of an entry compares equal to ours, and plan the
smallest config update that makes the guest carry exactly the wanted GPU entries while every other line of
its config stays as it is.
"""

from __future__ import annotations

import re

DEV_KEY = re.compile(r"^dev(\d+)$")
HOSTPCI_KEY = re.compile(r"^hostpci(\d+)$")
MAX_DEV = 256  # dev0..dev255 (pct.conf)
MAX_HOSTPCI = 16  # hostpci0..hostpci15 (qm.conf)
DEV_PATH = re.compile(r"^/dev/[A-Za-z0-9._+-]+(?:/[A-Za-z0-9._+-]+)*$")
DEV_OPTIONS = ("path", "deny-write", "gid", "mode", "uid")
# PVE's HOSTPCIID: [domain:]bus:device[.function], hexadecimal; without a function, every function.
HOSTPCI_ID = re.compile(r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-1][0-9a-f])(?:\.([0-7]))?$")
BOOL_TRUE, BOOL_FALSE = {"1", "yes", "on", "true"}, {"0", "no", "off", "false"}
HOSTPCI_OPTIONS = {
    "host": "ids",
    "mapping": "name",
    "pcie": "bool",
    "rombar": "bool",
    "x-vga": "bool",
    "legacy-igd": "bool",
    "romfile": "file",
    "mdev": "name",
    "driver": ("vfio", "keep"),
    "vendor-id": "hex",
    "device-id": "hex",
    "sub-vendor-id": "hex",
    "sub-device-id": "hex",
}


class EntryError(ValueError):
    """A malformed devN or hostpciN value; the message says what is wrong."""


def split_props(text):
    """(first bare value or None, {key: value}) of a PVE property string; EntryError on a malformed one."""
    first, props = None, {}
    for n, part in enumerate(str(text).split(",")):
        if not part.strip():
            raise EntryError(f"empty property in {text!r}")
        key, eq, value = part.strip().partition("=")
        if not eq:
            if n:
                raise EntryError(f"{part!r} in {text!r} is not key=value")
            first = key
            continue
        if key in props:
            raise EntryError(f"{key} given twice in {text!r}")
        props[key] = value
    return first, props


def _bool(key, value, text):
    v = str(value).strip().lower()
    if v in BOOL_TRUE:
        return "1"
    if v in BOOL_FALSE:
        return "0"
    raise EntryError(f"{key}={value!r} in {text!r} is not a boolean")


# --- devN ---------------------------------------------------------------------------------------------


def parse_dev(value):
    """{'path', 'mode', 'uid', 'gid', 'deny-write'} (absent options omitted); EntryError if PVE would refuse it."""
    first, props = split_props(value)
    if first is not None:
        if "path" in props:
            raise EntryError(f"{value!r} names the path twice")
        props["path"] = first
    unknown = sorted(set(props) - set(DEV_OPTIONS))
    if unknown:
        raise EntryError(f"unknown option {unknown[0]!r} in {value!r} (allowed: {', '.join(DEV_OPTIONS)})")
    path = props.get("path", "")
    if not DEV_PATH.match(path) or "/../" in path + "/" or "/./" in path + "/":
        raise EntryError(f"{path!r} in {value!r} is not a device path under /dev/")
    out = {"path": path}
    if "mode" in props:
        if not re.match(r"^0?[0-7]{3}$", props["mode"]):
            raise EntryError(f"mode={props['mode']!r} in {value!r} is not an octal mode such as 0666")
        out["mode"] = "0" + props["mode"][-3:]
    for key in ("uid", "gid"):
        if key in props:
            if not re.match(r"^\d+$", props[key]):
                raise EntryError(f"{key}={props[key]!r} in {value!r} is not a number")
            out[key] = str(int(props[key]))
    if "deny-write" in props and _bool("deny-write", props["deny-write"], value) == "1":
        out["deny-write"] = "1"  # PVE omits the flag when it is off
    return out


def format_dev(parsed):
    return ",".join(
        [parsed["path"]] + [f"{k}={parsed[k]}" for k in ("deny-write", "gid", "mode", "uid") if k in parsed]
    )


def canonical_dev(value):
    return format_dev(parse_dev(value))


def dev_value(entry):
    """The devN value for a wanted device ({'path', 'mode', 'uid', 'gid', 'deny_write'}), validated."""
    parts = [str(entry["path"])]
    for key in ("mode", "uid", "gid"):
        if entry.get(key) is not None:
            parts.append(f"{key}={entry[key]}")
    if entry.get("deny_write"):
        parts.append("deny-write=1")
    return canonical_dev(",".join(parts))


# --- hostpciN -----------------------------------------------------------------------------------------


def hostpci_id(text):
    """Canonical PCI id: domain:bus:slot (every function) or domain:bus:slot.function."""
    m = HOSTPCI_ID.match(str(text).strip().lower())
    if not m:
        raise EntryError(f"{text!r} is not a PCI address ([domain:]bus:slot[.function], hexadecimal)")
    base = f"{m.group(1) or '0000'}:{m.group(2)}:{m.group(3)}"
    return f"{base}.{m.group(4)}" if m.group(4) is not None else base


def _hostpci_option(key, val, value):
    """The normalised value of one hostpciN option; EntryError if PVE would refuse it."""
    kind = HOSTPCI_OPTIONS.get(key)
    if kind is None:
        raise EntryError(f"unknown option {key!r} in {value!r}")
    if kind == "bool":
        return _bool(key, val, value)
    if kind == "hex":
        if not re.match(r"^(0x)?[0-9a-fA-F]{1,4}$", val):
            raise EntryError(f"{key}={val!r} in {value!r} is not a hexadecimal id")
        return "0x" + val.lower().removeprefix("0x").rjust(4, "0")
    if isinstance(kind, tuple):
        if val not in kind:
            raise EntryError(f"{key}={val!r} in {value!r} must be one of {', '.join(kind)}")
        return val
    if kind == "file" and (not re.match(r"^[A-Za-z0-9._/-]+$", val) or ".." in val):
        raise EntryError(f"romfile={val!r} in {value!r} is not a file name under /usr/share/kvm")
    if kind == "name" and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", val):
        raise EntryError(f"{key}={val!r} in {value!r} is not a valid name")
    return val


def parse_hostpci(value):
    """{'host': [ids], 'mapping': str|None, 'options': {...}}; EntryError if PVE would refuse it at VM start."""
    first, props = split_props(value)
    if first is not None:
        if "host" in props:
            raise EntryError(f"{value!r} names the host device twice")
        props["host"] = first
    options = {key: _hostpci_option(key, val, value) for key, val in props.items()}
    if ("host" in props) == ("mapping" in props):
        raise EntryError(f"{value!r} needs exactly one of host= or mapping=")
    hosts = [hostpci_id(h) for h in props["host"].split(";")] if "host" in props else []
    if len(set(hosts)) != len(hosts):
        raise EntryError(f"{value!r} names a device twice")
    for key in ("host", "mapping"):
        options.pop(key, None)
    return {"host": hosts, "mapping": props.get("mapping"), "options": options}


def format_hostpci(parsed):
    head = ";".join(parsed["host"]) if parsed["host"] else f"mapping={parsed['mapping']}"
    return ",".join([head] + [f"{k}={parsed['options'][k]}" for k in sorted(parsed["options"])])


def canonical_hostpci(value):
    return format_hostpci(parse_hostpci(value))


def hostpci_value(entry):
    """The hostpciN value for a wanted GPU ({'host', 'pcie', 'rombar', 'x_vga', 'driver', 'romfile'}), validated."""
    hosts = entry["host"] if isinstance(entry["host"], list) else str(entry["host"]).split(";")
    parts = [";".join(str(h) for h in hosts)]
    for key, option in (("pcie", "pcie"), ("rombar", "rombar"), ("x_vga", "x-vga")):
        if entry.get(key) is not None:
            parts.append(f"{option}={int(bool(entry[key]))}")
    for key in ("driver", "romfile"):
        if entry.get(key):
            parts.append(f"{key}={entry[key]}")
    return canonical_hostpci(",".join(parts))


def covers(ids, address):
    """Whether a hostpci id list passes the function or slot ``address`` (a slot id covers its functions)."""
    address = hostpci_id(address)
    slot = address.split(".")[0]
    return any(i in (address, slot) or i.split(".")[0] == address for i in ids)


# --- planning -----------------------------------------------------------------------------------------


def _index(key):
    return int(re.sub(r"^\D+", "", key))


def plan(config, wanted, kind, owns):
    """The smallest change that makes ``config`` carry exactly ``wanted`` among the entries it ``owns``.

    kind: 'dev' or 'hostpci'. wanted: canonical values. owns(canonical_or_None, raw) -> bool says whether an
    existing entry is one this caller manages (a malformed entry is passed as None). Returns
    (updates {key: value}, deletes [keys], warnings): an owned entry equal to a wanted one stays under its
    key; an owned entry no longer wanted is deleted; a new one takes the lowest index no current key uses.
    """
    pattern, limit = (DEV_KEY, MAX_DEV) if kind == "dev" else (HOSTPCI_KEY, MAX_HOSTPCI)
    canonical = canonical_dev if kind == "dev" else canonical_hostpci
    # An entry for the same device (path; PCI slots) is updated under its own key rather than moved.
    identity = (
        (lambda v: parse_dev(v)["path"])
        if kind == "dev"
        else (lambda v: tuple(sorted({h.split(".")[0] for h in parse_hostpci(v)["host"]})))
    )
    existing, warnings = {}, []
    for key, raw in config.items():
        if not pattern.match(key):
            continue
        try:
            existing[key] = canonical(raw)
        except EntryError as exc:
            existing[key] = None
            if owns(None, raw):
                warnings.append(f"{key}: {raw!r} is malformed ({exc}); replacing it")
            else:
                warnings.append(f"{key}: {raw!r} is malformed ({exc}); it is not a GPU entry, left as it is")
    owned = {k: v for k, v in existing.items() if owns(v, config[k])}
    updates, keep = {}, set()
    pending = []
    for value in wanted:
        same = [k for k, v in owned.items() if v == value and k not in keep]
        if same:
            keep.add(sorted(same, key=_index)[0])
            continue
        alike = [k for k, v in owned.items() if v is not None and k not in keep and identity(v) == identity(value)]
        if alike:
            key = sorted(alike, key=_index)[0]
            keep.add(key)
            updates[key] = value
        else:
            pending.append(value)
    used = set(config) | set(updates)
    free = [f"{kind}{i}" for i in range(limit) if f"{kind}{i}" not in used]
    deletes = sorted((k for k in owned if k not in keep), key=_index)
    if len(pending) > len(free):
        raise EntryError(
            f"no free {kind}N key left for {len(pending)} more entries (PVE allows {kind}0-{kind}{limit - 1})"
        )
    for key, value in zip(free, pending, strict=False):
        updates[key] = value
    return updates, deletes, warnings


def apply(config, updates, deletes):
    after = {k: v for k, v in config.items() if k not in deletes}
    after.update(updates)
    return after


def config_text(config):
    """The config as qm/pct show it, one ``key: value`` line each, digest left out, for --diff."""
    return "".join(f"{k}: {config[k]}\n" for k in sorted(config, key=_sort_key) if k != "digest")


def _sort_key(key):
    m = re.match(r"^(\D+)(\d+)$", key)
    return (m.group(1), int(m.group(2))) if m else (key, -1)
