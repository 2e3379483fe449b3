"""fakepve with PCI resource mappings as PVE keeps and checks them.

fakepve answers ``/cluster/mapping/pci`` from its schema without storing anything, lets any user set a raw
``hostpciN``, and starts a VM whatever its ``hostpciN`` entries name. ``MappingPve`` adds what PVE does:

- a mapping store: ``GET``/``POST /cluster/mapping/pci`` and ``GET``/``PUT``/``DELETE /cluster/mapping/pci/{id}``,
  each request checked against the schema and its permission rule first (fakepve's own checks), the map entries
  parsed as PVE parses them (``node``, ``path``, ``id``, ``subsystem-id``, ``iommugroup``, ``description``), one
  digest for the whole file as PVE has for ``mapping/pci.cfg``;
- PVE's rule for ``hostpciN`` (qemu-server's permission check of a config change): a raw entry (``host=``) may be
  set, changed or deleted only by a ``root@pam`` ticket session, never by a token (``root@pam!name`` included);
  a ``mapping=<id>`` entry needs ``Mapping.Use`` on ``/mapping/pci/<id>`` besides ``VM.Config.HWType``;
- the check at VM start: every mapped entry must have an entry for the VM's node, and each of those must match
  the node's hardware (``add_pci_device``) in ``id``, ``subsystem-id`` and ``iommugroup``, as PVE checks them
  against sysfs; a mismatch fails the start task with PVE's words.

Used by the API tests; nothing in roles/ or plugins/ knows of it.
"""

from __future__ import annotations

import re

from fakepve import FakePve
from fakepve.model import PveError, TaskError
from fakepve.routing import check_digest, die, param_error, sha1, split_list

HOSTPCI_KEY = re.compile(r"^hostpci\d+$")
MAP_KEYS = ("node", "path", "id", "subsystem-id", "iommugroup", "description")
PCI_PATH = re.compile(r"^[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?$")
HEX_ID = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}$")
NOT_ROOT = "only root can set '{key}' config for non-mapped devices"


def parse_props(text: str, default_key: str) -> dict:
    """A PVE property string as {key: value}; a bare first item belongs to default_key."""
    out = {}
    for n, part in enumerate(p for p in str(text).split(",") if p):
        key, eq, value = part.partition("=")
        if not eq and n == 0:
            key, value = default_key, part
        out[key] = value
    return out


def parse_map_entry(text: str) -> dict:
    """One entry of a mapping's ``map`` list, checked as PVE's map format; PveError 400 naming ``map``."""
    entry = parse_props(text, "node")
    unknown = sorted(set(entry) - set(MAP_KEYS))
    if unknown:
        raise param_error(map=f"property is not defined in schema and the schema does not allow: {unknown[0]}")
    for key in ("node", "path", "id"):
        if not entry.get(key):
            raise param_error(map=f"property '{key}' is missing")
    if not all(PCI_PATH.match(p) for p in entry["path"].split(";")):
        raise param_error(map=f"value '{entry['path']}' does not match the regex pattern for 'path'")
    for key in ("id", "subsystem-id"):
        if key in entry and not HEX_ID.match(entry[key]):
            raise param_error(map=f"value '{entry[key]}' does not match the regex pattern for '{key}'")
    if "iommugroup" in entry and not re.fullmatch(r"-?[0-9]+", entry["iommugroup"]):
        raise param_error(map=f"type check ('integer') failed - got '{entry['iommugroup']}'")
    return entry


