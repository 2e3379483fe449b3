"""The value rules of a role, stated once in ``roles/<role>/meta/rules.yml`` and run in two places.

The controller's preflight (``playbooks/preflight.yml``, before any play changes a machine) and the role's own
preflight (``tasks/preflight.yml``, action ``inferhost_role_rules``, when the role runs alone) both call
``evaluate`` on the same rules; only how a variable's value is read differs (``get``: the name, or ``UNSET``).

A rule names a ``path`` into the role's variables and says one thing about the value found there:

``pve_host_gpu_driver_version``        the variable
``python_env_environments[].name``     the field ``name`` of each entry of a list
``inference_service_hardware.compute_capability``  a key of a mapping

and exactly one of these kinds:

``match``     the value, as text, matches the regular expression (``^...$`` is the author's to write)
``string``    the value is a string (YAML reads 3.10 unquoted as the number 3.1)
``min``       an integer of at least this (true/false is no integer)
``range``     [low, high]: an integer from low to high
``above``     a number above this
``unique``    no two entries of the list share the value
``among``     the value (each item of a list value) is one of the values found at another path; checked only
              when that path holds something (a role run alone may not know the other role's data)
``keys_among``  every key of the mapping is one of the values found at another path
``needs``     when the value is set and not empty, the variable named here is not empty either
``required_when``  {variable: value}: the value must be given (not empty) when that variable has that value
``differs_from``   the value differs from that variable's
``check``     a named check of this module (``CHECKS``), for what needs code

A missing field or an unset variable passes (the argument spec asks for what is required), except for
``required_when``. Each rule carries its words: ``expected`` (what a good value is) and ``fix`` (a line to
write; in the fix of ``among``, ``{closest}`` is the allowed value closest to the one given), and ``refuses``:
one value of the rule's variable that the rule must refuse, which the tests feed to both preflights, with
``with``: the other variables that make it a refusal.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass


class Unset:
    """A variable the host does not set, or a field an entry does not have."""

    def __repr__(self):
        return "(not set)"


UNSET = Unset()
KINDS = (
    "match",
    "string",
    "min",
    "range",
    "above",
    "unique",
    "among",
    "keys_among",
    "needs",
    "required_when",
    "differs_from",
    "check",
)
WORDS = ("path", "expected", "fix", "refuses", "with")
RULES_FILE = os.path.join("meta", "rules.yml")
_SEGMENT = re.compile(r"\[\]|\.[A-Za-z0-9_]+|^[A-Za-z0-9_]+")


@dataclass
class Refusal:
    """One value a rule refuses: where (a path with indices), what was given, what is expected, one fix."""

    variable: str
    given: object
    expected: str
    fix: str
    root: str


class RuleError(ValueError):
    """A rules file the engine cannot read; names the file and the rule."""


def load(role_dir, read_yaml):
    """The rules of a role (a list, empty when the role has none), checked for form; read_yaml(path) -> data.

    Besides the rules written in the file, every option of type path in the role's argument spec is an absolute
    path (the role reads or writes it on the machine), unless the file's ``relative_paths`` names it with why.
    """
    data = _rules_file(role_dir, read_yaml)
    rules = data.get("rules")
    if not isinstance(rules, list):
        raise RuleError(f"{os.path.join(role_dir, RULES_FILE)}: expected a mapping with a list under rules")
    for index, rule in enumerate(rules):
        problem = _form(rule)
        if problem:
            raise RuleError(f"{os.path.join(role_dir, RULES_FILE)}: rules[{index}]: {problem}")
    return rules + _absolute_paths(role_dir, read_yaml, data.get("relative_paths") or {})


def accepted(role_dir, read_yaml) -> dict:
    """{option: {mutation: why the role accepts it}}: the values of the generated test that a role takes on
    purpose (an empty list of extra arguments, a relative path on the controller)."""
    data = _rules_file(role_dir, read_yaml)
    out = {name: dict(reasons) for name, reasons in (data.get("accepts") or {}).items()}
    for name, reason in (data.get("relative_paths") or {}).items():
        out.setdefault(name, {})["relative-path"] = reason
    return out


def _rules_file(role_dir, read_yaml):
    path = os.path.join(role_dir, RULES_FILE)
    data = (read_yaml(path) or {}) if os.path.isfile(path) else {"rules": []}
    if not isinstance(data, dict):
        raise RuleError(f"{path}: expected a mapping with a list under rules")
    return data


def _absolute_paths(role_dir, read_yaml, relative):
    spec_file = os.path.join(role_dir, "meta", "argument_specs.yml")
    if not os.path.isfile(spec_file):
        return []
    spec = read_yaml(spec_file) or {}
    options = ((spec.get("argument_specs") or {}).get("main") or {}).get("options") or {}
    return [
        {
            "path": name,
            "match": r"^(/|$)",
            "expected": "an absolute path (the role reads or writes it on the machine)",
            "fix": f"{name}: {option.get('default') or '/<absolute path>'}",
            "refuses": "relative/path",
        }
        for name, option in options.items()
        if isinstance(option, dict) and option.get("type") == "path" and name not in relative
    ]


def _form(rule):
    """What is wrong with a rule's form, or None."""
    if not isinstance(rule, dict) or not isinstance(rule.get("path"), str):
        return "each rule is a mapping with a path"
    kinds = [k for k in rule if k in KINDS]
    unknown = [k for k in rule if k not in KINDS and k not in WORDS and k != "options"]
    problems = [
        (len(kinds) != 1, f"exactly one of {', '.join(KINDS)} (found {', '.join(kinds) or 'none'})"),
        (bool(unknown), f"unknown keys {', '.join(unknown)}"),
        (rule.get("check") not in (None, *CHECKS), f"no check named {rule.get('check')} (known: {', '.join(CHECKS)})"),
        (
            not rule.get("check") and not (rule.get("expected") and rule.get("fix")),
            "a rule says what it expects and a fix (expected, fix)",
        ),
        ("refuses" not in rule, "a rule gives one value it refuses (refuses), for the tests"),
    ]
    return next((words for wrong, words in problems if wrong), None)


