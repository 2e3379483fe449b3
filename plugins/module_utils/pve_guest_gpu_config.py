"""Plan the GPU entries of a Proxmox guest's config: a container's ``devN`` and a VM's ``hostpciN``.

Pure functions, no Ansible and no API, for the ``pve_guest_gpu_config`` module: turn the role's data into
entries, and plan the smallest config update that makes the guest carry exactly the wanted GPU entries while
every other line of its config stays as it is. Parsing, validation and the canonical spelling of entries are
gpu-switch's (``gpu_switch/entries.py``): one grammar for both, and the ``gpu_switch`` package imports nothing
from here, since it is also installed on its own as a command.
"""

from __future__ import annotations

if __package__:  # ansible.module_utils.pve_guest_gpu_config, in a module (Ansible sends gpu_switch along)
    from .gpu_switch import entries
else:  # plain pve_guest_gpu_config, with plugins/module_utils on sys.path (the unit tests)
    from gpu_switch import entries


def dev_value(entry):
    """The devN value for a wanted device ({'path', 'mode', 'uid', 'gid', 'deny_write'}), validated."""
    parts = [str(entry["path"])]
    for key in ("mode", "uid", "gid"):
        if entry.get(key) is not None:
            parts.append(f"{key}={entry[key]}")
    if entry.get("deny_write"):
        parts.append("deny-write=1")
    return entries.canonical_dev(",".join(parts))


def hostpci_value(entry):
    """The hostpciN value for a wanted GPU ({'host' or 'mapping', 'pcie', 'rombar', 'x_vga', 'driver', 'romfile'}),
    validated."""
    if entry.get("mapping"):
        parts = [f"mapping={entry['mapping']}"]
    else:
        hosts = entry["host"] if isinstance(entry["host"], list) else str(entry["host"]).split(";")
        parts = [";".join(str(h) for h in hosts)]
    for key, option in (("pcie", "pcie"), ("rombar", "rombar"), ("x_vga", "x-vga")):
        if entry.get(key) is not None:
            parts.append(f"{option}={int(bool(entry[key]))}")
    for key in ("driver", "romfile"):
        if entry.get(key):
            parts.append(f"{key}={entry[key]}")
    return entries.canonical_hostpci(",".join(parts))


def covers(ids, address):
    """Whether a hostpci id list passes the function or slot ``address`` (a slot id covers its functions)."""
    address = entries.hostpci_id(address)
    slot = address.split(".")[0]
    return any(i in (address, slot) or i.split(".")[0] == address for i in ids)


# --- planning -----------------------------------------------------------------------------------------


def plan(config, wanted, kind, owns):
    """The smallest change that makes ``config`` carry exactly ``wanted`` among the entries it ``owns``.

    kind: 'dev' or 'hostpci'. wanted: canonical values. owns(canonical_or_None, raw) -> bool says whether an
    existing entry is one this caller manages (a malformed entry is passed as None). Returns
    (updates {key: value}, deletes [keys], warnings): an owned entry equal to a wanted one stays under its
    key; an owned entry no longer wanted is deleted; a new one takes the lowest index no current key uses.
    """
    if kind == "dev":
        pattern, limit, canonical = entries.DEV_KEY, entries.MAX_DEV, entries.canonical_dev
    else:
        pattern, limit, canonical = entries.HOSTPCI_KEY, entries.MAX_HOSTPCI, entries.canonical_hostpci
    # An entry for the same device (path; PCI slots) is updated under its own key rather than moved.
    identity = (
        (lambda v: entries.parse_dev(v)["path"])
        if kind == "dev"
        else (lambda v: _hostpci_identity(entries.parse_hostpci(v)))
    )
    existing, warnings = {}, []
    for key, raw in config.items():
        if not pattern.match(key):
            continue
        try:
            existing[key] = canonical(raw)
        except entries.EntryError as exc:
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
            keep.add(min(same, key=entries.key_order))
            continue
        alike = [k for k, v in owned.items() if v is not None and k not in keep and identity(v) == identity(value)]
        if alike:
            key = min(alike, key=entries.key_order)
            keep.add(key)
            updates[key] = value
        else:
            pending.append(value)
    deletes = sorted((k for k in owned if k not in keep), key=entries.key_order)
    free = entries.free_keys({**config, **updates}, pattern, kind, limit, len(pending))
    updates.update(zip(free, pending, strict=True))
    return updates, deletes, warnings


def _hostpci_identity(parsed):
    """What a hostpciN entry passes: its PCI slots, or the mapping it names."""
    if parsed["mapping"]:
        return ("mapping", parsed["mapping"])
    return tuple(sorted({h.split(".")[0] for h in parsed["host"]}))


def apply(config, updates, deletes):
    after = {k: v for k, v in config.items() if k not in deletes}
    after.update(updates)
    return after


def config_text(config):
    """The config as qm/pct show it, one ``key: value`` line each, digest left out, for --diff."""
    return "".join(f"{k}: {config[k]}\n" for k in sorted(config, key=entries.key_order) if k != "digest")
