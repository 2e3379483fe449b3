"""What the controller's preflight reads: each host's variables, the inventory's files, the roles' specs.

``HostView`` is one host's variables as the run will see them; ``VariableFiles`` finds the file that sets a
variable (for the refusal's first words); ``load_role`` reads a role's argument spec, the names it declares and
its value rules (``meta/rules.yml``); ``show`` is how a value appears in a refusal, secrets never rendered.
The names that only the inventory sets (``INVENTORY_NAMES``) and those the roles read no more (``RENAMED``)
are here too. Nothing here imports Ansible's controller code: the unit tests feed it plain data.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

import yaml

from preflight import rules as role_rules
from preflight.rules import UNSET, Unset  # noqa: F401 - the one "not set" of both preflights

# The roles are the folders of roles/ with an argument spec: each one's variables start with its name.
ROLES_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "roles"
)


# The wiring from a site's data to the roles' variables, with the playbooks (a playbook's group_vars/all).
WIRING_FILE = os.path.join(os.path.dirname(ROLES_DIR), "playbooks", "group_vars", "all", "wiring.yml")


def load_wiring(path=WIRING_FILE) -> dict:
    """{role variable: its template} of the wiring file (empty when there is none)."""
    data = load_yaml(path) if os.path.isfile(path) else {}
    return data if isinstance(data, dict) else {}


def role_names(roles_dir=ROLES_DIR) -> list[str]:
    """The project's roles, from the roles themselves."""
    return sorted(
        name
        for name in os.listdir(roles_dir)
        if os.path.isfile(os.path.join(roles_dir, name, "meta", "argument_specs.yml"))
    )


ROLE_PREFIXES = tuple(f"{name}_" for name in role_names())
PROJECT_PREFIX = "inferhost_"

# Names an inventory (or the command line) may set that no role declares: the shared data the inventory
# hands to several roles, and the playbooks' own parameters. docs/preflight.md lists them with their use.
INVENTORY_NAMES = {
    "inferhost_gpus": "the host's GPUs: [{address: 0000:01:00.0, numa_node: 0}, ...] (host_vars/<host>/hardware.yml)",
    "inferhost_host_has_swap": "whether the host runs with swap (host_vars/<host>/hardware.yml)",
    "inferhost_cpu_vendor": "amd or intel (host_vars/<host>/hardware.yml)",
    "inferhost_proxmox": "the two guests' ids on the Proxmox host (host_vars/<host>/proxmox.yml)",
    "inferhost_nvidia_driver_version": "the one driver pin of every tier (group_vars/all/versions.yml)",
    "inferhost_cuda_versions": "the CUDA toolkits of the guests (group_vars/all/versions.yml)",
    "inferhost_cuda_default": "the default CUDA toolkit of the guests (group_vars/all/versions.yml)",
    "inferhost_pve_host": "the Proxmox host a guest runs on (host_vars/<guest>/guest.yml)",
    "inferhost_guest_group": "playbooks/guests.yml: the group of guests to configure",
    "inferhost_guest_boot_timeout": "playbooks/tasks/guest_power.yml: seconds a guest reported running gets to answer",
    "inferhost_preflight_hosts": "playbooks/preflight.yml: the hosts the run will touch",
    "inferhost_preflight_role_specs": "playbooks/preflight.yml: false where the playbook runs no role",
    "gpu_switch_to": "playbooks/gpu_switch.yml: vm or ct (-e)",
    "gpu_switch_hosts": "playbooks/gpu_switch.yml: the hosts whose GPUs move, a host pattern (-e)",
    "gpu_switch_force": "playbooks/gpu_switch.yml: stop a guest that does not shut down in time (-e)",
}

