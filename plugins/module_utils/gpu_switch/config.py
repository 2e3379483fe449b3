"""Configuration: YAML, validated strictly, with environment overrides for the roots.

```yaml
proxmox: {host: 127.0.0.1, port: 8006, user: root@pam, password_file: /etc/gpu-switch/password,
          verify_ssl: true, ca_file: null, node: pve1}
container: {vmid: 101}
vm: {vmid: 201}
gpus: ["0000:01:00.0", "0000:02:00.0"]      # or: gpu_match: {vendor: "0x10de", class: "0x0300"}
drivers: {host: nvidia, passthrough: vfio-pci}
roots: {sysfs: /sys, proc: /proc, run: /run}
```

Optional keys beyond that schema (all with defaults): ``proxmox.token_name`` (the secret is then read from
``password_file``), ``proxmox.timeout`` (HTTP seconds), ``vm.hostpci_options``, ``roots.dev``,
``roots.state`` (where the journal lives; it must survive a reboot), ``timeouts`` (``shutdown``, ``task``,
``sysfs_write``, ``command``), ``persistenced_unit`` and ``parallel``.
An unknown key is an error: a typo must not silently fall back to a default.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

try:
    import yaml
except ImportError:  # pragma: no cover - the role installs python3-yaml
    yaml = None

DEFAULT_PATH = "/etc/gpu-switch/config.yml"
ENV_ROOTS = {
    "sysfs": "GPU_SWITCH_SYSFS_ROOT",
    "proc": "GPU_SWITCH_PROC_ROOT",
    "run": "GPU_SWITCH_RUN_ROOT",
    "dev": "GPU_SWITCH_DEV_ROOT",
    "state": "GPU_SWITCH_STATE_ROOT",
}
# A full PCI address, domain:bus:slot.function; a short bus:slot.function gets domain 0000.
BDF = re.compile(r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-1][0-9a-f])\.([0-7])$")
HEX_ID = re.compile(r"^0x[0-9a-f]{4}$")
HEX_CLASS = re.compile(r"^0x[0-9a-f]{2,6}$")
DRIVER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NODE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
UNIT = re.compile(r"^[A-Za-z0-9@_.:-]+\.service$")
HOSTPCI_OPTION = re.compile(r"^(pcie|rombar|x-vga)=[01]$|^(romfile)=[A-Za-z0-9._-]+$|^(driver)=(vfio|keep)$")


def normalise_bdf(text: str) -> str | None:
    """The canonical spelling (0000:01:00.0) of a PCI address, or None if it is not one."""
    m = BDF.match(str(text).strip().lower())
    if not m:
        return None
    return f"{m.group(1) or '0000'}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


@dataclass(frozen=True)
class ProxmoxConfig:
    node: str
    host: str = "127.0.0.1"
    port: int = 8006
    user: str = "root@pam"
    password_file: str = "/etc/gpu-switch/password"
    token_name: str | None = None
    verify_ssl: bool = True
    ca_file: str | None = None
    timeout: float = 30.0

    @property
    def identity(self) -> str:
        """Who the API sees: the user, or user!token."""
        return f"{self.user}!{self.token_name}" if self.token_name else self.user

    @property
    def is_root_pam(self) -> bool:
        """Only a password login as root@pam may write devN and raw hostpciN entries."""
        return self.user == "root@pam" and not self.token_name


@dataclass(frozen=True)
class Timeouts:
    shutdown: float = 120.0  # a guest's clean shutdown
    task: float = 600.0  # any other Proxmox task (a VM with much memory starts slowly)
    sysfs_write: float = 15.0  # one write to sysfs; longer means the kernel is stuck
    command: float = 60.0  # systemctl, modprobe, nvidia-modprobe


@dataclass(frozen=True)
class Roots:
    sysfs: str = "/sys"
    proc: str = "/proc"
    run: str = "/run"
    dev: str = "/dev"
    state: str = "/var/lib/gpu-switch"


@dataclass(frozen=True)
class Config:
    proxmox: ProxmoxConfig
    container_vmid: int
    vm_vmid: int
    gpus: tuple[str, ...] = ()
    gpu_match: dict[str, Any] | None = None
    host_driver: str = "nvidia"
    passthrough_driver: str = "vfio-pci"
    roots: Roots = field(default_factory=Roots)
    timeouts: Timeouts = field(default_factory=Timeouts)
    hostpci_options: str = "pcie=1"
    persistenced_unit: str | None = "nvidia-persistenced.service"
    parallel: bool = False
    path: str = DEFAULT_PATH

    @property
    def lock_path(self) -> str:
        return os.path.join(self.roots.run, "gpu-switch", "lock")

    @property
    def journal_path(self) -> str:
        return os.path.join(self.roots.state, "journal.json")


class _Reader:
    """Typed access to one mapping of the YAML, with errors that name the key."""

    def __init__(self, source: str, data: Any, where: str, allowed: tuple[str, ...]):
        self.source, self.where = source, where
        if not isinstance(data, dict):
            self.fail(f"must be a mapping, not {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - set(allowed))
        if unknown:
            self.fail(f"unknown key {unknown[0]!r} (known: {', '.join(allowed)})")
        self.data = data

    def fail(self, message: str, key: str | None = None):
        where = f"{self.where}.{key}" if key and self.where else key or self.where
        raise ConfigError(f"config {self.source}: {where + ': ' if where else ''}{message}")

    def get(self, key, kind, default=None, *, required=False, check=None, what=None):
        if key not in self.data or self.data[key] is None:
            if required:
                self.fail("is required", key)
            return default
        value = self.data[key]
        if kind is bool:
            if not isinstance(value, bool):
                self.fail(f"must be true or false, not {value!r}", key)
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(f"must be an integer, not {value!r}", key)
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                self.fail(f"must be a positive number, not {value!r}", key)
            value = float(value)
        elif kind is str and (not isinstance(value, str) or not value):
            self.fail(f"must be a non-empty string, not {value!r}", key)
        if check is not None and not check(value):
            self.fail(f"{value!r} is not {what}", key)
        return value


def _vmid(reader: _Reader) -> int:
    return reader.get("vmid", int, required=True, check=lambda v: 100 <= v <= 999_999_999, what="a vmid (>= 100)")


def _proxmox(source: str, top: _Reader) -> ProxmoxConfig:
    px = _Reader(
        source,
        top.get("proxmox", dict, required=True),
        "proxmox",
        ("host", "port", "user", "password_file", "token_name", "verify_ssl", "ca_file", "node", "timeout"),
    )
    proxmox = ProxmoxConfig(
        node=px.get("node", str, required=True, check=NODE.match, what="a node name"),
        host=px.get("host", str, "127.0.0.1"),
        port=px.get("port", int, 8006, check=lambda v: 0 < v < 65536, what="a TCP port"),
        user=px.get(
            "user",
            str,
            "root@pam",
            check=lambda v: "@" in v and "!" not in v,
            what="a user@realm (put an API token's name in token_name)",
        ),
        password_file=px.get(
            "password_file", str, "/etc/gpu-switch/password", check=os.path.isabs, what="an absolute path"
        ),
        token_name=px.get(
            "token_name", str, None, check=re.compile(r"^[A-Za-z][A-Za-z0-9._-]*$").match, what="a token name"
        ),
        verify_ssl=px.get("verify_ssl", bool, True),
        ca_file=px.get("ca_file", str, None, check=os.path.isabs, what="an absolute path"),
        timeout=px.get("timeout", float, 30.0),
    )
    if proxmox.ca_file and not proxmox.verify_ssl:
        px.fail("ca_file is set but verify_ssl is false: the CA would be ignored", "verify_ssl")
    return proxmox


def _gpus(source: str, top: _Reader) -> tuple[list[str], dict | None]:
    if "gpus" in top.data and "gpu_match" in top.data:
        top.fail("give either gpus or gpu_match, not both", "gpus")
    if "gpu_match" in top.data:
        gm = _Reader(source, top.data["gpu_match"], "gpu_match", ("vendor", "class"))
        vendor = gm.get("vendor", str, required=True, check=lambda v: HEX_ID.match(v.lower()), what="a 0xNNNN id")
        classes = gm.data.get("class", ["0x0300", "0x0302"])
        classes = [classes] if isinstance(classes, str) else classes
        if (
            not isinstance(classes, list)
            or not classes
            or not all(isinstance(c, str) and HEX_CLASS.match(c.lower()) for c in classes)
        ):
            gm.fail(f"{classes!r} is not a PCI class prefix such as 0x0300 (or a list of them)", "class")
        return [], {"vendor": vendor.lower(), "class": [c.lower() for c in classes]}
    if "gpus" not in top.data:
        top.fail("name the GPUs with gpus (PCI addresses) or gpu_match (vendor and class)", "gpus")
    raw = top.data["gpus"]
    if not isinstance(raw, list) or not raw:
        top.fail("must be a non-empty list of PCI addresses", "gpus")
    gpus: list[str] = []
    for n, item in enumerate(raw):
        bdf = normalise_bdf(item) if isinstance(item, str) else None
        if bdf is None:
            top.fail(f"{item!r} is not a PCI address (DDDD:BB:SS.F)", f"gpus[{n}]")
        if bdf in gpus:
            top.fail(f"{bdf} is listed twice", f"gpus[{n}]")
        gpus.append(bdf)
    return gpus, None


def _roots(source: str, top: _Reader, environ) -> Roots:
    rt = _Reader(source, top.get("roots", dict, {}), "roots", ("sysfs", "proc", "run", "dev", "state"))
    values = {}
    for key, env in ENV_ROOTS.items():
        value = environ.get(env) or rt.get(key, str, None, check=os.path.isabs, what="an absolute path")
        if value is not None and not os.path.isabs(value):
            raise ConfigError(f"environment {env}: {value!r} is not an absolute path")
        values[key] = value
    defaults = Roots()
    run = values["run"] or defaults.run
    # The journal must survive a reboot, so it does not live in /run (a tmpfs) unless the run root was
    # moved (tests, the lab): then it follows the run root, and nothing is written outside it.
    state = values["state"] or (defaults.state if run == defaults.run else os.path.join(run, "gpu-switch"))
    return Roots(
        sysfs=values["sysfs"] or defaults.sysfs,
        proc=values["proc"] or defaults.proc,
        run=run,
        dev=values["dev"] or defaults.dev,
        state=state,
    )


def parse_config(data: Any, source: str = DEFAULT_PATH, environ: dict[str, str] | None = None) -> Config:
    """A Config from the parsed YAML; ConfigError (exit 2) with a one-line reason if anything is wrong."""
    environ = os.environ if environ is None else environ
    top = _Reader(
        source,
        data if data is not None else {},
        "",
        (
            "proxmox",
            "container",
            "vm",
            "gpus",
            "gpu_match",
            "drivers",
            "roots",
            "timeouts",
            "persistenced_unit",
            "parallel",
        ),
    )
    proxmox = _proxmox(source, top)
    ct = _Reader(source, top.get("container", dict, required=True), "container", ("vmid",))
    vm = _Reader(source, top.get("vm", dict, required=True), "vm", ("vmid", "hostpci_options"))
    container_vmid, vm_vmid = _vmid(ct), _vmid(vm)
    if container_vmid == vm_vmid:
        top.fail(f"container and vm have the same vmid {vm_vmid}", "vm.vmid")
    hostpci_options = vm.get(
        "hostpci_options",
        str,
        "pcie=1",
        check=lambda v: all(HOSTPCI_OPTION.match(o) for o in v.split(",")),
        what="a list of pcie=, rombar=, x-vga=, romfile=, driver=",
    )
    gpus, gpu_match = _gpus(source, top)

    dr = _Reader(source, top.get("drivers", dict, {}), "drivers", ("host", "passthrough"))
    host_driver = dr.get("host", str, "nvidia", check=DRIVER.match, what="a driver name")
    passthrough = dr.get("passthrough", str, "vfio-pci", check=DRIVER.match, what="a driver name")
    if host_driver == passthrough:
        dr.fail("host and passthrough drivers must differ", "passthrough")

    to = _Reader(source, top.get("timeouts", dict, {}), "timeouts", ("shutdown", "task", "sysfs_write", "command"))
    timeouts = Timeouts(
        shutdown=to.get("shutdown", float, 120.0),
        task=to.get("task", float, 600.0),
        sysfs_write=to.get("sysfs_write", float, 15.0),
        command=to.get("command", float, 60.0),
    )

    unit = top.data.get("persistenced_unit", "nvidia-persistenced.service")
    if unit is not None and (not isinstance(unit, str) or not UNIT.match(unit)):
        top.fail(f"{unit!r} is not a systemd service name (or null to leave the daemon alone)", "persistenced_unit")

    return Config(
        proxmox=proxmox,
        container_vmid=container_vmid,
        vm_vmid=vm_vmid,
        gpus=tuple(gpus),
        gpu_match=gpu_match,
        host_driver=host_driver,
        passthrough_driver=passthrough,
        roots=_roots(source, top, environ),
        timeouts=timeouts,
        hostpci_options=hostpci_options,
        persistenced_unit=unit,
        parallel=top.get("parallel", bool, False),
        path=source,
    )


def load_config(path: str | None = None, environ: dict[str, str] | None = None) -> Config:
    """Read and validate the YAML file (default /etc/gpu-switch/config.yml)."""
    if yaml is None:  # pragma: no cover
        raise ConfigError("the Python yaml module is missing (apt install python3-yaml)")
    path = path or DEFAULT_PATH
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config {path}: not valid YAML{where}: {problem}") from None
    return parse_config(data, path, environ)


def read_secret(proxmox: ProxmoxConfig) -> str:
    """The password (or token secret) from password_file: one line, kept out of every message."""
    try:
        with open(proxmox.password_file, encoding="utf-8") as fh:
            secret = fh.read().strip()
    except FileNotFoundError:
        raise ConfigError(f"proxmox.password_file {proxmox.password_file}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"proxmox.password_file {proxmox.password_file}: {exc.strerror}") from None
    if not secret or "\n" in secret:
        raise ConfigError(f"proxmox.password_file {proxmox.password_file}: must hold exactly one non-empty line")
    return secret
