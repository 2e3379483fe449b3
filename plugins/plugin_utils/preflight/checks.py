"""Checks of the whole inventory on the controller, before any play changes anything.

The validation play (playbooks/preflight.yml, action ``inferhost_preflight``) hands this module what the
run will touch: each host's variables (as a ``HostView``), the roles each host will run, their argument
specs and their value rules. It returns ``Problem`` objects, each naming the variable, the inventory file it
comes from, what was given, what was expected and one fix that is itself valid. Five kinds of checks:

* every role's argument spec, applied up front to the variables each host sets for the roles it runs;
* every role's value rules (``roles/<role>/meta/rules.yml``, ``preflight/rules.py``), the same rules the
  role's own preflight runs when it runs alone, with the role's defaults where the inventory sets nothing;
* the YAML traps that argument spec lets through, converting them without a word: a string where a list is
  meant, a number where a string is meant (3.10 unquoted is 3.1), a partial mapping of an option whose keys all
  have defaults (``check_yaml_traps``);
* every variable with a role's prefix (or the project's ``inferhost_``) that nothing declares: refused,
  with the closest known name (or, for a name the roles read no more, the one that replaced it: ``RENAMED``),
  since Ansible itself ignores a misspelt variable without a word;
* the checks no single role can make: the inventory's own data (``inferhost_*``), GPU addresses against the
  host's list and its published facts, the guest's driver against its host's pin, and each service's plan
  (``inference.plan``, the code the role's plan module runs on the guest).

Nothing here imports Ansible's controller code or reaches a machine: the unit tests feed it plain data.
Secret values (``vault_*``, ``*password*``, ``*token*``, ``*api_key*``, ``*secret*``) are never rendered.
"""

from __future__ import annotations

import difflib
import json
import os
import re

import yaml

from preflight import rules as role_rules
from preflight.inventory import (
    DRIVER_VERSION,
    INVENTORY_NAMES,
    PCI_ADDRESS,
    PROJECT_PREFIX,
    PROXMOX_KEYS,
    PROXMOX_MOVED,
    RENAMED,
    RENAMED_FACTS,
    ROLE_PREFIXES,
    SECRET_SHOWN,
    UNSET,
    Problem,
    TemplateFailure,
    expected_of,
    is_secret_name,
    mask,
    secret_values,
    show,
)
from preflight.rules import int_like as _int_like

try:  # plugins/module_utils on sys.path: the action plugin and the unit tests both put it there
    from inference import known_bad as known_bad_rules
    from inference import plan as service_plan
except ImportError:  # pragma: no cover - only without the project's module_utils
    known_bad_rules = service_plan = None