def _as_list(value) -> list[str]:
    """An array parameter: PVE takes one value or several (repeated form fields, a JSON list)."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _hex(text) -> str:
    return str(text).lower().replace("0x", "")


class MappingApi:
    """Mixin of FakePve (put it first): the mapping store, the hostpci rule and the start check."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # id -> {'map': [entry strings], 'description', 'mdev', 'live-migration-capable'} (absent keys unset)
        self.pci_mappings = {}
        # node -> {function address: {'id', 'subsystem-id', 'iommugroup'}}: the node's sysfs as PVE reads it
        self.pci_hardware = {}

    # ------------------------------------------------------------------------------------------ scenario

    def add_pci_device(self, node, address, device_id, subsystem_id=None, iommugroup=None):
        """A PCI function on a node: vendor:device, subsystem vendor:device (None: the device has none), group."""
        self.nodes.setdefault(node, {"online": True})
        self.pci_hardware.setdefault(node, {})[address] = {
            "id": device_id,
            "subsystem-id": subsystem_id,
            "iommugroup": iommugroup,
        }

    def mapping_digest(self) -> str:
        text = "".join(
            f"{mid}\n" + "".join(f"\t{k} {v}\n" for k, v in sorted(conf.items()))
            for mid, conf in self.pci_mappings.items()
        )
        return sha1(text)

    # ------------------------------------------------------------------------------------------ the store

    def _routes_pci_mapping(self):
        base = "/cluster/mapping/pci"
        return [
            ("GET", base, self._mapping_index),
            ("POST", base, self._mapping_create),
            ("GET", base + "/{id}", self._mapping_get),
            ("PUT", base + "/{id}", self._mapping_update),
            ("DELETE", base + "/{id}", self._mapping_delete),
        ]

    def _may_see(self, user, mid) -> bool:
        return any(
            self.allowed(user, f"/mapping/pci/{mid}", p) for p in ("Mapping.Audit", "Mapping.Use", "Mapping.Modify")
        )

    def _mapping_view(self, mid) -> dict:
        conf = self.pci_mappings[mid]
        return {"id": mid, **{k: v for k, v in conf.items() if k != "map"}, "map": list(conf.get("map", []))}

    async def _mapping_index(self, values, user):
        out = []
        for mid in sorted(self.pci_mappings):
            if not self._may_see(user, mid):
                continue
            view = self._mapping_view(mid)
            node = values.get("check-node")
            if node:
                view["checks"] = [
                    {"severity": "error", "message": why} for why in self.mapping_errors(mid, node, missing_ok=True)
                ]
            out.append(view)
        return out

    def _set(self, mid, values, creating):
        conf = {} if creating else dict(self.pci_mappings[mid])
        for key in split_list(values.get("delete")):
            if key not in ("description", "mdev", "live-migration-capable", "map"):
                raise param_error(delete=f"invalid property '{key}'")
            conf.pop(key, None)
        if "map" in values:
            conf["map"] = [",".join(f"{k}={v}" for k, v in parse_map_entry(t).items()) for t in _as_list(values["map"])]
        for key in ("description", "mdev", "live-migration-capable"):
            if values.get(key) is not None:
                conf[key] = values[key]
        self.pci_mappings[mid] = conf

    async def _mapping_create(self, values, user):
        mid = values["id"]
        if mid in self.pci_mappings:
            raise die(f"pci ID '{mid}' already defined")
        self._set(mid, values, creating=True)

    def _existing(self, mid):
        if mid not in self.pci_mappings:
            raise die(f"no such pci mapping '{mid}'")
        return self.pci_mappings[mid]

    async def _mapping_get(self, values, user):
        self._existing(values["id"])
        return {**self._mapping_view(values["id"]), "type": "pci", "digest": self.mapping_digest()}

    async def _mapping_update(self, values, user):
        self._existing(values["id"])
        check_digest(self.mapping_digest(), values.get("digest"))
        self._set(values["id"], values, creating=False)

    async def _mapping_delete(self, values, user):
        self._existing(values["id"])
        del self.pci_mappings[values["id"]]

    # --------------------------------------------------------------------------------- hostpci permissions

    def _hostpci_allowed(self, user, key, value):
        """qemu-server's rule for one hostpciN value, new or old: raw is root@pam's; a mapping needs Mapping.Use."""
        if user == "root@pam" or value is None:
            return
        props = parse_props(value, "host")
        if "mapping" not in props:
            raise PveError(500, NOT_ROOT.format(key=key))
        self.require(user, f"/mapping/pci/{props['mapping']}", "Mapping.Use")

    async def _apply_config(self, vm, user, p):
        deletes = [k for k in str(p.get("delete", "") or "").split(",") if k]
        for key in sorted(set(k for k in p if HOSTPCI_KEY.match(k)) | set(k for k in deletes if HOSTPCI_KEY.match(k))):
            self._hostpci_allowed(user, key, p.get(key))
            old = vm.pending.get(key) or vm.config.get(key)
            self._hostpci_allowed(user, key, old)
        return await super()._apply_config(vm, user, p)

    # ---------------------------------------------------------------------------------------- start check

    def mapping_errors(self, mid, node, missing_ok=False) -> list[str]:
        """What PVE says of mapping mid on node at a VM start (empty: valid); missing_ok: a node without an
        entry is no error (the index's check of a node)."""
        conf = self.pci_mappings.get(mid)
        entries = [parse_props(t, "node") for t in (conf or {}).get("map", [])]
        entries = [e for e in entries if e.get("node") == node]
        if not entries:
            return [] if missing_ok and conf else [f"PCI device mapping not found for '{mid}'"]
        hardware = self.pci_hardware.get(node, {})
        out = []
        for entry in entries:
            try:
                self._assert_valid(mid, entry, hardware)
            except TaskError as exc:
                out.append(f"PCI device mapping invalid (hardware probably changed): {exc}")
        return out

    @staticmethod
    def _assert_valid(mid, entry, hardware):
        """PVE's check of one node entry against the node's devices: the first function of a whole device."""
        for idx, given_path in enumerate(entry["path"].split(";")):
            whole = not re.search(r"\.[a-f0-9]$", given_path, re.I)
            path = f"{given_path}.0" if whole else given_path
            device = hardware.get(path)
            if device is None:
                raise TaskError(f"pci device '{path}' not found")
            for prop in ("id", "iommugroup", "subsystem-id"):
                if prop == "iommugroup" and idx > 0:
                    continue
                real, given = device.get(prop), entry.get(prop)
                if real is None and given is None:
                    continue
                if given is None:
                    raise TaskError(f"no '{prop}' for device '{path}'")
                if real is None:
                    raise TaskError(f"'{prop}' configured but should not be")
                if _hex(real) != _hex(given):
                    raise TaskError(f"'{prop}' does not match for '{mid}' ({_hex(real)} != {_hex(given)})")

    def start_errors(self, vm) -> list[str]:
        """The mapped hostpciN entries of the config the VM starts with, checked on its node."""
        config = {**vm.config, **{k: v for k, v in vm.pending.items() if v is not None}}
        config = {k: v for k, v in config.items() if vm.pending.get(k, "") is not None}
        out = []
        for key in sorted(k for k in config if HOSTPCI_KEY.match(k)):
            mid = parse_props(config[key], "host").get("mapping")
            if mid:
                out += self.mapping_errors(mid, vm.node)
        return out

    async def _do_start(self, vm, user, p):
        errors = [] if vm.ha_managed else self.start_errors(vm)
        if not errors:
            return await super()._do_start(vm, user, p)

        async def body():
            raise TaskError(errors[0])

        return await self.task(vm.node, "qmstart", vm.vmid, user, body, vm=vm)


class MappingPve(MappingApi, FakePve):
    """fakepve with PCI resource mappings (see the module's text)."""