def root_of(path) -> str:
    return _SEGMENT.findall(path)[0]


def variables_of(rule) -> set[str]:
    """Every variable a rule reads (its own and those it compares with)."""
    names = {root_of(rule["path"])}
    for kind in ("among", "keys_among"):
        if rule.get(kind):
            names.add(root_of(rule[kind]))
    for kind in ("needs", "differs_from"):
        if rule.get(kind):
            names.add(rule[kind])
    if isinstance(rule.get("required_when"), dict):
        names.update(rule["required_when"])
    names.update(CHECK_READS.get(rule.get("check"), ()))
    return names


def found(get, path):
    """[(label, value, parent)] at path; lists and mappings of the wrong type yield nothing below them."""
    segments = _SEGMENT.findall(path)
    out = [(segments[0], get(segments[0]), None)]
    for segment in segments[1:]:
        below = []
        for label, value, _ in out:
            if segment == "[]":
                if isinstance(value, list):
                    below += [(f"{label}[{i}]", item, value) for i, item in enumerate(value)]
            elif isinstance(value, dict):
                below.append((f"{label}{segment}", value.get(segment[1:], UNSET), value))
        out = below
    return out


def values_at(get, path):
    """The values at path that are set, flattened one level when a value is itself a list."""
    out = []
    for _, value, _ in found(get, path):
        if value is UNSET or value is None:
            continue
        out += value if isinstance(value, list) else [value]
    return out


def evaluate(rules, get) -> list[Refusal]:
    """Every refusal of the rules, in the rules' order; get(name) -> the variable's value or UNSET."""
    out = []
    for rule in rules:
        if rule.get("check"):
            out += CHECKS[rule["check"]](get, rule)
            continue
        out += _simple(get, rule)
    return out


def _empty(value) -> bool:
    return value is UNSET or value is None or value in ("", [], {})