# Names the roles read no more, each with the one that replaced it. Ansible would ignore an inventory that still
# sets one, and the role would run with its default: refused here, naming the new variable.
RENAMED = {
    # One name for each Proxmox API connection setting, role pve_api's, read by pve_guest_gpu and gpu_switch.
    "gpu_switch_proxmox_host": "pve_api_host",
    "gpu_switch_proxmox_port": "pve_api_port",
    "gpu_switch_proxmox_user": "pve_api_user",
    "gpu_switch_proxmox_password": "pve_api_password",
    "gpu_switch_proxmox_token_name": "pve_api_token_id (its secret in pve_api_token_secret)",
    "gpu_switch_proxmox_node": "pve_api_node",
    "gpu_switch_proxmox_verify_ssl": "pve_api_validate_certs",
    "gpu_switch_proxmox_ca_file": "pve_api_ca_path",
    "gpu_switch_proxmox_ca_content": "pve_api_ca_content",
    "gpu_switch_proxmox_timeout": "pve_api_timeout",
    "pve_guest_gpu_api_host": "pve_api_host",
    "pve_guest_gpu_api_port": "pve_api_port",
    "pve_guest_gpu_api_user": "pve_api_user",
    "pve_guest_gpu_api_password": "pve_api_password",
    "pve_guest_gpu_api_token_id": "pve_api_token_id",
    "pve_guest_gpu_api_token_secret": "pve_api_token_secret",
    "pve_guest_gpu_api_backend": "pve_api_backend",
    "pve_guest_gpu_api_timeout": "pve_api_timeout",
    "pve_guest_gpu_api_packages": "pve_api_packages",
    "pve_guest_gpu_api_runner": "pve_guest_gpu_delegate_to",
    "pve_guest_gpu_validate_certs": "pve_api_validate_certs",
    "pve_guest_gpu_ca_path": "pve_api_ca_path",
    "pve_guest_gpu_node": "pve_api_node",
    # The Python a role installs is found by its import name on Ansible's module_utils path (the action
    # config_files' packages), no more by a directory of the controller's checkout.
    "gpu_switch_source_dir": "gpu_switch_lib_modules (import names such as gpu_switch, not a directory)",
    "inference_service_guard_source_dir": "inference_service_guard_lib_modules (import names such as inference, "
    "not a directory)",
    # A switch is a verb phrase saying what the role does when it is true (docs/layout.md, "Names").
    "cuda_toolkit_profile": "cuda_toolkit_write_profile",
    "cuda_toolkit_ldconfig": "cuda_toolkit_run_ldconfig",
    "gpu_switch_parallel": "gpu_switch_move_in_parallel",
    "inference_service_engine_check": "inference_service_check_engine",
    "inference_service_wait": "inference_service_wait_until_served",
    "nccl_tuning_state": "nccl_tuning_install (true for present, false for absent)",
    "nvidia_userspace_enabled": "nvidia_userspace_install",
    "pve_host_gpu_driver_change_allowed": "pve_host_gpu_allow_driver_change",
    "pve_host_gpu_driver_install": "pve_host_gpu_install_driver",
    "pve_host_gpu_nvidia_repo_enabled": "pve_host_gpu_add_nvidia_repo",
    "pve_host_gpu_iommu_passthrough": "pve_host_gpu_use_iommu_passthrough",
    "pve_host_gpu_persistenced": "pve_host_gpu_run_persistenced",
    "pve_host_gpu_device_nodes_modeset": "pve_host_gpu_create_modeset_node",
    "pve_host_gpu_swap_expected": "pve_host_gpu_allow_swap",
    "pve_host_gpu_iommu_group_check": "pve_host_gpu_check_iommu_groups",
}
# Local facts published under a new name (ansible_local.<name>, role pve_host_gpu's), each with the new one. A
# template that still reads the former name renders its default once the host has run: refused here, naming the new.
RENAMED_FACTS = {"inferhost_gpus": "inferhost_gpu_facts"}
# The keys inferhost_proxmox holds, and those that moved out of it to role pve_api's variables.
PROXMOX_KEYS = ("container_vmid", "vm_vmid")
PROXMOX_MOVED = {
    "api_host": "pve_api_host",
    "api_port": "pve_api_port",
    "api_user": "pve_api_user",
    "api_password": "pve_api_password",
    "verify_ssl": "pve_api_validate_certs",
    "ca_file": "pve_api_ca_path",
    "node": "pve_api_node",
}

SECRET_NAME = re.compile(r"^vault_|password|passwd|token|api_key|secret", re.I)
SECRET_SHOWN = "(secret)"
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]$")
DRIVER_VERSION = re.compile(r"^[0-9]{3}\.[0-9]{2,3}\.[0-9]{2,3}$")
VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")


class TemplateFailure(Exception):
    """A variable whose template cannot be rendered; the text is Ansible's."""