class Checker:
    """Every check over the hosts of a run.

    views: {host: HostView} of every inventory host (cross-checks read a guest's Proxmox host); targets: the
    hosts the run touches; roles: {host: [role, ...]}; specs: {role: options}; declared: every name any role
    declares; provided: names the playbooks set themselves (not inventory data); files: a VariableFiles;
    validator: (options, params) -> [(option, message)], the argument spec check; known_bad: rules added to the
    inference code's known-bad matrix (tests); rules: {role: its value rules}; wiring: {role variable: the template
    that hands it the site's data} (playbooks/group_vars/all/wiring.yml).
    """

    def __init__(  # noqa: PLR0913 - what a run is made of
        self,
        views,
        targets,
        roles,
        specs,
        declared,
        *,
        provided=(),
        files=None,
        validator=None,
        known_bad=(),
        rules=None,
        wiring=None,
    ):
        self.views = views
        self.rules = rules or {}
        self.wiring = dict(wiring or {})
        # Each role's defaults, once: a variable is declared by the one role whose prefix it has.
        self.defaults = {
            name: option["default"]
            for options in specs.values()
            for name, option in options.items()
            if isinstance(option, dict) and "default" in option
        }
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
            missing = self._missing_source(host, name, raw)
            if missing:
                # A wired variable (playbooks/group_vars/all/wiring.yml) whose site data is not there: that is what
                # the site must write.
                self.refuse(
                    host,
                    missing,
                    "nothing (not set)",
                    INVENTORY_NAMES.get(missing, "the site's data"),
                    f"set {missing} in the inventory (inventory/example shows where; {name} follows from it)",
                )
            elif (host, name) not in self._reported and not causes:
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

    def _missing_source(self, host, name, raw):
        """The site variable a wired variable reads and the host does not set, or None."""
        if name not in self.wiring:
            return None
        view = self.views[host]
        for source in re.findall(r"\b(inferhost_[a-z_]+)\b", raw):
            if not view.has(source):
                return source
        return None

    # the checks

    def run(self) -> list[Problem]:
        # Misspelt names and the shared data first: what fails because of them is not reported again.
        for host in self.targets:
            self.check_unknown(host)
            self.check_shadowed(host)
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

    def check_shadowed(self, host):
        """A wired role variable that the site sets in its inventory's group_vars/all: the wiring, a playbook's
        group_vars/all, takes precedence over that file, so the site's value would be ignored without a word."""
        if not self.files:
            return
        view = self.views[host]
        for name in sorted(set(self.wiring) & view.names):
            file = self.files.file_of(name, host, [])
            if file and f"{os.sep}group_vars{os.sep}all" in os.sep + file:
                group = next((g for g in sorted(view.groups) if g not in ("all", "ungrouped")), "<group>")
                self.refuse(
                    host,
                    name,
                    self.shown(view.raw(name), name),
                    "a value the run uses: playbooks/group_vars/all/wiring.yml sets it from the site's data and takes "
                    "precedence over the inventory's group_vars/all",
                    f"move it to group_vars/{group}/ (or host_vars/{host}/), which take precedence over the wiring",
                )

    def check_unknown(self, host):
        view = self.views[host]
        for name in sorted(view.names):
            if name.startswith("__"):
                continue
            self._check_renamed_facts(host, name)
            if not name.startswith((PROJECT_PREFIX, *ROLE_PREFIXES)):
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

    def _check_renamed_facts(self, host, name):
        """A template that reads a published fact by its former name (RENAMED_FACTS): the name taken as a key or an
        attribute (never as a variable: the inventory's own inferhost_gpus is one) in a template of ansible_local."""
        raw = self.views[host].raw(name)
        if not (isinstance(raw, str) and "ansible_local" in raw):
            return
        for old, new in RENAMED_FACTS.items():
            if re.search(rf"\[\s*['\"]{old}['\"]\s*\]|\.{old}\b", raw):
                self.refuse(
                    host,
                    name,
                    self.shown(raw, name),
                    f"a template that reads the host's facts by their name, ansible_local['{new}']",
                    f"write ansible_local['{new}'] where {name} reads ansible_local['{old}']",
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
        if self._named(host, root, label):
            return
        kind = option.get("type", "str")
        if is_secret_name(key):
            self._secret_trap(host, root, label, key, kind, value)
            return
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
        else:
            self._scalar_trap(host, root, label, key, option, value)

    def _scalar_trap(self, host, root, label, key, option, value):  # noqa: PLR0913, PLR0917 - where, and what
        """A list, a mapping or a number where a string or a path is meant (Ansible turns each into text)."""
        kind = option.get("type", "str")
        if kind in ("str", "path") and isinstance(value, (list, dict)) and not option.get("choices"):
            self.refuse(
                host,
                label,
                f"{self.shown(value, key)} ({_kind(value)})",
                f"a {'path' if kind == 'path' else 'string'}: Ansible turns a {_kind(value)[2:]} into its text without "
                "a word",
                f"{key}: one {'path' if kind == 'path' else 'value'}, quoted",
                root=root,
            )
        elif kind in ("str", "path") and isinstance(value, float):
            self.refuse(
                host,
                label,
                f"{self.shown(value, key)} (a number)",
                'a quoted string: YAML reads an unquoted 3.10 as the number 3.1, and Ansible passes it on as "3.1"',
                f'{key}: "{value}" (quoted, with every digit meant)',
                root=root,
            )

    def _secret_trap(self, host, root, label, key, kind, value):  # noqa: PLR0913, PLR0917 - where, and what
        """A secret given as a number or a list: refused without its value, in the message or in the fix."""
        if kind in ("str", "path") and isinstance(value, (float, list, dict)):
            self.refuse(
                host,
                label,
                f"{SECRET_SHOWN} ({_kind(value)})",
                "a quoted string: unquoted, YAML reads some values as numbers (3.10 is 3.1) or lists",
                f'{key}: "<the secret, quoted>" (in Ansible Vault)',
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
        # The toolkits' rule of role cuda_toolkit, stated there, applied to the inventory's own list.
        shared = {
            "path": "inferhost_cuda_versions",
            "check": "cuda_versions",
            "options": {"default": "inferhost_cuda_default"},
        }
        for refusal in role_rules.evaluate([shared], lambda name: self.value(host, name)):
            self.refuse(host, refusal.variable, self.shown(refusal.given), refusal.expected, refusal.fix)
        gpus = self.value(host, "inferhost_gpus")
        if gpus is not UNSET:
            self._check_gpu_list(host, "inferhost_gpus", gpus)
        proxmox = self.value(host, "inferhost_proxmox")
        if proxmox is not UNSET:
            self._check_proxmox(host, proxmox)
            self._check_ids_in_cluster(host, proxmox)
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
        gpus = ((facts or {}).get("inferhost_gpu_facts") or {}).get("gpus") if isinstance(facts, dict) else None
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
                "copy host_vars/pve1/proxmox.yml from inventory/example and set its CHANGE lines",
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

    def _check_ids_in_cluster(self, host, proxmox):
        """A guest id belongs to one guest of the whole cluster: two Proxmox hosts of the inventory that name the same
        id would each move, start and stop the other's guest."""
        if not isinstance(proxmox, dict):
            return
        for other in sorted(self.views):
            if other == host or "pve_hosts" not in self.views[other].groups:
                continue
            theirs = self.value(other, "inferhost_proxmox", {})
            if not isinstance(theirs, dict):
                continue
            for key in PROXMOX_KEYS:
                mine = proxmox.get(key)
                shared = [k for k in PROXMOX_KEYS if str(theirs.get(k)) == str(mine)]
                if mine is not None and shared and host < other:
                    self.refuse(
                        host,
                        f"inferhost_proxmox.{key}",
                        self.shown(mine),
                        f"an id no other host's guest has ({other} has {mine} as its {shared[0]}): guest ids are "
                        "unique in a Proxmox cluster",
                        f"inferhost_proxmox.{key}: the id `pct list` / `qm list` shows on {host}",
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
        """The value rules of each role the host runs (roles/<role>/meta/rules.yml), read with the role's defaults
        where the inventory sets nothing, before the first role runs."""
        for role in self.roles.get(host, []):
            rules = self.rules.get(role) or []
            if not rules:
                continue
            get = self._getter(host)
            for refusal in role_rules.evaluate(rules, get):
                named = any(host in p.hosts and p.variable == refusal.variable for p in self.problems)
                if named or (host, refusal.root) in self._failed or self._from_refused(host, refusal.root):
                    continue
                self.refuse(
                    host,
                    refusal.variable,
                    self.shown(refusal.given, refusal.variable.split(".")[-1].split("[")[0]),
                    refusal.expected,
                    refusal.fix,
                    root=refusal.root,
                )

    def _getter(self, host):
        """name -> the host's value, else the default of the role that declares it (a template default counts as
        not set: its value is known only on the host)."""

        def get(name):
            value = self.value(host, name)
            if value is not UNSET:
                return value
            default = self.defaults.get(name, UNSET)
            return UNSET if isinstance(default, str) and "{{" in default else default

        return get

    def _matches(self, host, name, pattern, expected, fix):
        """A variable that, when set, must match pattern (as a string)."""
        value = self.value(host, name)
        if value is not UNSET and not pattern.match(str(value)):
            self.refuse(host, name, self.shown(value), expected, fix)

    def check_services(self, host):
        """Each service's plan (inference.plan, the code of the role's plan module): what the engine cannot run, a
        model that does not fit, the known-bad rules that hold without the installed engine's version."""
        if "inference_service" not in self.roles.get(host, []) or service_plan is None:
            return
        services = self.value(host, "inference_service_services", [])
        if not isinstance(services, list) or self._named(
            host, "inference_service_services", "inference_service_services"
        ):
            return
        count = self._gpu_count(host)
        capability = self._capability(host)
        for index, service in enumerate(services):
            if not isinstance(service, dict) or not isinstance(service.get("gpus"), list):
                continue
            label = f"inference_service_services[{index}]"
            refusals = service_plan.check_service_data(service, count or None)
            refusals += service_plan.check_kv_cache(service)
            rules = self._known_bad(host, service)
            if rules:
                refusals += service_plan.check_known_bad(service, rules, capability, service.get("engine_version"))[0]
            for refusal in refusals:
                field_name = refusal["id"] if refusal["check"] == "service" else refusal["check"]
                self.refuse(
                    host,
                    f"{label}.{field_name}",
                    f"service {service.get('name')}: {refusal['reason']}",
                    "a service the role can run",
                    refusal["fix"],
                    root="inference_service_services",
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
        capability = hardware.get("compute_capability") if isinstance(hardware, dict) else None
        return capability if isinstance(capability, str) and re.fullmatch(r"[0-9]+\.[0-9]", capability) else None

    def _known_bad(self, host, service):
        """The known-bad rules (inference.known_bad, with the site's own) that hold without the installed engine
        version (the role checks the others); None when the site's own rules are malformed (refused here)."""
        extra = self.value(host, "inference_service_known_bad_extra", []) or []
        try:
            rules = (known_bad_rules.rules(extra) if known_bad_rules else []) + list(self.known_bad)
        except ValueError as exc:
            self.refuse(
                host,
                "inference_service_known_bad_extra",
                self.shown(extra),
                "rules in the format of the built-in ones (plugins/module_utils/inference/known_bad.py)",
                str(exc).split(": ", 1)[-1][:200],
            )
            return []
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
        (list, "a list"),
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


def report(problems) -> str:
    """The refusal as the play prints it."""
    count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
    lines = [f"The inventory has {count}; nothing was changed on any host."]
    lines += [f"- {p.line()}" for p in problems]
    return "\n".join(lines)
