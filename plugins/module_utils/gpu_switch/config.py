"""Configuration: YAML, validated strictly against one schema (SCHEMA), with environment overrides for the roots.

```yaml
proxmox: {host: 127.0.0.1, port: 8006, user: root@pam, password_file: /etc/gpu-switch/password,
          verify_ssl: true, ca_file: null, node: pve1}
container: {vmid: 101}
vm: {vmid: 201}
gpus: ["0000:01:00.0", "0000:02:00.0"]      # or: gpu_match: {vendor: "0x10de", class: "0x0300"}
drivers: {host: nvidia, passthrough: vfio-pci}
roots: {sysfs: /sys, proc: /proc, run: /run}
```

SCHEMA below is the one description of the file: every key, its type, its default, whether it is required
and what a valid value is. ``parse_config`` reads a file by it; the role writes the file from one mapping and
has it checked by ``gpu-switch check-config`` before it is put in place; a unit test holds the role's argument
spec to it. A null value means the default, except where a field says null is a value of its own
(``persistenced_unit: null``: no daemon). An unknown key is an error: a typo must not silently fall back to a
default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

try:
    import yaml
except ImportError:  # pragma: no cover - the role installs python3-yaml
    yaml = None

DEFAULT_PATH = "/etc/gpu-switch/config.yml"
# The journal must survive a reboot, so it does not live in /run (a tmpfs) unless the run root was moved.
DEFAULT_STATE = "/var/lib/gpu-switch"
# A full PCI address, domain:bus:slot.function; a short bus:slot.function gets domain 0000.
PCI_ADDRESS = re.compile(r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-1][0-9a-f])\.([0-7])$")
HEX_ID = re.compile(r"^0x[0-9a-f]{4}$")
HEX_CLASS = re.compile(r"^0x[0-9a-f]{2,6}$")
DRIVER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NODE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
TOKEN = re.compile(r"^[A-Za-z][A-Za-z0-9._-]*$")
UNIT = re.compile(r"^[A-Za-z0-9@_.:-]+\.service$")
HOSTPCI_OPTION = re.compile(r"^(pcie|rombar|x-vga)=[01]$|^(romfile)=[A-Za-z0-9._-]+$|^(driver)=(vfio|keep)$")


def normalise_address(text: str) -> str | None:
    """The canonical spelling (0000:01:00.0) of a PCI address, or None if it is not one."""
    m = PCI_ADDRESS.match(str(text).strip().lower())
    if not m:
        return None
    return f"{m.group(1) or '0000'}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


# --- the schema -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One key of the file.

    type: str, path (an absolute path), int, float (a positive number of seconds), bool or list (read by
    parse; elements: the type of its items). choices: the values allowed, if only some are. check/what: a
    test of the typed value and, for the message, what it expects ("'x' is not <what>"). nullable: null is a
    value of its own, not the default. parse: reads the value itself, (value, fail) -> value, where
    fail(message, suffix) names the key (plus suffix, such as "[2]"). env: an environment variable that,
    when set, wins over the file (whose value is then not read).
    """

    type: str
    default: Any = None
    required: bool = False
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any], Any] | None = None
    what: str = ""
    nullable: bool = False
    parse: Callable[[Any, Callable[..., None]], Any] | None = None
    elements: str | None = None
    env: str | None = None


@dataclass(frozen=True)
class Section:
    """A mapping of the file. Absent or null, it holds its fields' defaults; or it is None (optional)."""

    fields: dict[str, Field | Section]
    required: bool = False
    optional: bool = False


def _addresses(value, fail) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        fail("must be a non-empty list of PCI addresses")
    gpus: list[str] = []
    for n, item in enumerate(value):
        address = normalise_address(item) if isinstance(item, str) else None
        if address is None:
            fail(f"{item!r} is not a PCI address (DDDD:BB:SS.F)", f"[{n}]")
        if address in gpus:
            fail(f"{address} is listed twice", f"[{n}]")
        gpus.append(address)
    return tuple(gpus)


def _classes(value, fail) -> tuple[str, ...]:
    classes = [value] if isinstance(value, str) else value
    if (
        not isinstance(classes, list)
        or not classes
        or not all(isinstance(c, str) and HEX_CLASS.match(c.lower()) for c in classes)
    ):
        fail(f"{classes!r} is not a PCI class prefix such as 0x0300 (or a list of them)")
    return tuple(c.lower() for c in classes)


def _hostpci_options(value) -> bool:
    return all(HOSTPCI_OPTION.match(o) for o in value.split(","))


def _path(default: str | None = None, env: str | None = None) -> Field:
    return Field("path", default, check=os.path.isabs, what="an absolute path", env=env)


def _driver(default: str) -> Field:
    return Field("str", default, check=DRIVER.match, what="a driver name")


