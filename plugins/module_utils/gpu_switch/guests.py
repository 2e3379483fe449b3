# SPDX-License-Identifier: Apache-2.0
"""The two guests through the Proxmox API: their power (shut down, start, stop again, restart) and their GPU
entries (what a VM's ``hostpciN`` lacks, the container's ``devN`` paths, adding the missing ones with the
journal naming them first, removing them again), and the hookscript attached to both.

Only root@pam logged in with a password may write ``devN`` and raw ``hostpciN`` entries or a hookscript, so
every such write says what to do otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import entries
from .context import Context
from .errors import ApiError, ConfigError, Refused, StepFailed, TaskFailed
from .pci import Gpu, discover, nvidia_device_paths
from .pve import label

ROOT_PAM = (
    "Proxmox allows devN entries (and raw hostpciN ones) only for root@pam logged in with a password; "
    "{who} is {what}: set proxmox.user to root@pam with its password in password_file and no token_name, "
    "or add the entries once by hand as root ({entries})"
)


@dataclass
class Guest:
    kind: str
    role: str
    vmid: int
    status: str = "unknown"
    config: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def label(self) -> str:
        return label(self.kind, self.vmid)


class GuestControl:
    """The container and the VM: power, GPU entries, hookscript."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def guests(self) -> dict[str, Guest]:
        return {
            "container": Guest("lxc", "container", self.ctx.cfg.container_vmid),
            "vm": Guest("qemu", "vm", self.ctx.cfg.vm_vmid),
        }

    # ------------------------------------------------------------------ power

    def shutdown(self, guest: Guest, timeout: float, force: bool) -> None:
        api, margin = self.ctx.api, 30.0
        try:
            api.act(guest.kind, guest.vmid, "shutdown", "stopped", timeout + margin, timeout=int(timeout))
        except TaskFailed as exc:
            if api.status(guest.kind, guest.vmid) == "stopped":
                return
            if not force:
                raise Refused(
                    f"{guest.label} did not shut down within {timeout:g} s ({exc.exitstatus or exc.reason}); "
                    "rerun with --force to stop it hard, or with a longer --timeout"
                ) from None
            params = {"overrule-shutdown": 1} if exc.exitstatus is None else {}
            api.act(guest.kind, guest.vmid, "stop", "stopped", self.ctx.cfg.timeouts.task, **params)
        if api.status(guest.kind, guest.vmid) != "stopped":
            raise StepFailed(f"{guest.label} is still not stopped after its shutdown task")

    def restart(self, guest: Guest) -> None:
        if self.ctx.api.status(guest.kind, guest.vmid) != "running":
            self.start(guest)

    def start(self, guest: Guest) -> None:
        self.ctx.api.act(guest.kind, guest.vmid, "start", "running", self.ctx.cfg.timeouts.task)
        status = self.ctx.api.status(guest.kind, guest.vmid)
        if status != "running":
            raise StepFailed(f"{guest.label} is {status} after its start task ended OK")

    def stop_started(self, guest: Guest) -> None:
        if self.ctx.api.status(guest.kind, guest.vmid) == "running":
            self.ctx.api.act(guest.kind, guest.vmid, "stop", "stopped", self.ctx.cfg.timeouts.task)

    # ------------------------------------------------------------ GPU entries

    def vm_additions(self, config: dict, gpus: list[Gpu], mapped: dict | None = None) -> list[str]:
        """hostpciN values to add for GPUs the VM config does not pass yet; Refused on bad existing entries.

        mapped: {mapping id: the PCI ids its entries for this node pass}: an entry naming a mapping passes those.
        A GPU that one of them maps is added by its mapping when the login is not root@pam, who alone may write
        a raw address.
        """
        cfg, mapped = self.ctx.cfg, mapped or {}
        existing = []
        for key, value in config.items():
            if entries.HOSTPCI_KEY.match(key):
                try:
                    parsed = entries.parse_hostpci(str(value))
                except entries.EntryError as exc:
                    raise Refused(f"VM {cfg.vm_vmid} {key} is malformed: {exc}") from None
                if not parsed["mapping"]:
                    existing.append((key, str(value)))
                elif mapped.get(parsed["mapping"]):
                    # What the mapping passes on this node, as a raw entry would name it, for the coverage below.
                    existing.append((key, ";".join(mapped[parsed["mapping"]])))
        add = []
        for gpu in gpus:
            functions = [f.address for f in gpu.functions]
            cover = {key: entries.hostpci_coverage(value, gpu.slot, functions) for key, value in existing}
            if "all" in cover.values():
                continue
            partial = [k for k, c in cover.items() if c == "some"]
            if partial:
                raise Refused(
                    f"VM {cfg.vm_vmid} {partial[0]} passes only some functions of GPU {gpu.address}; "
                    f"all of {', '.join(functions)} must go together: fix or delete {partial[0]}"
                )
            mapping = next((mid for mid, ids in sorted(mapped.items()) if ids == [gpu.slot]), None)
            try:
                if mapping and not cfg.proxmox.is_root_pam:
                    add.append(entries.make_hostpci(f"mapping={mapping}", cfg.hostpci_options))
                else:
                    add.append(entries.make_hostpci(gpu.slot, cfg.hostpci_options))
            except entries.EntryError as exc:
                raise ConfigError(f"config {cfg.path}: vm.hostpci_options: {exc}") from None
        if add and "pcie=1" in cfg.hostpci_options.split(",") and "q35" not in str(config.get("machine", "")):
            raise Refused(
                f"VM {cfg.vm_vmid} has machine {config.get('machine', 'i440fx (default)')!r}, and "
                "hostpci pcie=1 needs q35: set machine: q35 on the VM, or drop pcie=1 from "
                "vm.hostpci_options"
            )
        return add

    def ct_existing_paths(self, config: dict) -> set[str]:
        paths = set()
        for key, value in config.items():
            if entries.DEV_KEY.match(key):
                try:
                    paths.add(entries.parse_dev(str(value))["path"])
                except entries.EntryError as exc:
                    raise Refused(f"CT {self.ctx.cfg.container_vmid} {key} is malformed: {exc}") from None
        return paths

    def vm_mapped(self, config: dict) -> dict[str, list[str]]:
        """{mapping id: the PCI ids it passes on this node} for vm_additions. Entries naming a mapping count for
        what it passes here (a failed listing stops the move); a login other than root@pam looks for mappings of
        the GPUs it must add (none listed: it is refused as before). A root@pam login without mapped entries
        asks nothing."""
        mapped = any(entries.HOSTPCI_KEY.match(k) and "mapping=" in str(v) for k, v in config.items())
        listed = []
        if mapped:
            listed = self.ctx.api.pci_mappings()
        elif not self.ctx.cfg.proxmox.is_root_pam:
            try:
                listed = self.ctx.api.pci_mappings()
            except ApiError:
                listed = []
        return entries.mapped_ids(listed, self.ctx.cfg.proxmox.node)

    @staticmethod
    def raw_additions(additions: list[str]) -> list[str]:
        """The additions that name a PCI address (root@pam's alone), not a mapping."""
        return [a for a in additions if not a.startswith("mapping=")]

    def root_pam_error(self, what: str) -> str:
        px = self.ctx.cfg.proxmox
        who = f"the API token {px.identity}" if px.token_name else f"the user {px.user}"
        return ROOT_PAM.format(
            who=who, what="not root@pam" if px.token_name or px.user != "root@pam" else "root@pam", entries=what
        )

    def ensure_config(self, guest: Guest) -> None:
        """Add the entries the guest lacks for the GPUs as they are bound now; the journal names them first."""
        ctx, api = self.ctx, self.ctx.api
        config = api.config(guest.kind, guest.vmid)
        gpus = discover(ctx.cfg, ctx.sysfs)
        if guest.kind == "qemu":
            add = self.vm_additions(config, gpus, self.vm_mapped(config))
            keys = entries.free_keys(config, entries.HOSTPCI_KEY, "hostpci", entries.MAX_HOSTPCI, len(add))
        else:
            paths, missing = nvidia_device_paths(gpus, ctx.cfg.roots.proc, ctx.cfg.roots.dev)
            if missing:
                raise StepFailed(
                    f"device nodes missing on the host: {', '.join(missing)}; the container cannot start without them"
                )
            existing = self.ct_existing_paths(config)
            add = [entries.make_dev(p) for p in paths if p not in existing]
            keys = entries.free_keys(config, entries.DEV_KEY, "dev", entries.MAX_DEV, len(add))
        if not add:
            return
        values = dict(zip(keys, add, strict=True))
        what = ", ".join(f"{k}: {v}" for k, v in values.items())
        raw = add if guest.kind == "lxc" else self.raw_additions(add)
        if raw and not ctx.cfg.proxmox.is_root_pam:
            raise StepFailed(self.root_pam_error(what))
        ctx.journal_update(config_added={"kind": guest.kind, "vmid": guest.vmid, "values": values})
        try:
            api.set_config(guest.kind, guest.vmid, values, digest=config.get("digest"))
        except ApiError as exc:
            if exc.status == 403:
                raise StepFailed(f"{exc.reason}; " + self.root_pam_error(what)) from None
            raise

    def undo_config(self, guest: Guest) -> None:
        """Remove the entries this move added (as its journal names them) that still hold what it wrote."""
        added = ((self.ctx.record or {}).get("config_added") or {}).get("values") or {}
        self._remove_added(guest.kind, guest.vmid, added)

    def undo_interrupted_config(self, added: dict) -> None:
        """Remove the entries an interrupted move added to the guest that will not get the GPUs."""
        self._remove_added(added["kind"], added["vmid"], added.get("values") or {})
        self.ctx.journal_update(config_added=None)

    def _remove_added(self, kind: str, vmid: int, values: dict) -> None:
        config = self.ctx.api.config(kind, vmid)
        stale = sorted(k for k, v in values.items() if str(config.get(k)) == v)
        if stale:
            self.ctx.api.set_config(kind, vmid, {}, delete=stale, digest=config.get("digest"))

    # ------------------------------------------------------------- hookscript

    def ensure_hookscripts(self, volume: str, *, check_mode: bool = False) -> dict:
        """Attach the hookscript (``storage:snippets/name``) to both guests and allow snippets on that storage.
        Returns {'changed': bool, 'changes': [...]}; only root@pam may set a hookscript."""
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*:snippets/[A-Za-z0-9._+-]+", volume):
            raise ConfigError(
                f"hookscript {volume!r} is not a snippet volume such as local:snippets/gpu-switch-hook.py"
            )
        api, proxmox = self.ctx.api, self.ctx.cfg.proxmox
        storage = volume.split(":", 1)[0]
        changes = []
        store = api.storage(storage)
        content = [c for c in str(store.get("content", "")).split(",") if c and c != "none"]
        if "snippets" not in content:
            changes.append(
                f"storage {storage}: content {','.join(content) or 'none'} -> {','.join([*content, 'snippets'])}"
            )
            if not check_mode:
                api.set_storage_content(storage, ",".join([*content, "snippets"]), store.get("digest"))
        for guest in self.guests().values():
            config = api.config(guest.kind, guest.vmid)
            if config.get("hookscript") == volume:
                continue
            changes.append(f"{guest.label}: hookscript {config.get('hookscript') or '(none)'} -> {volume}")
            if check_mode:
                continue
            if not proxmox.is_root_pam:
                raise Refused(f"only root@pam may set a hookscript; {proxmox.identity} may not")
            api.set_config(guest.kind, guest.vmid, {"hookscript": volume}, digest=config.get("digest"))
        return {"changed": bool(changes), "changes": changes}