@dataclass
class Problem:
    variable: str
    given: str
    expected: str
    fix: str
    hosts: list[str] = field(default_factory=list)
    file: str | None = None

    def line(self) -> str:
        where = f"{self.file}: " if self.file else ""
        hosts = f" ({', '.join(sorted(self.hosts))})" if self.hosts else ""
        return f"{where}{self.variable}{hosts}: given {self.given}; expected {self.expected}. Fix: {self.fix}."


class HostView:
    """One host's variables as the run will see them.

    names: every variable name the host has (inventory, extra vars, cached facts); get: name -> value, which
    raises TemplateFailure when the value's template cannot be rendered; raw: name -> the value as written.
    """

    def __init__(self, name, names, get, groups=(), raw=None):
        self.name = name
        self.names = set(names)
        self._get = get
        self.raw = raw or (lambda name: "")
        self.groups = set(groups)
        self._cache = {}

    def has(self, name):
        return name in self.names

    def value(self, name, default=UNSET):
        if name not in self.names:
            return default
        if name not in self._cache:
            try:
                self._cache[name] = ("ok", self._get(name))
            except TemplateFailure as exc:
                self._cache[name] = ("error", str(exc))
        state, value = self._cache[name]
        if state == "error":
            raise TemplateFailure(value)
        return value


# --- secrets --------------------------------------------------------------------------------------


def is_secret_name(name) -> bool:
    return bool(SECRET_NAME.search(str(name)))