def int_like(value) -> bool:
    """An integer, or a string of one (true/false is none)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()) is not None


def _number(value):
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _unique(get, rule):
    seen, out = {}, []
    for label, value, _ in found(get, rule["path"]):
        if value is UNSET:
            continue
        key = repr(value)
        if key in seen:
            out.append(_refusal(rule, label, value, f"{rule['expected']} ({seen[key]} has it already)"))
        seen.setdefault(key, label)
    return out


def _required_when(get, rule):
    if not all(get(name) == wanted for name, wanted in rule["required_when"].items()):
        return []
    return [_refusal(rule, label, value) for label, value, _ in found(get, rule["path"]) if _empty(value)]


def _among(get, rule, value):
    """The items of value (its keys for keys_among) that are not among the values at the other path; None when
    that path holds nothing (the rule cannot judge)."""
    allowed = [str(v).rstrip("/") for v in values_at(get, rule.get("among") or rule.get("keys_among"))]
    if not allowed:
        return None
    if "keys_among" in rule:
        items = list(value) if isinstance(value, dict) else []
    else:
        items = value if isinstance(value, list) else [value]
    return [i for i in items if str(i).rstrip("/") not in allowed], allowed


# Each simple kind: (get, rule, value) -> whether the value is refused.
_REFUSED = {
    "match": lambda get, rule, value: isinstance(value, (dict, list)) or not re.search(rule["match"], str(value)),
    "string": lambda get, rule, value: not isinstance(value, str),
    "min": lambda get, rule, value: not int_like(value) or int(value) < rule["min"],
    "range": lambda get, rule, value: not int_like(value) or not rule["range"][0] <= int(value) <= rule["range"][1],
    "above": lambda get, rule, value: _number(value) is None or _number(value) <= rule["above"],
    "needs": lambda get, rule, value: not _empty(value) and _empty(get(rule["needs"])),
    "differs_from": lambda get, rule, value: (
        get(rule["differs_from"]) is not UNSET and str(get(rule["differs_from"])) == str(value)
    ),
}


def _refusal(rule, label, value, expected=None):
    return Refusal(label, value, expected or rule["expected"], rule["fix"], root_of(rule["path"]))


def _simple(get, rule):
    if "unique" in rule:
        return _unique(get, rule)
    if "required_when" in rule:
        return _required_when(get, rule)
    out = []
    for label, value, _ in found(get, rule["path"]):
        if value is UNSET or value is None:
            continue
        if "among" in rule or "keys_among" in rule:
            judged = None if _empty(value) else _among(get, rule, value)
            if judged and judged[0]:
                close = difflib.get_close_matches(str(judged[0][0]), judged[1], n=1, cutoff=0.0)
                refusal = _refusal(rule, label, value, f"{rule['expected']} ({', '.join(judged[1])})")
                refusal.fix = refusal.fix.replace("{closest}", close[0] if close else judged[1][0])
                out.append(refusal)
            continue
        kind = next(k for k in _REFUSED if k in rule)
        if _REFUSED[kind](get, rule, value):
            out.append(_refusal(rule, label, value))
    return out


# --- the checks that need code -------------------------------------------------------------------------------


def _cuda_versions(get, rule):
    """A list of distinct quoted X.Y versions; options.default (a variable) is one of them or empty."""
    name = rule["path"]
    versions = get(name)
    default_name = (rule.get("options") or {}).get("default")
    if versions is UNSET:
        return []
    out = []
    if not isinstance(versions, list) or not all(
        isinstance(v, str) and re.fullmatch(r"[0-9]+\.[0-9]+", v) for v in versions
    ):
        return [
            Refusal(
                name,
                versions,
                'a list of quoted X.Y versions such as ["12.8", "13.0"] (unquoted, 13.0 is the number 13)',
                f'{name}: ["12.8", "13.0"]',
                name,
            )
        ]
    if len(set(versions)) != len(versions):
        out.append(Refusal(name, versions, "distinct versions", f"{name}: {sorted(set(versions))}", name))
    default = get(default_name) if default_name else UNSET
    if not _empty(default) and default not in versions:
        fix = f'{default_name}: "{versions[-1]}"' if versions else f'{default_name}: ""'
        out.append(Refusal(default_name, default, f"one of {name} ({', '.join(versions)}) or empty", fix, default_name))
    return out


def _cuda_home(get, rule):
    """A build's cuda_home is the home of a toolkit the guest installs (cuda_toolkit_versions, and /usr/local/cuda
    with a default), when the guest names its toolkits; an empty cuda_home lets the build find its own."""
    versions = get("cuda_toolkit_versions")
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions) or not versions:
        return []
    homes = [f"/usr/local/cuda-{v}" for v in versions]
    if not _empty(get("cuda_toolkit_default")):
        homes.append("/usr/local/cuda")
    out = []
    for label, value, _ in found(get, rule["path"]):
        if _empty(value) or not isinstance(value, str) or not value.startswith("/"):
            continue
        if value.rstrip("/") not in homes:
            close = difflib.get_close_matches(value, homes, n=1, cutoff=0.0) or homes[-1:]
            out.append(
                Refusal(
                    label,
                    value,
                    f"the home of a CUDA toolkit this guest installs ({', '.join(homes)}: cuda_toolkit_versions and "
                    "its default); to build with another, add its X.Y to the toolkits",
                    f"cuda_home: {close[0]}",
                    root_of(rule["path"]),
                )
            )
    return out


def _each(get, rule, judge):
    """The refusals of judge over every value at the rule's path that is set: judge(value, parent) returns None
    for a good value, or (expected, fix)."""
    out = []
    for label, value, parent in found(get, rule["path"]):
        if value is UNSET:
            continue
        wrong = judge(value, parent)
        if wrong:
            out.append(Refusal(label, value, wrong[0], wrong[1], root_of(rule["path"])))
    return out


def _python_version(get, rule):
    """A Python version is a quoted string (or an interpreter path): unquoted, YAML reads 3.10 as the number 3.1."""

    def judge(value, _):
        if isinstance(value, str):
            return None
        meant = "3.12" if isinstance(value, (bool, dict, list)) or value is None else str(value)
        meant = "3.10" if meant == "3.1" else meant
        expected = "a quoted Python version (or an interpreter path): unquoted, YAML reads 3.10 as the number 3.1"
        return expected, f'python: "{meant}"'

    return _each(get, rule, judge)


def _steps(get, rule):
    """An environment has at least one step, and each step lists packages."""

    def judge(steps, _):
        listed = isinstance(steps, list) and all(isinstance(s, dict) and s.get("packages") for s in steps)
        if steps and listed:
            return None
        return "at least one step, each with packages", "steps: [{name: ..., packages: [...]}]"

    return _each(get, rule, judge)


def _arch_list(get, rule):
    """A build's arch_list_variable is a variable its own environment sets (the arch list it compiles)."""

    def judge(value, build):
        environment = build.get("environment") if isinstance(build, dict) else None
        if _empty(value) or (isinstance(environment, dict) and value in environment):
            return None
        return (
            "the name of a variable the build's environment sets (the arch list the build compiles)",
            "arch_list_variable: FLASH_ATTN_CUDA_ARCHS, with FLASH_ATTN_CUDA_ARCHS in environment",
        )

    return _each(get, rule, judge)


