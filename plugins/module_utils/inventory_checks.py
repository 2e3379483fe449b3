"""Checks of the whole inventory on the controller, before any play changes anything.

The validation play (playbooks/preflight.yml, action ``inferhost_preflight``) hands this module what the
run will touch: each host's variables (as a ``HostView``), the roles each host will run and their argument
specs. It returns ``Problem`` objects, each naming the variable, the inventory file it comes from, what was
given, what was expected and one fix that is itself valid. Four kinds of checks:

* every role's argument spec, applied up front to the variables each host sets for the roles it runs;
* the YAML traps that argument spec lets through, converting them without a word: a string where a list is
  meant, a number where a string is meant (3.10 unquoted is 3.1), a partial mapping of an option whose keys all
  have defaults (``check_yaml_traps``);
* every variable with a role's prefix (or the project's ``inferhost_``) that nothing declares: refused,
  with the closest known name (or, for a name the roles read no more, the one that replaced it: ``RENAMED``),
  since Ansible itself ignores a misspelt variable without a word;
* the cross-checks no single role can make (GPU addresses against each other and the host's published
  inventory, service GPU lists against the host's GPUs, the guest's driver against the host's pin, a
  service's environment against the guest's environments, a build's cuda_home against its toolkits), and
  the value checks the roles' own preflight tasks make, hoisted here so that they stop the run before the
  first change instead of after earlier roles have run.

Nothing here imports Ansible's controller code or reaches a machine: the unit tests feed it plain data.
Secret values (``vault_*``, ``*password*``, ``*token*``, ``*api_key*``, ``*secret*``) are never rendered.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field

import yaml

try:  # plugins/module_utils on sys.path: the action plugin and the unit tests both put it there
    from inference import plan as service_plan
except ImportError:  # pragma: no cover - only without the project's module_utils
    service_plan = None

ROLE_PREFIXES = (
    "pve_api_",
    "pve_host_gpu_",
    "pve_guest_gpu_",
    "gpu_switch_",
    "nvidia_userspace_",
    "cuda_toolkit_",
    "python_env_",
    "source_build_",
    "nccl_tuning_",
    "inference_service_",
)
PROJECT_PREFIX = "inferhost_"

# Names an inventory (or the command line) may set that no role declares: the shared data the inventory
# hands to several roles, and the playbooks' own parameters. docs/preflight.md lists them with their use.
INVENTORY_NAMES = {
    "inferhost_gpus": "the host's GPUs: [{address: 0000:01:00.0, numa_node: 0}, ...] (host_vars/<host>/hardware.yml)",
    "inferhost_host_has_swap": "whether the host runs with swap (host_vars/<host>/hardware.yml)",
    "inferhost_cpu_vendor": "amd or intel (host_vars/<host>/hardware.yml)",
    "inferhost_proxmox": "the two guests' ids on the Proxmox host (group_vars/all/proxmox.yml)",
    "inferhost_nvidia_driver_version": "the one driver pin of every tier (group_vars/all/versions.yml)",
    "inferhost_cuda_versions": "the CUDA toolkits of the guests (group_vars/all/versions.yml)",
    "inferhost_cuda_default": "the default CUDA toolkit of the guests (group_vars/all/versions.yml)",
    "inferhost_pve_host": "the Proxmox host a guest runs on (group_vars/inference_guests/guest.yml)",
    "inferhost_guest_group": "playbooks/guests.yml: the group of guests to configure",
    "inferhost_guest_boot_timeout": "playbooks/tasks/guest_power.yml: seconds a guest reported running gets to answer",
    "inferhost_preflight_hosts": "playbooks/preflight.yml: the hosts the run will touch",
    "inferhost_preflight_role_specs": "playbooks/preflight.yml: false where the playbook runs no role",
    "gpu_switch_to": "playbooks/gpu_switch.yml: vm or ct (-e)",
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
}
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
CUDA_VERSION = re.compile(r"^[0-9]+\.[0-9]+$")
CAPABILITY = re.compile(r"^[0-9]+\.[0-9]$")
SHORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
NCCL_NAME = re.compile(r"^NCCL_[A-Z0-9_]+$")
NCCL_VALUE = re.compile(r"^[A-Za-z0-9_.,:;^=+/-]+$")
MODULE_NAME = re.compile(r"^[a-z0-9_]+$")
MODULE_PARAM = re.compile(r"^[A-Za-z0-9_]+$")
VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")


class Unset:
    """What a HostView returns for a name the host does not set."""

    def __repr__(self):
        return "(not set)"


UNSET = Unset()


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
    if is_secret_name(name):
        return SECRET_SHOWN
    if value is UNSET:
        return "nothing (not set)"
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


# --- the checks -----------------------------------------------------------------------------------


class Checker:
    """Every check over the hosts of a run.

    views: {host: HostView} of every inventory host (cross-checks read a guest's Proxmox host); targets: the
    hosts the run touches; roles: {host: [role, ...]}; specs: {role: options}; declared: every name any role
    declares; provided: names the playbooks set themselves (not inventory data); files: a VariableFiles;
    validator: (options, params) -> [(option, message)], the argument spec check; known_bad: the inference
    service role's known-bad matrix.
    """

    def __init__(
        self, views, targets, roles, specs, declared, *, provided=(), files=None, validator=None, known_bad=()
    ):
        self.views = views
        self.known_bad = list(known_bad)
        self.targets = [h for h in targets if h in views]
        self.roles = roles
        self.specs = specs
        self.known = set(declared) | set(INVENTORY_NAMES) | set(provided)
        self.provided = set(provided)
        self.files = files
        self.validator = validator
        self.secrets = secret_values(views.values())
        self.problems: list[Problem] = []
        self._reported = set()
        # (host, variable) whose template failed: nothing more is said about them (the cause is reported).
        self._failed = set()
        # Names offered as the fix of a misspelt one: a template reading them fails for that reason alone.
        self._suggested = set()

    # reporting

    def refuse(self, host, variable, given, expected, fix, root=None):  # noqa: PLR0917 - a problem's parts, in order
        """One problem; root is the top-level variable (for the file), variable may be a path inside it."""
        root = root or variable.split("[")[0].split(".")[0]
        if (host, root) in self._failed:
            return
        for problem in self.problems:
            if (problem.variable, problem.expected, problem.given) == (variable, expected, given):
                if host not in problem.hosts:
                    problem.hosts.append(host)
                self._reported.add((host, root))
                return
        view = self.views.get(host)
        file = self.files.file_of(root, host, sorted(view.groups, reverse=True)) if self.files and view else None
        self.problems.append(Problem(variable, given, expected, fix, [host], file))
        self._reported.add((host, root))

    def shown(self, value, name=""):
        return show(value, name, self.secrets)

    def value(self, host, name, default=UNSET):
        """The host's value of name, or default; a template that fails is reported once and gives default."""
        view = self.views[host]
        try:
            return view.value(name, default)
        except TemplateFailure as exc:
            # A template that fails because a variable it reads was refused already is no second problem.
            raw = str(view.raw(name))
            reported = {r for h, r in self._reported if h == host} | self._suggested
            causes = [r for r in reported if re.search(rf"\b{re.escape(r)}\b", raw)]
            if (host, name) not in self._reported and not causes:
                text = str(exc)
                for secret in self.secrets:
                    text = text.replace(secret, SECRET_SHOWN)
                self.refuse(
                    host,
                    name,
                    "a value whose template fails (" + text.splitlines()[0][:200] + ")",
                    "a value the template can render",
                    "fix the variables its template reads",
                )
            self._failed.add((host, name))
            return default

    # the checks

    def run(self) -> list[Problem]:
        # Misspelt names and the shared data first: what fails because of them is not reported again.
        for host in self.targets:
            self.check_unknown(host)
        for host in self.targets:
            self.check_shared(host)
        for host in self.targets:
            self.check_specs(host)
            self.check_host_gpus(host)
            self.check_guest(host)
            self.check_role_values(host)
            self.check_services(host)
            # Last: a variable (or a path inside one) that a check above named already is not named again.
            self.check_yaml_traps(host)
        return self.problems

    def check_unknown(self, host):
        view = self.views[host]
        for name in sorted(view.names):
            if name.startswith("__") or not name.startswith((PROJECT_PREFIX, *ROLE_PREFIXES)):
                continue
            if name in RENAMED:
                self.refuse(
                    host,
                    name,
                    self.shown(self.value(host, name, None), name),
                    "a variable some role declares (the roles read this one no more)",
                    f"rename it to {RENAMED[name]} (docs/roles/)",
                )
                continue
            if name in self.known:
                continue
            close = difflib.get_close_matches(name, sorted(self.known), n=1, cutoff=0.6)
            self._suggested.update(close)
            fix = f"rename it to {close[0]}" if close else "remove it, or name a variable of a role (docs/roles/)"
            self.refuse(
                host, name, self.shown(self.value(host, name, None), name), "a variable some role declares", fix
            )

    def check_specs(self, host):
        if self.validator is None:
            return
        for role in self.roles.get(host, []):
            options = self.specs.get(role) or {}
            params = {}
            for name, option in options.items():
                if name in self.provided:
                    continue
                value = self.value(host, name)
                if value is not UNSET:
                    params[name] = value
                elif option.get("required") and option.get("default") is None:
                    self.refuse(
                        host,
                        name,
                        "nothing (not set)",
                        expected_of(option),
                        f"set {name} in the inventory (docs/roles/{role}.md)",
                    )
            checkable = {k: v for k, v in options.items() if k in params}
            for name, said in self.validator(checkable, params):
                option = options.get(name, {})
                message = said
                for secret in self.secrets:
                    message = message.replace(secret, SECRET_SHOWN)
                expected, fix = self._spec_words(name, option, message)
                self.refuse(host, name, self.shown(params.get(name, UNSET), name), expected, fix)

    def check_yaml_traps(self, host):
        """What Ansible's argument spec check converts without a word, for every option of the roles the host runs
        (and the options inside list entries and mappings): a string where a list is meant (split at its commas),
        a number where a string is meant (3.10 unquoted is the number 3.1, turned into "3.1"), and a mapping that
        gives some of the keys of an option whose keys all have documented defaults (the role reads every key of
        the mapping it is given, and fails on the missing ones after earlier tasks have changed the host)."""
        for role in self.roles.get(host, []):
            for name, option in (self.specs.get(role) or {}).items():
                if name in self.provided or not isinstance(option, dict):
                    continue
                value = self.value(host, name)
                if value is not UNSET and not self._from_refused(host, name):
                    self._trap(host, name, name, name, option, value)

    def _trap(self, host, root, label, key, option, value):  # noqa: PLR0913, PLR0917 - where, and what
        """The traps of one value against its option; label is the path to it, key the name a fix writes."""
        if self._named(host, root, label) or is_secret_name(key):
            return  # a secret's fix would show its value; the argument spec check still applies to it
        kind = option.get("type", "str")
        if kind == "list" and isinstance(value, str):
            items = [i.strip() for i in value.split(",") if i.strip()]
            if option.get("elements") == "int":
                items = [int(i) if _int_like(i) else i for i in items]
            self.refuse(
                host,
                label,
                f"{self.shown(value, key)} (a string)",
                f"a YAML list{_of_elements(option)}: a string is not a list (Ansible's list type splits it at its "
                "commas without a word)",
                self._masked(f"{key}: {_flow(items)}"),
                root=root,
            )
        elif kind == "list" and isinstance(value, list):
            if option.get("elements") == "str" and any(isinstance(i, float) for i in value):
                self.refuse(
                    host,
                    label,
                    self.shown(value, key),
                    "a list of quoted strings: unquoted, YAML reads 12.10 as the number 12.1",
                    self._masked(f"{key}: {json.dumps([str(i) if isinstance(i, float) else i for i in value])}"),
                    root=root,
                )
            elif option.get("elements") == "dict" and option.get("options"):
                for index, entry in enumerate(value):
                    if isinstance(entry, dict):
                        self._trap_entries(host, root, f"{label}[{index}]", option["options"], entry)
        elif kind == "dict" and isinstance(value, dict) and option.get("options"):
            suboptions = option["options"]
            missing = [k for k in suboptions if k not in value]
            documented = all(
                isinstance(sub, dict) and sub.get("default") is not None and not sub.get("required")
                for sub in suboptions.values()
            )
            if missing and documented:
                whole = {k: value.get(k, sub["default"]) for k, sub in suboptions.items()}
                whole.update({k: v for k, v in value.items() if k not in whole})
                self.refuse(
                    host,
                    label,
                    self.shown(value, key),
                    f"every key of the mapping ({', '.join(suboptions)}); {', '.join(missing)} missing: the role "
                    "reads each key and does not fill a partial mapping from its defaults",
                    self._masked(f"{key}: {_flow(mask(whole))}"),
                    root=root,
                )
                return
            self._trap_entries(host, root, label, suboptions, value)
        elif kind == "str" and isinstance(value, float):
            self.refuse(
                host,
                label,
                f"{self.shown(value, key)} (a number)",
                'a quoted string: YAML reads an unquoted 3.10 as the number 3.1, and Ansible passes it on as "3.1"',
                f'{key}: "{value}" (quoted, with every digit meant)',
                root=root,
            )

    def _masked(self, text):
        """A fix that writes given values, with any secret value of the inventory in it replaced."""
        for secret in self.secrets:
            text = text.replace(secret, SECRET_SHOWN)
        return text

    def _trap_entries(self, host, root, label, suboptions, entry):
        for key, sub in suboptions.items():
            if key in entry and isinstance(sub, dict):
                self._trap(host, root, f"{label}.{key}", key, sub, entry[key])

    def _from_refused(self, host, name):
        """Whether name's value is a template that reads a variable refused already (the problem is named there:
        inferhost_cuda_versions, not the cuda_toolkit_versions that the inventory wires from it)."""
        raw = self.views[host].raw(name)
        if not (isinstance(raw, str) and "{{" in raw):
            return False
        return any(h == host and re.search(rf"\b{re.escape(r)}\b", raw) for h, r in self._reported)

    def _named(self, host, root, label):
        """Whether a problem names label (or a path that holds it) for host already, or its template failed."""
        if (host, root) in self._failed:
            return True
        for problem in self.problems:
            if host in problem.hosts and (
                problem.variable == label or label.startswith((problem.variable + "[", problem.variable + "."))
            ):
                return True
        return False

    @staticmethod
    def _spec_words(name, option, message):
        """What a failed argument spec check expected, and the fix, for the option or the field inside it."""
        inner = re.search(r"(?:value of|option) '?([A-Za-z0-9_]+)'? .*found in '?([A-Za-z0-9_]+)", message)
        if inner and inner.group(2) == name:
            field_name = inner.group(1)
            sub = _find_option(option.get("options") or {}, field_name) or {}
            choices = re.search(r"must be one of: (.*?), got:", message)
            expected = f"{field_name} {'one of ' + choices.group(1) if choices else expected_of(sub)} in each entry"
            fix = (
                f"{field_name}: {choices.group(1).split(',')[0].strip()}"
                if choices
                else f"give {field_name} as {expected_of(sub)}"
            )
            return expected, fix
        if "missing required" in message:
            return message, f"add the missing field to each entry of {name} (docs/roles/)"
        expected = expected_of(option) if "convert" in message or "must be one of" in message else message
        fix = f"give {name} as {expected_of(option)}"
        if option.get("default") not in (None, "", [], {}):
            fix += f" (the role's default is {show(option['default'])})"
        return expected, fix

    def check_shared(self, host):
        """The inventory-level data several roles read: refused here with its own name, not a role's."""
        self._matches(
            host,
            "inferhost_nvidia_driver_version",
            DRIVER_VERSION,
            "a driver version such as 590.48.01 (branch.minor.patch, as a string)",
            'quote the exact version: inferhost_nvidia_driver_version: "590.48.01"',
        )
        cudas = self.value(host, "inferhost_cuda_versions")
        if cudas is not UNSET:
            self._check_cuda(host, "inferhost_cuda_versions", cudas, "inferhost_cuda_default")
        gpus = self.value(host, "inferhost_gpus")
        if gpus is not UNSET:
            self._check_gpu_list(host, "inferhost_gpus", gpus)
        proxmox = self.value(host, "inferhost_proxmox")
        if proxmox is not UNSET:
            self._check_proxmox(host, proxmox)
        pve = self.value(host, "inferhost_pve_host")
        if pve is not UNSET and pve not in self.views:
            hosts = sorted(h for h, v in self.views.items() if "pve_hosts" in v.groups) or sorted(self.views)
            close = difflib.get_close_matches(str(pve), hosts, n=1, cutoff=0.0)
            self.refuse(
                host,
                "inferhost_pve_host",
                self.shown(pve),
                f"a host of the inventory ({', '.join(hosts)})",
                f"inferhost_pve_host: {close[0] if close else hosts[0]}",
            )
        vendor = self.value(host, "inferhost_cpu_vendor")
        if vendor is not UNSET and vendor not in ("amd", "intel", "auto"):
            self.refuse(
                host, "inferhost_cpu_vendor", self.shown(vendor), "amd, intel or auto", "inferhost_cpu_vendor: auto"
            )
        swap = self.value(host, "inferhost_host_has_swap")
        if swap is not UNSET and not isinstance(swap, bool):
            self.refuse(
                host,
                "inferhost_host_has_swap",
                self.shown(swap),
                "true or false",
                "inferhost_host_has_swap: false (or true when the host has swap)",
            )

    def _check_cuda(self, host, name, versions, default_name):
        if not isinstance(versions, list) or not all(isinstance(v, str) and CUDA_VERSION.match(v) for v in versions):
            self.refuse(
                host,
                name,
                self.shown(versions),
                'a list of quoted X.Y versions such as ["12.8", "13.0"] (unquoted, 13.0 is the number 13)',
                f'{name}: ["12.8", "13.0"]',
            )
            return
        if len(set(versions)) != len(versions):
            self.refuse(
                host, name, self.shown(versions), "distinct versions", f"{name}: {json.dumps(sorted(set(versions)))}"
            )
        default = self.value(host, default_name)
        if default not in (UNSET, "") and default not in versions:
            self.refuse(
                host,
                default_name,
                self.shown(default),
                f"one of {name} ({', '.join(versions)}) or empty",
                f'{default_name}: "{versions[-1]}"' if versions else f'{default_name}: ""',
            )

    def _check_gpu_list(self, host, name, gpus):
        example = '[{address: "0000:01:00.0", numa_node: 0}, ...], one entry per GPU (lspci -D -d 10de:)'
        if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
            kind = _kind(gpus) if not isinstance(gpus, list) else "a list with entries that are not mappings"
            self.refuse(
                host,
                name,
                f"{self.shown(gpus)} ({kind})",
                f"a list of mappings {example}",
                f"write {name} as {example}",
            )
            return
        seen = {}
        for index, gpu in enumerate(gpus):
            address = str(gpu.get("address", ""))
            wrong = None  # (given, expected, fix)
            if not PCI_ADDRESS.match(address):
                wrong = (
                    self.shown(gpu.get("address", UNSET)),
                    "the PCI address of the GPU's first function, such as 0000:01:00.0 (lower-case hex)",
                    f"copy the address from `lspci -D -d 10de:` on {host}",
                )
            elif not address.endswith(".0"):
                # An audio (or other) function of the GPU: the roles bind and move every function of the device
                # named by its function 0.
                first = address[:-1] + "0"
                listed = [i for i, g in enumerate(gpus) if str(g.get("address", "")) == first]
                wrong = (
                    self.shown(address),
                    f"the GPU's function 0 ({first}): a GPU is named by its first function, and its audio and "
                    "other functions come along with it",
                    f"remove entry {index} (entry {listed[0]} names the GPU)" if listed else f'address: "{first}"',
                )
            elif address in seen:
                wrong = (
                    self.shown(address),
                    f"each GPU once (entry {seen[address]} already names {address})",
                    f"remove entry {index}, or give it the address of another GPU from `lspci -D -d 10de:`",
                )
            else:
                seen[address] = index
            if wrong:
                self.refuse(host, f"{name}[{index}].address", *wrong, root=name)
            numa = gpu.get("numa_node", 0)
            if isinstance(numa, bool) or not isinstance(numa, int) or numa < -1:
                self.refuse(
                    host,
                    f"{name}[{index}].numa_node",
                    self.shown(numa),
                    "the GPU's NUMA node as a number (0, 1, ...)",
                    f"cat /sys/bus/pci/devices/{address or '<address>'}/numa_node on {host}",
                    root=name,
                )
        published = self._published_gpus(host)
        if published:
            missing = [a for a in seen if a not in published]
            for address in missing:
                self.refuse(
                    host,
                    f"{name}[{seen[address]}].address",
                    self.shown(address),
                    f"a GPU the host has (its published inventory: {', '.join(sorted(published))})",
                    f"use one of {', '.join(sorted(a for a in published if a not in seen) or sorted(published))}",
                    root=name,
                )

    def _published_gpus(self, host):
        """The addresses in the host's published GPU facts (role pve_host_gpu), when a run cached them."""
        facts = self.value(host, "ansible_local", {})
        gpus = ((facts or {}).get("inferhost_gpus") or {}).get("gpus") if isinstance(facts, dict) else None
        if not isinstance(gpus, list):
            return set()
        return {str(g.get("address")) for g in gpus if isinstance(g, dict) and g.get("address")}

    def _check_proxmox(self, host, proxmox):
        if not isinstance(proxmox, dict):
            self.refuse(
                host,
                "inferhost_proxmox",
                self.shown(proxmox),
                "a mapping with container_vmid and vm_vmid",
                "copy group_vars/all/proxmox.yml from inventory/example and set its CHANGE lines",
            )
            return
        for key in ("container_vmid", "vm_vmid"):
            value = proxmox.get(key)
            if not _int_like(value) or int(value) < 100:
                self.refuse(
                    host,
                    f"inferhost_proxmox.{key}",
                    self.shown(value if key in proxmox else UNSET),
                    "a guest id of at least 100",
                    f"inferhost_proxmox.{key}: the id `pct list` / `qm list` shows on the host",
                )
        ct, vm = proxmox.get("container_vmid"), proxmox.get("vm_vmid")
        if _int_like(ct) and _int_like(vm) and int(ct) == int(vm):
            self.refuse(
                host,
                "inferhost_proxmox.vm_vmid",
                self.shown(vm),
                f"the VM's id, not the container's ({ct})",
                "inferhost_proxmox.vm_vmid: the VM's id from `qm list` on the host",
            )
        for key in sorted(set(proxmox) - set(PROXMOX_KEYS)):
            moved = PROXMOX_MOVED.get(key)
            self.refuse(
                host,
                f"inferhost_proxmox.{key}",
                self.shown(proxmox[key], key),
                f"only {' and '.join(PROXMOX_KEYS)} in inferhost_proxmox",
                f"move it to {moved} (group_vars/pve_hosts/pve_api.yml)" if moved else f"remove {key}",
            )

    def check_host_gpus(self, host):
        """The GPU addresses each host role is given: well-formed, each once, and GPUs of this host."""
        inventory = self._addresses(host)
        for name in ("pve_host_gpu_addresses", "gpu_switch_gpus"):
            value = self.value(host, name)
            if value is UNSET:
                continue
            if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
                self.refuse(
                    host,
                    name,
                    self.shown(value),
                    "a list of PCI addresses (0000:01:00.0)",
                    f"{name}: {json.dumps(inventory or ['0000:01:00.0'])}",
                )
                continue
            seen = set()
            for index, address in enumerate(value):
                wrong = None  # (expected, fix)
                if not PCI_ADDRESS.match(address.lower() if len(address) == 12 else address):
                    wrong = ("a PCI address such as 0000:01:00.0", "copy it from `lspci -D -d 10de:`")
                elif address in seen:
                    wrong = ("each GPU once", f"remove entry {index} of {name}")
                elif not inventory and not address.endswith(".0"):
                    # With inferhost_gpus, an address that is not function 0 is refused there, by the name the
                    # user wrote.
                    wrong = (
                        f"the GPU's function 0 ({address[:-1]}0); its audio and other functions come along with it",
                        f"write {address[:-1]}0 in {name}",
                    )
                elif inventory and address not in inventory:
                    wrong = (
                        f"one of the host's GPUs in inferhost_gpus ({', '.join(inventory)})",
                        f"add the GPU to inferhost_gpus, or remove {address} from {name}",
                    )
                if wrong:
                    self.refuse(host, f"{name}[{index}]", self.shown(address), *wrong, root=name)
                seen.add(address)

    def _addresses(self, host):
        gpus = self.value(host, "inferhost_gpus", [])
        if not isinstance(gpus, list):
            return []
        return [str(g.get("address")) for g in gpus if isinstance(g, dict) and g.get("address")]

    def check_guest(self, host):
        """A guest against its Proxmox host: the container's driver userspace must be the host's pin."""
        pve = self.value(host, "inferhost_pve_host")
        if pve is UNSET or pve not in self.views:
            return
        guest_version = self.value(host, "nvidia_userspace_version")
        host_version = self.value(pve, "pve_host_gpu_driver_version")
        container = "inference_containers" in self.views[host].groups
        if (
            container
            and guest_version is not UNSET
            and host_version is not UNSET
            and str(guest_version) != str(host_version)
        ):
            self.refuse(
                host,
                "nvidia_userspace_version",
                self.shown(guest_version),
                f"the driver version of its Proxmox host {pve} (pve_host_gpu_driver_version {host_version}): a "
                "container shares the host's kernel module",
                'set both from the one pin: nvidia_userspace_version: "{{ inferhost_nvidia_driver_version }}"',
            )

    def check_role_values(self, host):
        """What the roles' preflight tasks check of values alone, before the first role runs."""
        checks = {
            "source_build": self._check_source_build,
            "nccl_tuning": self._check_nccl,
            "python_env": self._check_python_env,
            "cuda_toolkit": self._check_cuda_toolkit,
            "pve_host_gpu": self._check_pve_host_gpu,
            "pve_api": self._check_pve_api,
            "gpu_switch": self._check_gpu_switch,
            "pve_guest_gpu": self._check_pve_guest_gpu,
        }
        roles = set(self.roles.get(host, []))
        for role, check in checks.items():
            if role in roles:
                check(host)

    def _matches(self, host, name, pattern, expected, fix):
        """A variable that, when set, must match pattern (as a string)."""
        value = self.value(host, name)
        if value is not UNSET and not pattern.match(str(value)):
            self.refuse(host, name, self.shown(value), expected, fix)

    def _entries(self, host, name):
        """(label, entry) of each mapping in the list variable name (nothing when it is not a list)."""
        value = self.value(host, name, [])
        if not isinstance(value, list):
            return []
        return [(f"{name}[{index}]", entry) for index, entry in enumerate(value) if isinstance(entry, dict)]

    def _fields(self, host, root, label, entry, rules):
        """Each (key, ok, expected, example) rule that does not hold refuses the entry's key, fixed as key: example."""
        for key, ok, expected, example in rules:
            if not ok:
                self.refuse(
                    host, f"{label}.{key}", self.shown(entry.get(key, UNSET)), expected, f"{key}: {example}", root=root
                )

    def _positive(self, host, name, minimum, fix_value, what):
        value = self.value(host, name)
        if value is UNSET:
            return
        if isinstance(value, bool) or not _int_like(value) or int(value) < minimum:
            self.refuse(host, name, self.shown(value), f"{what} (at least {minimum})", f"{name}: {fix_value}")

    def _check_source_build(self, host):
        self._positive(host, "source_build_max_jobs", 1, 20, "a number of parallel compiler jobs")
        self._positive(host, "source_build_memory_reserve_gb", 0, 32, "gigabytes kept free")
        self._positive(host, "source_build_timeout", 1, 36000, "seconds a build may take")
        self._positive(host, "source_build_poll_interval", 1, 60, "seconds between progress lines")
        builds = self._entries(host, "source_build_builds")
        homes = self._toolkit_homes(host)
        for label, build in builds:
            name = build.get("name")
            rules = [
                ("name", SHORT_NAME.match(str(name or "")), "letters, digits and _.- only", "flash-attn"),
                ("target", str(build.get("target") or "").startswith("/"), "an absolute path", "/opt/venvs/<env>"),
                ("gb_per_thread", _number(build.get("gb_per_thread")) > 0, "a number above 0", 5),
                (
                    "threads_per_job",
                    _int_like(build.get("threads_per_job", 1)) and int(build.get("threads_per_job", 1)) >= 1,
                    "at least 1",
                    1,
                ),
                (
                    "max_jobs",
                    _int_like(build.get("max_jobs", 1)) and int(build.get("max_jobs", 1)) >= 1,
                    "at least 1",
                    8,
                ),
                (
                    "cuda_home",
                    not build.get("cuda_home") or str(build["cuda_home"]).startswith("/"),
                    "an absolute path or nothing",
                    "/usr/local/cuda-13.0",
                ),
                (
                    "subdirectory",
                    not re.match(r"^/|(^|.*/)\.\.(/|$)", str(build.get("subdirectory") or "")),
                    "a relative path inside the repository",
                    "sgl-kernel",
                ),
                (
                    "arch_list_variable",
                    not build.get("arch_list_variable")
                    or (
                        isinstance(build.get("environment"), dict)
                        and build["arch_list_variable"] in build["environment"]
                    ),
                    "the name of a variable its environment sets (the arch list the build compiles)",
                    "FLASH_ATTN_CUDA_ARCHS",
                ),
            ]
            self._fields(host, "source_build_builds", label, build, rules)
            self._cuda_home(host, label, build.get("cuda_home"), homes)
            for pindex, patch in enumerate(build.get("patches") or []):
                if isinstance(patch, dict) and "diff" not in patch:
                    self.refuse(
                        host,
                        f"{label}.patches[{pindex}].diff",
                        "nothing (not set)",
                        "the patch as a unified diff",
                        "add diff: | with the patch",
                        root="source_build_builds",
                    )
        self._unique(host, "source_build_builds", [build.get("name") for _, build in builds], "name")

    def _toolkit_homes(self, host):
        """The CUDA homes role cuda_toolkit makes on the guest (/usr/local/cuda-X.Y, and /usr/local/cuda with a
        default), or None when the guest runs no cuda_toolkit or its versions are refused already."""
        if "cuda_toolkit" not in self.roles.get(host, []):
            return None
        spec = (self.specs.get("cuda_toolkit") or {}).get("cuda_toolkit_versions") or {}
        versions = self.value(host, "cuda_toolkit_versions", spec.get("default", []))
        if not isinstance(versions, list) or not all(isinstance(v, str) and CUDA_VERSION.match(v) for v in versions):
            return None
        homes = [f"/usr/local/cuda-{v}" for v in versions]
        spec = (self.specs.get("cuda_toolkit") or {}).get("cuda_toolkit_default") or {}
        if self.value(host, "cuda_toolkit_default", spec.get("default", "")) not in (UNSET, "", None):
            homes.append("/usr/local/cuda")
        return homes

    def _cuda_home(self, host, label, cuda_home, homes):
        """A build's cuda_home is the home of a toolkit the guest installs (or none: the build finds its own)."""
        if homes is None or not isinstance(cuda_home, str) or not cuda_home.startswith("/"):
            return
        if cuda_home.rstrip("/") in homes:
            return
        close = difflib.get_close_matches(cuda_home, homes, n=1, cutoff=0.0)
        self.refuse(
            host,
            f"{label}.cuda_home",
            self.shown(cuda_home),
            f"the home of a CUDA toolkit this guest installs ({', '.join(homes) or 'none'}: cuda_toolkit_versions "
            "and its default); to build with another, add its X.Y to the toolkits",
            f"cuda_home: {close[0]}" if close else 'cuda_home: ""',
            root="source_build_builds",
        )

    def _unique(self, host, name, values, key):
        seen = set()
        for index, value in enumerate(values):
            if value in seen:
                self.refuse(
                    host,
                    f"{name}[{index}].{key}",
                    self.shown(value),
                    f"a {key} no other entry has",
                    f"rename or remove entry {index}",
                    root=name,
                )
            seen.add(value)

    def _check_nccl(self, host):
        settings = self._entries(host, "nccl_tuning_settings")
        for label, setting in settings:
            rules = [
                (
                    "name",
                    NCCL_NAME.match(str(setting.get("name", ""))),
                    "an NCCL variable name (NCCL_[A-Z0-9_]+)",
                    "NCCL_P2P_LEVEL",
                ),
                (
                    "value",
                    NCCL_VALUE.match(str(setting.get("value", ""))),
                    "a non-empty value of letters, digits and _.,:;^=+/-",
                    '"SYS"',
                ),
                (
                    "reason",
                    str(setting.get("reason", "")).strip(),
                    "why the setting is pinned",
                    "<what it fixes, and where that was measured>",
                ),
            ]
            self._fields(host, "nccl_tuning_settings", label, setting, rules)
        self._unique(host, "nccl_tuning_settings", [setting.get("name") for _, setting in settings], "name")

    def _check_python_env(self, host):
        envs = self._entries(host, "python_env_environments")
        for label, env in envs:
            path = str(env.get("path", ""))
            rules = [
                ("name", SHORT_NAME.match(str(env.get("name", ""))), "letters, digits and _.- only", "sglang"),
                (
                    "path",
                    path.startswith("/") and path.strip("/"),
                    "an absolute path other than /",
                    "/opt/venvs/<name>",
                ),
            ]
            self._fields(host, "python_env_environments", label, env, rules)
            python = env.get("python", UNSET)
            if python is not UNSET and not isinstance(python, str):
                # Ansible's str type turns the number into its text: 3.10 unquoted reaches uv as 3.1.
                meant = "3.12" if isinstance(python, (bool, dict, list)) or python is None else str(python)
                meant = "3.10" if meant == "3.1" else meant
                self.refuse(
                    host,
                    f"{label}.python",
                    f"{self.shown(python)} ({_kind(python)})",
                    "a quoted Python version (or an interpreter path): unquoted, YAML reads 3.10 as the number 3.1",
                    f'python: "{meant}"',
                    root="python_env_environments",
                )
            steps = env.get("steps") or []
            if not steps or any(not (isinstance(s, dict) and s.get("packages")) for s in steps):
                self.refuse(
                    host,
                    f"{label}.steps",
                    self.shown(steps),
                    "at least one step, each with packages",
                    "steps: [{name: ..., packages: [...]}]",
                    root="python_env_environments",
                )
        for key in ("name", "path"):
            self._unique(host, "python_env_environments", [env.get(key) for _, env in envs], key)
        if self.value(host, "python_env_uv_install", None) == "copy" and not self.value(host, "python_env_uv_src", ""):
            self.refuse(
                host,
                "python_env_uv_src",
                "nothing (not set)",
                "the controller path of a uv binary when python_env_uv_install is copy",
                "python_env_uv_src: /path/to/uv",
            )

    def _check_cuda_toolkit(self, host):
        versions = self.value(host, "cuda_toolkit_versions", [])
        self._check_cuda(host, "cuda_toolkit_versions", versions, "cuda_toolkit_default")

    def _check_pve_host_gpu(self, host):
        self._matches(
            host,
            "pve_host_gpu_driver_version",
            DRIVER_VERSION,
            "a driver version such as 590.48.01",
            'pve_host_gpu_driver_version: "{{ inferhost_nvidia_driver_version }}"',
        )
        options = self.value(host, "pve_host_gpu_module_options", {})
        if isinstance(options, dict):
            for module, params in options.items():
                ok = (
                    MODULE_NAME.match(str(module))
                    and isinstance(params, dict)
                    and all(MODULE_PARAM.match(str(k)) and not re.search(r'["\n]', str(v)) for k, v in params.items())
                )
                if not ok:
                    self.refuse(
                        host,
                        f"pve_host_gpu_module_options.{module}",
                        self.shown(params),
                        "a mapping of parameter names (letters, digits, _) to values without quotes or newlines",
                        "nvidia_uvm: {uvm_disable_hmm: 1}",
                        root="pve_host_gpu_module_options",
                    )

    def _check_gpu_switch(self, host):
        ct, vm = self.value(host, "gpu_switch_container_vmid"), self.value(host, "gpu_switch_vm_vmid")
        for name, value in (("gpu_switch_container_vmid", ct), ("gpu_switch_vm_vmid", vm)):
            if value is not UNSET and (not _int_like(value) or int(value) < 100):
                self.refuse(
                    host,
                    name,
                    self.shown(value),
                    "a guest id of at least 100",
                    f"{name}: the id from `pct list` / `qm list`",
                )
        if _int_like(ct) and _int_like(vm) and int(ct) == int(vm):
            self.refuse(
                host,
                "gpu_switch_vm_vmid",
                self.shown(vm),
                f"the VM's id, not the container's ({ct})",
                "gpu_switch_vm_vmid: the VM's id from `qm list`",
            )
        gpus = self.value(host, "gpu_switch_gpus", [])
        match = self.value(host, "gpu_switch_gpu_match", {})
        if bool(gpus) == bool(match):
            self.refuse(
                host,
                "gpu_switch_gpus",
                self.shown(gpus),
                "the GPUs named one way: gpu_switch_gpus or gpu_switch_gpu_match, exactly one",
                "gpu_switch_gpus: \"{{ inferhost_gpus | map(attribute='address') | list }}\", no gpu_switch_gpu_match",
            )
        # gpu-switch logs in over https whatever pve_api_backend says.
        self._secret(host)
        attach = self.value(host, "gpu_switch_attach_hookscripts", True)
        user = self.value(host, "pve_api_user", "root@pam")
        token = self.value(host, "pve_api_token_id", "")
        if attach is True and (user != "root@pam" or token):
            self.refuse(
                host,
                "pve_api_user",
                self.shown(user),
                "root@pam with a password (only root@pam may set hookscripts, devN and raw hostpciN)",
                "pve_api_user: root@pam and no pve_api_token_id",
            )

    def _check_pve_api(self, host):
        if self.value(host, "pve_api_backend", "https") == "https":
            self._secret(host)

    def _check_pve_guest_gpu(self, host):
        containers = self.value(host, "pve_guest_gpu_containers", [])
        vms = self.value(host, "pve_guest_gpu_vms", [])
        gpus = self.value(host, "pve_guest_gpu_gpus", [])
        known = set()
        if isinstance(gpus, list):
            addresses = [str(g.get("address")) for g in gpus if isinstance(g, dict)]
            known = set(addresses) | {str(g.get("slot")) for g in gpus if isinstance(g, dict) and g.get("slot")}
            self._unique(host, "pve_guest_gpu_gpus", addresses, "address")
        if not known:
            # The GPUs come from the host's published facts, which the controller has not read yet: the inventory's
            # own list of the host's GPUs says which addresses exist.
            known = set(self._addresses(host))
        for name, guests in (("pve_guest_gpu_containers", containers), ("pve_guest_gpu_vms", vms)):
            if not isinstance(guests, list):
                continue
            for index, guest in enumerate(guests):
                if not isinstance(guest, dict):
                    continue
                vmid = str(guest.get("vmid", ""))
                if not re.match(r"^[1-9][0-9]{2,8}$", vmid):
                    self.refuse(
                        host,
                        f"{name}[{index}].vmid",
                        self.shown(guest.get("vmid", UNSET)),
                        "a guest id (100 to 999999999)",
                        "vmid: the id from `pct list` / `qm list`",
                        root=name,
                    )
                asked = guest.get("gpus", "all")
                if asked == "all":
                    continue
                if not isinstance(asked, list):
                    self.refuse(
                        host,
                        f"{name}[{index}].gpus",
                        self.shown(asked),
                        "all, or a list of this host's GPU addresses",
                        "gpus: all",
                        root=name,
                    )
                    continue
                unknown = [a for a in asked if known and str(a) not in known]
                if unknown:
                    self.refuse(
                        host,
                        f"{name}[{index}].gpus",
                        self.shown(asked),
                        f"GPUs of this host ({', '.join(sorted(known))})",
                        "gpus: all",
                        root=name,
                    )

    def _secret(self, host):
        """The password (or, with a token, its secret) the roles send to the Proxmox API: it must be there (its
        value is never shown)."""
        token = self.value(host, "pve_api_token_id", "")
        name = "pve_api_token_secret" if token else "pve_api_password"
        if self.value(host, name, "") not in ("", None):
            return
        if token:
            self.refuse(
                host, name, "nothing (empty)", "the secret of pve_api_token_id", f"set {name} from Ansible Vault"
            )
            return
        self.refuse(
            host,
            name,
            "nothing (empty)",
            "root@pam's password for the Proxmox API",
            "put vault_proxmox_password in an encrypted inventory/<site>/group_vars/all/vault.yml "
            "(ansible-vault create; README, Secrets), or export PROXMOX_PASSWORD",
        )

    def check_services(self, host):
        if "inference_service" not in self.roles.get(host, []):
            return
        self._check_capability(host)
        services = self.value(host, "inference_service_services", [])
        active = self.value(host, "inference_service_active", "")
        if not isinstance(services, list):
            return
        count = self._gpu_count(host)
        environments = self._environment_paths(host)
        names = []
        for index, service in enumerate(services):
            if not isinstance(service, dict):
                continue
            name = service.get("name")
            names.append(name)
            label = f"inference_service_services[{index}]"
            gpus = service.get("gpus")
            if not isinstance(gpus, list) or any(isinstance(g, bool) or not isinstance(g, int) for g in gpus):
                example = list(range(min(len(gpus) if isinstance(gpus, list) else 2, count or 8) or 1))
                self.refuse(
                    host,
                    f"{label}.gpus",
                    self.shown(gpus if gpus is not None else UNSET),
                    "a YAML list of GPU indices (integers), such as [0, 1]; a string is not a list",
                    f"gpus: {json.dumps(example)}",
                    root="inference_service_services",
                )
                continue
            environment = service.get("environment")
            if environments and isinstance(environment, str) and environment.rstrip("/") not in environments:
                close = difflib.get_close_matches(environment, environments, n=1, cutoff=0.0)
                self.refuse(
                    host,
                    f"{label}.environment",
                    self.shown(environment),
                    f"the path of one of python_env_environments ({', '.join(environments)}): the environments "
                    "this guest builds",
                    f"environment: {close[0]}",
                    root="inference_service_services",
                )
                continue
            if service_plan is None or (host, "inference_service_services") in self._reported:
                continue
            refusals = service_plan.check_service_data(service, count or None)
            refusals += service_plan.check_kv_cache(service)
            rules = self._known_bad(host, service)
            if rules:
                refusals += service_plan.check_known_bad(
                    service, rules, self._capability(host), service.get("engine_version")
                )[0]
            for refusal in refusals:
                field_name = refusal["id"] if refusal["check"] == "service" else refusal["check"]
                self.refuse(
                    host,
                    f"{label}.{field_name}",
                    f"service {name}: {refusal['reason']}",
                    "a service the role can run",
                    refusal["fix"],
                    root="inference_service_services",
                )
        self._unique(host, "inference_service_services", names, "name")
        if active not in (UNSET, "") and active not in names:
            close = difflib.get_close_matches(str(active), [str(n) for n in names], n=1, cutoff=0.0)
            self.refuse(
                host,
                "inference_service_active",
                self.shown(active),
                f'the name of one of inference_service_services ({", ".join(str(n) for n in names) or "none"}) or ""',
                f"inference_service_active: {close[0]}" if close else 'inference_service_active: ""',
            )

    def _environment_paths(self, host):
        """The paths of the guest's Python environments, when it declares any.

        Only then: a guest may run a service from an environment made outside role python_env, as the lab
        does (its stand-in engine's /opt/venvs/standin, with python_env_environments: []); the role itself
        checks on the guest that the environment exists."""
        envs = self.value(host, "python_env_environments", [])
        if not isinstance(envs, list):
            return []
        return [str(e["path"]).rstrip("/") for e in envs if isinstance(e, dict) and isinstance(e.get("path"), str)]

    def _check_capability(self, host):
        """The compute capability is the quoted X.Y the known-bad rules compare with ("12.0"); any other form
        ("120", the number 12.0) matches none of them and switches every rule for the GPU off without a word."""
        hardware = self.value(host, "inference_service_hardware", {})
        if not isinstance(hardware, dict) or "compute_capability" not in hardware:
            return
        capability = hardware["compute_capability"]
        if isinstance(capability, str) and CAPABILITY.match(capability):
            return
        text = str(capability)
        digits = re.fullmatch(r"(?:sm_?)?([0-9]{1,3})", text, re.I)
        meant = "12.0"
        if isinstance(capability, bool) or not isinstance(capability, (str, int, float)):
            pass
        elif isinstance(capability, float):
            meant = text
        elif digits and (len(digits.group(1)) == 3 or int(digits.group(1)) >= 50):
            meant = f"{digits.group(1)[:-1]}.{digits.group(1)[-1]}"  # sm_120 -> 12.0, sm_89 -> 8.9
        elif digits:
            meant = f"{int(digits.group(1))}.0"  # a major alone: 12 -> 12.0
        self.refuse(
            host,
            "inference_service_hardware.compute_capability",
            f"{self.shown(capability)} ({_kind(capability)})",
            'the compute capability as a quoted "X.Y" such as "12.0" (major.minor, as nvidia-smi --query-gpu='
            "compute_cap shows it): the known-bad rules compare with that form",
            f'compute_capability: "{meant}"',
            root="inference_service_hardware",
        )

    def _gpu_count(self, host):
        """The GPUs a guest's services may index: its Proxmox host's inventory, else the hardware's gpu_count."""
        pve = self.value(host, "inferhost_pve_host", None)
        if pve in self.views:
            addresses = self._addresses(pve)
            if addresses:
                return len(addresses)
        hardware = self.value(host, "inference_service_hardware", {})
        count = hardware.get("gpu_count") if isinstance(hardware, dict) else None
        return int(count) if _int_like(count) else 0

    def _capability(self, host):
        hardware = self.value(host, "inference_service_hardware", {})
        return hardware.get("compute_capability") if isinstance(hardware, dict) else None

    def _known_bad(self, host, service):
        """The known-bad rules that hold without the installed engine version (the role checks the others)."""
        rules = list(self.known_bad) + list(self.value(host, "inference_service_known_bad_extra", []) or [])
        bounded = ("engine_version_below", "engine_version_max")
        return [
            r
            for r in rules
            if isinstance(r, dict) and (not any(r.get(b) for b in bounded) or service.get("engine_version"))
        ]


def _find_option(options, name):
    """The spec of a field named name anywhere among nested options."""
    if name in options:
        return options[name]
    for option in options.values():
        found = _find_option(option.get("options") or {}, name) if isinstance(option, dict) else None
        if found:
            return found
    return None


def _kind(value) -> str:
    for kind, words in (
        (bool, "true/false"),
        (str, "a string"),
        (int, "a number"),
        (float, "a number"),
        (dict, "a mapping"),
    ):
        if isinstance(value, kind):
            return words
    return type(value).__name__


def _of_elements(option) -> str:
    words = {"str": "strings", "int": "integers", "dict": "mappings", "path": "paths", "bool": "true/false values"}
    elements = option.get("elements")
    return f" of {words.get(elements, elements + 's')}" if elements else ""


def _flow(value) -> str:
    """A value as one line of YAML (flow style), to write after a variable's name in a fix."""
    plain = json.loads(json.dumps(value, default=str))
    return yaml.safe_dump(plain, default_flow_style=True, sort_keys=False, width=1 << 16).strip()


def _int_like(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()) is not None


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def report(problems) -> str:
    """The refusal as the play prints it."""
    count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
    lines = [f"The inventory has {count}; nothing was changed on any host."]
    lines += [f"- {p.line()}" for p in problems]
    return "\n".join(lines)