_VMID = Field("int", required=True, check=lambda v: 100 <= v <= 999_999_999, what="a vmid (>= 100)")

SCHEMA = Section(
    {
        "proxmox": Section(
            {
                "host": Field("str", "127.0.0.1"),
                "port": Field("int", 8006, check=lambda v: 0 < v < 65536, what="a TCP port"),
                "user": Field(
                    "str",
                    "root@pam",
                    check=lambda v: "@" in v and "!" not in v,
                    what="a user@realm (put an API token's name in token_name)",
                ),
                "password_file": _path("/etc/gpu-switch/password"),
                "token_name": Field("str", check=TOKEN.match, what="a token name"),
                "verify_ssl": Field("bool", True),
                "ca_file": _path(),
                "node": Field("str", required=True, check=NODE.match, what="a node name"),
                "timeout": Field("float", 30.0),
            },
            required=True,
        ),
        "container": Section({"vmid": _VMID}, required=True),
        "vm": Section(
            {
                "vmid": _VMID,
                "hostpci_options": Field(
                    "str", "pcie=1", check=_hostpci_options, what="a list of pcie=, rombar=, x-vga=, romfile=, driver="
                ),
            },
            required=True,
        ),
        "gpus": Field("list", elements="str", nullable=True, parse=_addresses),
        "gpu_match": Section(
            {
                "vendor": Field("str", required=True, check=lambda v: HEX_ID.match(v.lower()), what="a 0xNNNN id"),
                "class": Field("list", ("0x0300", "0x0302"), elements="str", nullable=True, parse=_classes),
            },
            optional=True,
        ),
        "drivers": Section({"host": _driver("nvidia"), "passthrough": _driver("vfio-pci")}),
        # Moved by tests and the lab; state defaults to DEFAULT_STATE, or follows a moved run root.
        "roots": Section(
            {
                "sysfs": _path("/sys", "GPU_SWITCH_SYSFS_ROOT"),
                "proc": _path("/proc", "GPU_SWITCH_PROC_ROOT"),
                "run": _path("/run", "GPU_SWITCH_RUN_ROOT"),
                "dev": _path("/dev", "GPU_SWITCH_DEV_ROOT"),
                "state": _path(None, "GPU_SWITCH_STATE_ROOT"),
            }
        ),
        "timeouts": Section(
            {
                "shutdown": Field("float", 120.0),  # a guest's clean shutdown
                "task": Field("float", 600.0),  # any other Proxmox task (a VM with much memory starts slowly)
                "sysfs_write": Field("float", 15.0),  # one write to sysfs; longer means the kernel is stuck
                "command": Field("float", 60.0),  # systemctl, modprobe, nvidia-modprobe
            }
        ),
        "persistenced_unit": Field(
            "str",
            "nvidia-persistenced.service",
            nullable=True,
            check=UNIT.match,
            what="a systemd service name (or null to leave the daemon alone)",
        ),
        "parallel": Field("bool", False),
    }
)

# What each type accepts, and the message for anything else.
_NON_EMPTY = (lambda v: isinstance(v, str) and v != "", "must be a non-empty string")
TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "bool": (lambda v: isinstance(v, bool), "must be true or false"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "must be an integer"),
    "float": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
        "must be a positive number",
    ),
    "str": _NON_EMPTY,
    "path": _NON_EMPTY,
}


# --- the values the rest of the package reads -----------------------------------------------------------


_PROXMOX = SCHEMA.fields["proxmox"].fields


@dataclass(frozen=True)
class ProxmoxConfig:
    """The API login (the defaults are the schema's: code that talks to an API may build one directly)."""

    node: str
    host: str = _PROXMOX["host"].default
    port: int = _PROXMOX["port"].default
    user: str = _PROXMOX["user"].default
    password_file: str = _PROXMOX["password_file"].default
    token_name: str | None = _PROXMOX["token_name"].default
    verify_ssl: bool = _PROXMOX["verify_ssl"].default
    ca_file: str | None = _PROXMOX["ca_file"].default
    timeout: float = _PROXMOX["timeout"].default

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
    shutdown: float
    task: float
    sysfs_write: float
    command: float


@dataclass(frozen=True)
class Roots:
    sysfs: str
    proc: str
    run: str
    dev: str
    state: str


@dataclass(frozen=True)
class Config:
    proxmox: ProxmoxConfig
    container_vmid: int
    vm_vmid: int
    gpus: tuple[str, ...]
    gpu_match: dict[str, Any] | None
    host_driver: str
    passthrough_driver: str
    roots: Roots
    timeouts: Timeouts
    hostpci_options: str
    persistenced_unit: str | None
    parallel: bool
    path: str

    @property
    def lock_path(self) -> str:
        return os.path.join(self.roots.run, "gpu-switch", "lock")

    @property
    def journal_path(self) -> str:
        return os.path.join(self.roots.state, "journal.json")