def _gpus_named_one_way(get, rule):
    """The GPUs are named one way: exactly one of the two variables (path and options.other) names some."""
    other = rule["options"]["other"]
    mine, theirs = get(rule["path"]), get(other)
    if _empty(mine) == _empty(theirs):
        return [
            Refusal(
                rule["path"],
                mine,
                f"the GPUs named one way: {rule['path']} or {other}, exactly one",
                f"{rule['path']}: \"{{{{ inferhost_gpus | map(attribute='address') | list }}}}\", no {other}",
                rule["path"],
            )
        ]
    return []


def _api_secret(get, rule):
    """The password (or, with a token, its secret) for the Proxmox API: there, unless options.unless holds."""
    unless = (rule.get("options") or {}).get("unless") or {}
    if unless and all(get(name) == value for name, value in unless.items()):
        return []
    token = get("pve_api_token_id")
    name = "pve_api_token_secret" if not _empty(token) else "pve_api_password"
    secret = get(name)
    if not _empty(secret):
        return []
    if not _empty(token):
        return [Refusal(name, secret, "the secret of pve_api_token_id", f"set {name} from Ansible Vault", name)]
    return [
        Refusal(
            name,
            secret,
            "root@pam's password for the Proxmox API (or pve_api_backend: local, for the modules only)",
            "put vault_proxmox_password in an encrypted inventory/<site>/group_vars/all/vault.yml "
            "(ansible-vault create; README, Secrets), or export PROXMOX_PASSWORD",
            name,
        )
    ]


def _hookscript_user(get, rule):
    """Only root@pam with a password may set hookscripts, devN and raw hostpciN entries."""
    attach = get(rule["path"])
    user = get("pve_api_user")
    user = "root@pam" if user is UNSET else user
    token = get("pve_api_token_id")
    if attach is False or (user == "root@pam" and _empty(token)):
        return []
    return [
        Refusal(
            "pve_api_user",
            user,
            f"root@pam with a password while {rule['path']} is true (only root@pam may set hookscripts, devN and "
            "raw hostpciN)",
            f"pve_api_user: root@pam and no pve_api_token_id, or {rule['path']}: false",
            "pve_api_user",
        )
    ]


