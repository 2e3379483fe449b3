"""Static checks of the whole repository: each must report nothing."""

import ast
import importlib.util
import json
import re
import subprocess
from pathlib import Path
from unittest import mock

import pytest
import yaml
from module_runner import load_module

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))
pytestmark = pytest.mark.static


def run(*argv):
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (
        f"{' '.join(argv)} (rc {proc.returncode}):\n{proc.stdout[-5000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout + proc.stderr


def test_ansible_lint_production_profile():
    out = run("ansible-lint", "--profile", "production", "--nocolor")
    summary = re.search(r"(\d+) failure\(s\), (\d+) warning\(s\)", out)
    assert summary, out[-3000:]
    failures, warnings = (int(n) for n in summary.groups())
    # The only warnings are the exceptions of .ansible-lint-ignore, each with its reason (the next test).
    ignored = re.findall(r"^\S+: .*# ignored$", out, re.M)
    assert failures == 0 and warnings == len(ignored), out[-3000:]


def test_no_lint_exceptions_without_a_reason():
    ignore = ROOT / ".ansible-lint-ignore"
    if not ignore.exists():
        return
    lines = ignore.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip() and not line.startswith("#"):
            assert i > 0 and lines[i - 1].startswith("#"), f".ansible-lint-ignore line {i + 1} has no reason above it"


def test_yamllint():
    run("yamllint", "--strict", ".")


def test_ruff_check():
    run("ruff", "check", ".")


def test_ruff_format():
    run("ruff", "format", "--check", ".")


@pytest.mark.parametrize(
    "playbook", ["site.yml", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("playbooks/*.yml"))]
)
def test_syntax_check(playbook):
    run("ansible-playbook", "-i", "inventory/lab/hosts.yml", "--syntax-check", playbook)


@pytest.mark.parametrize("module", [f"{name}.py" for name in MODULES])
def test_module_documentation_is_yaml(module):
    # ansible-doc and ansible-lint read these blocks as YAML; a stray "key: value" inside prose breaks them.
    tree = ast.parse((ROOT / "plugins" / "modules" / module).read_text())
    blocks = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN")
    }
    assert "DOCUMENTATION" in blocks, f"{module} has no DOCUMENTATION"
    for name, text in blocks.items():
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as err:
            pytest.fail(f"{module} {name} is not valid YAML: {err}")
    assert yaml.safe_load(blocks["DOCUMENTATION"])["module"] == module[:-3]


def ansible_doc(*names):
    """{name: documentation} as ansible-doc renders it, the doc fragments it extends merged in; or its error."""
    proc = subprocess.run(
        ["ansible-doc", "-t", "module", "--json", *names], cwd=ROOT, capture_output=True, text=True, check=False
    )
    # An unknown fragment (ansible.cfg's doc_fragment_plugins) or a broken block fails the whole call.
    return json.loads(proc.stdout) if proc.returncode == 0 else proc.stderr.strip()[-3000:]


@pytest.fixture(scope="module")
def module_docs():
    """{module: its rendered documentation, or the error ansible-doc gave for it}."""
    docs = ansible_doc(*MODULES)
    if not isinstance(docs, str):
        return docs
    # One module failed the call: ask module by module, so that the failure is that module's alone.
    docs = {name: ansible_doc(name) for name in MODULES}
    return {name: one if isinstance(one, str) else one[name] for name, one in docs.items()}


class GivenSpec(Exception):
    """Raised in place of building the AnsibleModule: main() got as far as its argument spec."""


def argument_spec(name):
    """The argument spec a module's main() builds, or None for a module without main() (an action does its work)."""
    module = load_module(name)
    if not hasattr(module, "main"):
        return None

    def stop(argument_spec, **_):
        raise GivenSpec(argument_spec)

    with mock.patch.object(module, "AnsibleModule", stop), pytest.raises(GivenSpec) as given:
        module.main()
    return given.value.args[0]


def action_arguments(name):
    path = ROOT / "plugins" / "action" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"inferhost_action_{name}", path)
    action = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(action)
    return set(action.ActionModule._VALID_ARGS)


def agreed(options, nested):
    """What documentation and argument spec must both say of each option; nested: the key of its sub-options."""
    return {
        name: {
            "type": option.get("type", "str"),
            "required": bool(option.get("required")),
            "default": option.get("default"),
            "choices": list(option["choices"]) if option.get("choices") else None,
            "elements": option.get("elements"),
            "options": agreed(option.get(nested) or {}, nested),
        }
        for name, option in options.items()
    }


@pytest.mark.parametrize("module", MODULES)
def test_module_documentation_matches_its_argument_spec(module, module_docs):
    rendered = module_docs[module]
    assert not isinstance(rendered, str), f"ansible-doc cannot render {module}: {rendered}"
    documented = agreed(rendered["doc"].get("options") or {}, "suboptions")
    spec = argument_spec(module)
    if spec is None:
        assert set(documented) == action_arguments(module), f"{module}: documented options differ from the action's"
        return
    taken = agreed(spec, "options")
    differ = {
        name: {"documented": documented.get(name), "taken": taken.get(name)}
        for name in sorted(set(documented) | set(taken))
        if documented.get(name) != taken.get(name)
    }
    assert not differ, f"{module}: documentation and argument spec disagree: {differ}"