# --- reading ----------------------------------------------------------------------------------------


def _join(where: str, key: str | None) -> str:
    return f"{where}.{key}" if key and where else key or where


class _Reader:
    """One mapping of the YAML, read by its section of the schema, with errors that name the key."""

    def __init__(self, source: str, data: Any, where: str, section: Section, environ):
        self.source, self.where, self.environ = source, where, environ
        if not isinstance(data, dict):
            self.fail(f"must be a mapping, not {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - set(section.fields))
        if unknown:
            self.fail(f"unknown key {unknown[0]!r} (known: {', '.join(section.fields)})")
        self.data, self.section = data, section

    def fail(self, message: str, key: str | None = None):
        where = _join(self.where, key)
        raise ConfigError(f"config {self.source}: {where + ': ' if where else ''}{message}")

    def read(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for key, spec in self.section.fields.items():
            values[key] = self.field(key, spec) if isinstance(spec, Field) else self.subsection(key, spec)
        return values

    def subsection(self, key: str, spec: Section) -> dict[str, Any] | None:
        data = self.data.get(key)
        if data is None:
            if spec.required:
                self.fail("is required", key)
            if spec.optional:
                return None
            data = {}
        return _Reader(self.source, data, _join(self.where, key), spec, self.environ).read()

    def field(self, key: str, spec: Field) -> Any:
        if spec.env and self.environ.get(spec.env):
            value = self.environ[spec.env]
            if spec.check is not None and not spec.check(value):
                raise ConfigError(f"environment {spec.env}: {value!r} is not {spec.what}")
            return value
        value = self.data.get(key)
        if value is None and not (spec.nullable and key in self.data):
            if spec.required:
                self.fail("is required", key)
            return spec.default

        def fail(message: str, suffix: str = ""):
            self.fail(message, key + suffix)

        if spec.parse is not None:
            return spec.parse(value, fail)
        if value is None:  # a nullable field's own null
            return None
        accepts, words = TYPES[spec.type]
        if not accepts(value):
            fail(f"{words}, not {value!r}")
        if spec.choices is not None and value not in spec.choices:
            fail(f"must be one of {', '.join(map(str, spec.choices))}, not {value!r}")
        if spec.check is not None and not spec.check(value):
            fail(f"{value!r} is not {spec.what}")
        return float(value) if spec.type == "float" else value


def parse_config(data: Any, source: str = DEFAULT_PATH, environ: dict[str, str] | None = None) -> Config:
    """A Config from the parsed YAML; ConfigError (exit 2) with a one-line reason if anything is wrong."""
    environ = os.environ if environ is None else environ
    data = {} if data is None else data
    top = _Reader(source, data, "", SCHEMA, environ)
    if "gpus" in data and "gpu_match" in data:
        top.fail("give either gpus or gpu_match, not both", "gpus")
    values = top.read()

    # What no single field can say.
    proxmox, drivers = values["proxmox"], values["drivers"]
    if proxmox["ca_file"] and not proxmox["verify_ssl"]:
        top.fail("ca_file is set but verify_ssl is false: the CA would be ignored", "proxmox.verify_ssl")
    if values["container"]["vmid"] == values["vm"]["vmid"]:
        top.fail(f"container and vm have the same vmid {values['vm']['vmid']}", "vm.vmid")
    if values["gpus"] is None and values["gpu_match"] is None:
        top.fail("name the GPUs with gpus (PCI addresses) or gpu_match (vendor and class)", "gpus")
    if drivers["host"] == drivers["passthrough"]:
        top.fail("host and passthrough drivers must differ", "drivers.passthrough")

    roots = values["roots"]
    # The journal must survive a reboot, so it does not live in /run (a tmpfs) unless the run root was
    # moved (tests, the lab): then it follows the run root, and nothing is written outside it.
    if roots["state"] is None:
        moved = roots["run"] != SCHEMA.fields["roots"].fields["run"].default
        roots["state"] = os.path.join(roots["run"], "gpu-switch") if moved else DEFAULT_STATE
    match = values["gpu_match"]
    return Config(
        proxmox=ProxmoxConfig(**proxmox),
        container_vmid=values["container"]["vmid"],
        vm_vmid=values["vm"]["vmid"],
        gpus=values["gpus"] or (),
        gpu_match=None if match is None else {"vendor": match["vendor"].lower(), "class": list(match["class"])},
        host_driver=drivers["host"],
        passthrough_driver=drivers["passthrough"],
        roots=Roots(**roots),
        timeouts=Timeouts(**values["timeouts"]),
        hostpci_options=values["vm"]["hostpci_options"],
        persistenced_unit=values["persistenced_unit"],
        parallel=values["parallel"],
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