def mask(value):
    """A copy of value with every secret-named key's value replaced."""
    if isinstance(value, dict):
        return {k: (SECRET_SHOWN if is_secret_name(k) else mask(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask(v) for v in value]
    return value


def show(value, name="", secrets=(), limit=160) -> str:
    """How a value is shown in a message: JSON-like, secrets replaced, long values cut."""
    if value is UNSET:
        return "nothing (not set)"
    if value in ("", None):
        return "nothing (empty)"  # an empty secret shows nothing of it
    if is_secret_name(name):
        return SECRET_SHOWN
    try:
        text = json.dumps(mask(value), default=str, sort_keys=False)
    except (TypeError, ValueError):
        text = repr(value)
    for secret in secrets:
        text = text.replace(secret, SECRET_SHOWN)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def secret_values(views) -> list[str]:
    """Every non-trivial string that a secret-named variable of any host holds, longest first."""
    found = set()

    def collect(value, secret):
        if isinstance(value, dict):
            for k, v in value.items():
                collect(v, secret or is_secret_name(k))
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v, secret)
        elif secret and isinstance(value, str) and len(value) >= 3:
            found.add(value)

    for view in views:
        for name in view.names:
            if not (is_secret_name(name) or name.startswith((PROJECT_PREFIX, *ROLE_PREFIXES))):
                continue
            try:
                collect(view.value(name), is_secret_name(name))
            except TemplateFailure:
                continue
    return sorted(found, key=len, reverse=True)


# --- the inventory's files ------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """YAML as Ansible reads inventory files: !vault and !unsafe values are opaque strings here."""


def _opaque(loader, suffix, node):
    return "" if isinstance(node, yaml.ScalarNode) else None


_Loader.add_multi_constructor("!", _opaque)


def load_yaml(path):
    """The file's data; raises ValueError naming the file, the line and the column on a YAML error."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{relative(path)}:{mark.line + 1}:{mark.column + 1}" if mark else relative(path)
        raise ValueError(f"{where}: YAML error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{relative(path)}: YAML error: {exc}") from None


def relative(path) -> str:
    path = os.path.abspath(path)
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _vars_files(directory, entity):
    """The files Ansible reads for an entity under group_vars/ or host_vars/: <entity>[.yml] or <entity>/**."""
    out = []
    for ext in VARS_EXTENSIONS:
        candidate = os.path.join(directory, entity + ext)
        if os.path.isfile(candidate):
            out.append(candidate)
    folder = os.path.join(directory, entity)
    if os.path.isdir(folder):
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            out += [
                os.path.join(root, f)
                for f in sorted(files)
                if not f.startswith(".") and os.path.splitext(f)[1] in VARS_EXTENSIONS
            ]
    return out


def inventory_dirs(sources):
    """The directories an inventory's group_vars/ and host_vars/ live in, from the inventory sources."""
    out = []
    for source in sources or []:
        if "," in str(source) and not os.path.exists(source):
            continue  # a host list such as "a,b,"
        directory = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
        if directory not in out:
            out.append(directory)
    return out


def yaml_errors(directories) -> list[str]:
    """Every YAML error in the inventory files (hosts files, group_vars, host_vars), with file and line."""
    errors = []
    for directory in directories:
        paths = [os.path.join(directory, f) for f in sorted(os.listdir(directory)) if f.endswith((".yml", ".yaml"))]
        for kind in ("group_vars", "host_vars"):
            sub = os.path.join(directory, kind)
            if os.path.isdir(sub):
                for entry in sorted(os.listdir(sub)):
                    paths += _vars_files(
                        sub, os.path.splitext(entry)[0] if os.path.isfile(os.path.join(sub, entry)) else entry
                    )
        for path in dict.fromkeys(paths):
            try:
                load_yaml(path)
            except ValueError as exc:
                errors.append(str(exc))
    return errors


class VariableFiles:
    """Which inventory file sets a variable for a host (the most specific one wins, as in Ansible)."""

    def __init__(self, directories):
        self.directories = directories
        self._cache = {}

    def _keys(self, kind, entity):
        key = (kind, entity)
        if key not in self._cache:
            found = {}
            for directory in self.directories:
                for path in _vars_files(os.path.join(directory, kind), entity):
                    try:
                        data = load_yaml(path)
                    except ValueError:
                        continue
                    if isinstance(data, dict):
                        for name in data:
                            found[str(name)] = relative(path)
            self._cache[key] = found
        return self._cache[key]

    def _hosts_files(self, host):
        found = {}
        for directory in self.directories:
            for entry in sorted(os.listdir(directory)):
                path = os.path.join(directory, entry)
                if entry.endswith((".yml", ".yaml")) and os.path.isfile(path):
                    try:
                        data = load_yaml(path)
                    except ValueError:
                        continue
                    for name in _inline_host_vars(data, host):
                        found[name] = relative(path)
        return found

    def file_of(self, name, host, groups):
        """The file that sets name for host, or None (an extra var, a fact, a role default)."""
        for entity_kind, entity in (
            [("host_vars", host)] + [("group_vars", g) for g in groups] + [("group_vars", "all")]
        ):
            found = self._keys(entity_kind, entity).get(name)
            if found:
                return found
        return self._hosts_files(host).get(name)


def _inline_host_vars(data, host):
    """Variable names set for host inside a YAML hosts file (hosts: {host: {vars}}, vars: of its groups)."""
    names = set()

    def walk(group):
        if not isinstance(group, dict):
            return False
        hosts = group.get("hosts") or {}
        here = isinstance(hosts, dict) and host in hosts
        if here and isinstance(hosts[host], dict):
            names.update(str(k) for k in hosts[host])
        below = (
            any(walk(child) for child in (group.get("children") or {}).values())
            if isinstance(group.get("children"), dict)
            else False
        )
        if (here or below) and isinstance(group.get("vars"), dict):
            names.update(str(k) for k in group["vars"])
        return here or below

    if isinstance(data, dict):
        for group in data.values():
            walk(group)
    return names


# --- role specs -----------------------------------------------------------------------------------


def load_role(role_dir):
    """A role's argument spec options (main entry point) and the names its defaults and vars declare."""
    spec_file = os.path.join(role_dir, "meta", "argument_specs.yml")
    options = {}
    if os.path.isfile(spec_file):
        data = load_yaml(spec_file) or {}
        options = ((data.get("argument_specs") or {}).get("main") or {}).get("options") or {}
    declared = set(options)
    for sub in ("defaults", "vars"):
        folder = os.path.join(role_dir, sub)
        if os.path.isdir(folder):
            for entry in sorted(os.listdir(folder)):
                if entry.endswith((".yml", ".yaml")):
                    data = load_yaml(os.path.join(folder, entry))
                    if isinstance(data, dict):
                        declared.update(str(k) for k in data)
    return options, declared


def expected_of(option) -> str:
    """What an argument spec option expects, in words."""
    kind = option.get("type", "str")
    text = {"str": "a string", "int": "an integer", "bool": "true or false", "list": "a list", "dict": "a mapping"}.get(
        kind, f"a {kind}"
    )
    if kind == "list" and option.get("elements"):
        text += f" of {option['elements']}s"
    if option.get("choices"):
        text = "one of " + ", ".join(str(c) for c in option["choices"])
    return text


def load_rules(role_dir) -> list:
    """A role's value rules (meta/rules.yml), the same the role's own preflight runs."""
    return role_rules.load(role_dir, load_yaml)