def test_production_code_reaches_nothing_that_pretends():
    """roles/ and plugins/ run on real hosts: none of their files imports the simulation wing or names its path,
    and nothing in them speaks of a simulated mode (gpu-switch has none)."""
    offenders = []
    for path in sorted([*(ROOT / "roles").rglob("*"), *(ROOT / "plugins").rglob("*")]):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        text = path.read_text(errors="replace")
        for needle in ("inferhost.sim", "inferhost/sim", "sim/gpu", "fakesys", "FAKE_KERNEL", "simulat"):
            if needle.lower() in text.lower():
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert not offenders, offenders


# role_path followed by a step up, in a template ({{ role_path }}/..) or an expression (role_path ~ '/..').
ROLE_PATH_UP = re.compile(r"role_path\s*(?:\}\}|~\s*['\"])\s*/?\.\.")
# A relative path's leading steps up (../../x), not part of a longer name (a...b, x/../y counts from x).
STEPS_UP = re.compile(r"(?<![\w.~/-])((?:\.\./)+)")


def climbs_out(text, depth):
    """The paths of text that leave a role, for a file `depth` folders below the role's top: role_path and a step
    up, or more steps up than the file is deep."""
    found = [m.group(0) for m in ROLE_PATH_UP.finditer(text)]
    return found + [m.group(1) for m in STEPS_UP.finditer(text) if m.group(1).count("../") > depth]


@pytest.mark.parametrize(
    ("text", "depth", "out"),
    [
        ('dir: "{{ role_path }}/../../plugins/module_utils"', 1, True),
        ("src: \"{{ role_path ~ '/../x' }}\"", 1, True),
        ("src: ../../plugins/module_utils/x.py", 1, True),
        ("subdirectory: ../x", 1, False),  # meta/ to the role's top, still inside
        ("src: ../files/x", 1, False),
        ("src: ../../files/x", 2, False),  # from molecule/default/ inside the role
        ("{{ role_path }}/files/x", 1, False),
    ],
)
def test_the_climb_check_sees_a_path_out_of_a_role(text, depth, out):
    assert bool(climbs_out(text, depth)) is out


def test_no_role_reaches_past_its_own_folder():
    """A role takes what it ships from its own folders and what Ansible finds for it (modules, module_utils by
    name: config_files' packages); a path out of the role (role_path/../..) ties it to one checkout's layout."""
    offenders = []
    for role in sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir()):
        for path in sorted(role.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            hits = climbs_out(path.read_text(errors="replace"), len(path.relative_to(role).parts) - 1)
            offenders += [f"{path.relative_to(ROOT)}: {hit}" for hit in hits]
    assert not offenders, offenders


# The first word of a role's switch after the role's prefix (docs/layout.md, "Names"): what the role does when
# the switch is true. validate is Ansible's own (validate_certs).
SWITCH_VERBS = frozenset(
    {"add", "allow", "attach", "check", "create", "install", "move", "recover", "reboot", "require", "run", "use"}
    | {"validate", "wait", "write"}
)


def switch_is_a_verb_phrase(role, name):
    rest = name.removeprefix(f"{role}_")
    return rest != name and rest.split("_")[0] in SWITCH_VERBS


@pytest.mark.parametrize(
    ("name", "verb_phrase"),
    [
        ("pve_host_gpu_allow_swap", True),
        ("pve_host_gpu_swap_expected", False),  # an adjective
        ("pve_host_gpu_persistenced", False),  # a bare noun
        ("pve_host_gpu_nvidia_repo_enabled", False),
        ("nccl_tuning_install", False),  # another role's prefix
        ("pve_host_gpu_reboot", True),
    ],
)
def test_the_switch_check_sees_a_name_that_is_no_verb_phrase(name, verb_phrase):
    assert switch_is_a_verb_phrase("pve_host_gpu", name) is verb_phrase


def test_every_switch_of_a_role_is_a_verb_phrase():
    """A role's bool option says what the role does when it is true, so `when: <switch>` reads as a sentence.
    Only the role's own options: a bool field of an item of its data (a service's expert_parallel) describes
    the item."""
    offenders = []
    for spec in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        role = spec.parents[1].name
        for entry, body in yaml.safe_load(spec.read_text())["argument_specs"].items():
            for name, option in (body.get("options") or {}).items():
                if option.get("type") == "bool" and not switch_is_a_verb_phrase(role, name):
                    offenders.append(f"{role} ({entry}): {name}")
    assert not offenders, f"switches that are no verb phrase (a verb from SWITCH_VERBS after the prefix): {offenders}"


def test_a_pci_function_is_named_by_its_address():
    """docs/layout.md, "Names": the project calls a PCI function's domain:bus:slot.function its address, in code,
    data and docs; a second word for it (b-d-f, in any case, alone or inside an identifier) is refused."""
    word = re.compile(r"(?<![A-Za-z0-9])" + "b" + "df" + r"(?![A-Za-z0-9])", re.IGNORECASE)
    files = subprocess.run(
        ["git", "ls-files", "plugins", "roles", "playbooks", "src", "bin", "docs", "tests", "inventory", "README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    offenders = []
    for name in files:
        path = ROOT / name
        if path.is_file():
            offenders += [f"{name}:{n}" for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                          if word.search(line)]  # fmt: skip
    assert not offenders, offenders