def _guest_gpu_login(get, rule):
    """Raw hostpciN and devN are root@pam's: another login (a token included) needs the VMs' GPUs as PCI mappings
    (pve_guest_gpu_use_pci_mappings), and may not wire containers, whose devN entries have no mapping."""
    value = get(rule["path"])
    user = get("pve_api_user")
    user = "root@pam" if user is UNSET else user
    token = get("pve_api_token_id")
    if _empty(value) or get("pve_api_backend") == "local" or (user == "root@pam" and _empty(token)):
        return []
    who = f"the API token {user}!{token}" if not _empty(token) else f"the user {user}"
    if rule["path"] == "pve_guest_gpu_containers":
        return [
            Refusal(
                rule["path"],
                value,
                f"no containers while the Proxmox login is {who}: PVE has no resource mapping for a container's devN "
                "entries, so only root@pam logged in with its password (or pvesh on the node) may set them",
                "pve_api_user: root@pam with pve_api_password and no pve_api_token_id (or pve_api_backend: local)",
                rule["path"],
            )
        ]
    mappings = get("pve_guest_gpu_use_pci_mappings")
    if mappings is True:
        return []
    return [
        Refusal(
            "pve_guest_gpu_use_pci_mappings",
            False if mappings is UNSET else mappings,
            f"true while the Proxmox login is {who}: raw hostpciN entries are root@pam's, and a login with "
            "Mapping.Use may set hostpciN: mapping=<id>",
            "pve_guest_gpu_use_pci_mappings: true (the login needs Mapping.Modify on /mapping/pci, Mapping.Use on "
            "/mapping/pci/<id> and VM.Config.HWType on the VM), or log in as root@pam with its password",
            "pve_guest_gpu_use_pci_mappings",
        )
    ]


MAPPING_FACTS = ("vendor", "device", "subsystem_vendor", "subsystem_device", "iommu_group")


def _gpu_facts_for_mappings(get, rule):
    """With pve_guest_gpu_use_pci_mappings and VMs to wire, each GPU carries what its mapping needs (MAPPING_FACTS)."""
    gpus = get(rule["path"])
    if (
        get("pve_guest_gpu_use_pci_mappings") is not True
        or _empty(get("pve_guest_gpu_vms"))
        or not isinstance(gpus, list)
    ):
        return []
    out = []
    for n, gpu in enumerate(gpus):
        lacking = [key for key in MAPPING_FACTS if not isinstance(gpu, dict) or key not in gpu]
        if lacking:
            out.append(
                Refusal(
                    f"{rule['path']}[{n}]",
                    gpu,
                    f"a GPU as pve_host_gpu publishes it, with {', '.join(MAPPING_FACTS)} for its PCI mapping "
                    f"(this one lacks {', '.join(lacking)}: facts of an older pve_host_gpu)",
                    "run pve_host_gpu on the host again (it publishes ansible_local.inferhost_gpu_facts.gpus)",
                    rule["path"],
                )
            )
    return out


def _module_options(get, rule):
    """Kernel module options: module names of a-z0-9_, each a mapping of parameters without quotes or newlines."""
    options = get(rule["path"])
    if not isinstance(options, dict):
        return []
    out = []
    for module, params in options.items():
        ok = (
            re.fullmatch(r"[a-z0-9_]+", str(module))
            and isinstance(params, dict)
            and all(
                re.fullmatch(r"[A-Za-z0-9_]+", str(k)) and not re.search(r'["\n]', str(v)) for k, v in params.items()
            )
        )
        if not ok:
            out.append(
                Refusal(
                    f"{rule['path']}.{module}",
                    params,
                    "a mapping of parameter names (letters, digits, _) to values without quotes or newlines",
                    "nvidia_uvm: {uvm_disable_hmm: 1}",
                    rule["path"],
                )
            )
    return out


def _host_gpus(get):
    """The addresses (and slots) of the host's GPUs: the role's list from the host's facts, else the inventory's."""
    gpus = get("pve_guest_gpu_gpus")
    if not (isinstance(gpus, list) and gpus):
        gpus = get("inferhost_gpus")
    if not isinstance(gpus, list):
        return []
    known = []
    for gpu in gpus:
        if isinstance(gpu, dict):
            known += [str(gpu[k]) for k in ("address", "slot") if gpu.get(k)]
    return known


def _guest_gpus(get, rule):
    """A guest's gpus: all, or a list of the host's GPU addresses."""
    known = _host_gpus(get)
    out = []
    for label, asked, _ in found(get, rule["path"]):
        if asked is UNSET or asked == "all":
            continue
        if not isinstance(asked, list):
            out.append(
                Refusal(label, asked, "all, or a list of this host's GPU addresses", "gpus: all", root_of(rule["path"]))
            )
            continue
        unknown = [a for a in asked if known and str(a) not in known]
        if unknown:
            out.append(
                Refusal(
                    label, asked, f"GPUs of this host ({', '.join(sorted(known))})", "gpus: all", root_of(rule["path"])
                )
            )
    return out


def _gpu_indices(get, rule):
    """A service's GPUs: a YAML list of indices (integers)."""

    def judge(gpus, _):
        if isinstance(gpus, list) and all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            return None
        example = list(range(len(gpus))) if isinstance(gpus, list) and gpus else [0, 1]
        return "a YAML list of GPU indices (integers), such as [0, 1]; a string is not a list", f"gpus: {example}"

    return _each(get, rule, judge)


def _capability(get, rule):
    """A compute capability is the quoted "X.Y" the known-bad rules compare with ("12.0"); any other form ("120",
    the number 12.0) matches none of them and switches every rule for the GPU off without a word."""

    def judge(capability, _):
        if isinstance(capability, str) and re.fullmatch(r"[0-9]+\.[0-9]", capability):
            return None
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
        expected = (
            'the compute capability as a quoted "X.Y" such as "12.0" (major.minor, as nvidia-smi --query-gpu='
            "compute_cap shows it): the known-bad rules compare with that form"
        )
        return expected, f'compute_capability: "{meant}"'

    return _each(get, rule, judge)


def _patch_diffs(get, rule):
    """Each patch of a build carries its diff."""
    out = []
    for label, patches, _ in found(get, rule["path"]):
        if not isinstance(patches, list):
            continue
        for index, patch in enumerate(patches):
            if isinstance(patch, dict) and "diff" not in patch:
                out.append(
                    Refusal(
                        f"{label}[{index}].diff",
                        UNSET,
                        "the patch as a unified diff",
                        "add diff: | with the patch",
                        root_of(rule["path"]),
                    )
                )
    return out


CHECKS = {
    "cuda_versions": _cuda_versions,
    "cuda_home_is_a_toolkit": _cuda_home,
    "python_version": _python_version,
    "steps_with_packages": _steps,
    "arch_list_in_environment": _arch_list,
    "gpus_named_one_way": _gpus_named_one_way,
    "api_secret": _api_secret,
    "hookscript_user": _hookscript_user,
    "guest_gpu_login": _guest_gpu_login,
    "gpu_facts_for_mappings": _gpu_facts_for_mappings,
    "module_options": _module_options,
    "guest_gpus_on_host": _guest_gpus,
    "gpu_indices": _gpu_indices,
    "compute_capability": _capability,
    "patch_diffs": _patch_diffs,
}
# The variables a check reads besides its path (the tests set them; the controller's view gives them).
CHECK_READS = {
    "cuda_home_is_a_toolkit": ("cuda_toolkit_versions", "cuda_toolkit_default"),
    "api_secret": ("pve_api_token_id", "pve_api_token_secret", "pve_api_password", "pve_api_backend"),
    "hookscript_user": ("pve_api_user", "pve_api_token_id"),
    "gpu_facts_for_mappings": ("pve_guest_gpu_use_pci_mappings", "pve_guest_gpu_vms"),
    "guest_gpu_login": ("pve_api_user", "pve_api_token_id", "pve_api_backend", "pve_guest_gpu_use_pci_mappings"),
    "guest_gpus_on_host": ("pve_guest_gpu_gpus", "inferhost_gpus"),
}


def report(refusals, show) -> list[str]:
    """One line per refusal, as both preflights print it; show(value, name) -> how a value is shown."""
    return [
        f"{r.variable}: given {show(r.given, r.variable.split('.')[-1].split('[')[0])}; expected {r.expected}. "
        f"Fix: {r.fix}."
        for r in refusals
    ]
