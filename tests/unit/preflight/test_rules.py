"""Each role's value rules (roles/<role>/meta/rules.yml) are stated once and run by both preflights.

For every rule, the value it says it refuses is given to the controller's preflight (the Checker, before any
play) and to the role's own preflight (action inferhost_role_rules, when the role runs alone): both must refuse
it, naming the variable. A value rule written anywhere else in a role's preflight fails the layout test below.
"""

import importlib.util
import re
from pathlib import Path
from unittest.mock import MagicMock

import pytest
import yaml
from preflight import checks, inventory, rules

ROOT = Path(__file__).resolve().parents[3]
ROLES = inventory.role_names()
RULES = {role: inventory.load_rules(str(ROOT / "roles" / role)) for role in ROLES}
SPECS, DECLARED = {}, set()
for _role in ROLES:
    SPECS[_role], _names = inventory.load_role(str(ROOT / "roles" / _role))
    DECLARED |= _names
CASES = [
    pytest.param(
        role, rule, id=f"{role}:{index}:{rule['path']}:{rule.get('check') or next(k for k in rules.KINDS if k in rule)}"
    )
    for role, role_rules in RULES.items()
    for index, rule in enumerate(role_rules)
]


def _action():
    path = ROOT / "plugins" / "action" / "inferhost_role_rules.py"
    spec = importlib.util.spec_from_file_location("inferhost_action_role_rules", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ACTION = _action()


def run_role_rules(role, task_vars):
    task = MagicMock()
    task.args = {}
    task.async_val = 0
    task.check_mode = False
    task._role._role_path = str(ROOT / "roles" / role)
    templar = MagicMock()
    templar.template.side_effect = lambda value: value
    plugin = ACTION.ActionModule(task, MagicMock(), MagicMock(), MagicMock(), templar, MagicMock())
    return plugin.run(task_vars=task_vars)


def given(rule):
    """The variables that make the rule's refused value: the value where the rule reads it, and its context."""
    variables = dict(rule.get("with") or {})
    variables[rules.root_of(rule["path"])] = rule["refuses"]
    return variables


def names(variable):
    """The variable and the paths above it: a refusal of python_env_environments[0].name names each of them."""
    parts = re.findall(r"\[[0-9]+\]|\.[A-Za-z0-9_]+|^[A-Za-z0-9_]+", variable)
    return {"".join(parts[: i + 1]) for i in range(len(parts))}


def named(refused, rule):
    """Whether a refused variable is the rule's own (its path with indices), or a variable its check names."""
    pattern = re.escape(rule["path"]).replace(r"\[\]", r"\[[0-9]+\]")
    return bool(re.match(pattern, refused)) or refused in rules.variables_of(rule)


@pytest.mark.parametrize(("role", "rule"), CASES)
def test_the_role_refuses_what_its_rule_refuses(role, rule):
    result = run_role_rules(role, given(rule))
    assert result.get("failed"), result["msg"]
    assert any(named(v, rule) for v in result["refused"]), result["msg"]
    assert "nothing was changed" in result["msg"]


@pytest.mark.parametrize(("role", "rule"), CASES)
def test_the_controller_refuses_what_the_rule_refuses(role, rule):
    variables = given(rule)
    view = inventory.HostView("h", variables, variables.__getitem__, ["g"])
    found = checks.Checker({"h": view}, ["h"], {"h": [role]}, SPECS, DECLARED, rules=RULES).run()
    refused = [p.variable for p in found]
    assert any(named(v, rule) for v in refused), [p.line() for p in found]


@pytest.mark.parametrize(("role", "rule"), CASES)
def test_the_roles_accept_the_example_value_where_the_rule_reads(role, rule):
    """The rule reads variables that some role declares or that the inventory sets (no rule checks a name
    that nothing can set)."""
    for name in rules.variables_of(rule):
        assert name in DECLARED or name in inventory.INVENTORY_NAMES, (role, name)


def test_the_roles_come_from_the_roles_folder():
    assert set(ROLES) == {p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file()}
    assert {f"{role}_" for role in ROLES} == set(inventory.ROLE_PREFIXES)


@pytest.mark.parametrize("role", ROLES)
def test_a_role_with_rules_runs_them_first_in_its_preflight(role):
    preflight = ROOT / "roles" / role / "tasks" / "preflight.yml"
    if not RULES[role]:
        assert not preflight.is_file() or "inferhost_role_rules" not in preflight.read_text()
        return
    tasks = yaml.safe_load(preflight.read_text())
    assert "inferhost_role_rules" in tasks[0], f"{preflight}: the first task runs the role's rules"
    main = (ROOT / "roles" / role / "tasks" / "main.yml").read_text()
    assert "preflight.yml" in main


# Asserts on a variable that the host playbook fills from the host's published facts: on a fresh host the
# controller cannot know it, so the role checks it where it runs.
FROM_THE_HOST = {
    "preflight | Check the host's GPU inventory is known": "pve_guest_gpu_gpus: ansible_local.inferhost_gpu_facts",
}


@pytest.mark.parametrize("role", ROLES)
def test_no_value_rule_is_stated_outside_the_rules_file(role):
    """An assert in a role's preflight checks what the rules cannot: facts of the machine, results of a probe,
    the order of roles. One that reads nothing but the role's own variables is a value rule: it belongs in
    meta/rules.yml, where the controller runs it too."""
    preflight = ROOT / "roles" / role / "tasks" / "preflight.yml"
    if not preflight.is_file():
        return
    # What the role learnt from the machine: results it registered, facts it set, role vars built on them.
    learnt = set()
    for tasks in (ROOT / "roles" / role / "tasks").glob("*.yml"):
        for task in yaml.safe_load(tasks.read_text()) or []:
            learnt.update([task["register"]] if "register" in task else [])
            learnt.update(k for k in (task.get("ansible.builtin.set_fact") or {}) if k != "cacheable")
    role_vars = ROOT / "roles" / role / "vars" / "main.yml"
    for name, value in (yaml.safe_load(role_vars.read_text()) if role_vars.is_file() else {}).items():
        if any(known in str(value) for known in learnt):
            learnt.add(name)
    machine = re.compile(
        "|".join(["ansible_facts", "ansible_check_mode", "inventory_hostname", " is defined", *learnt])
    )
    for task in yaml.safe_load(preflight.read_text()) or []:
        if task["name"] in FROM_THE_HOST:
            continue
        condition = (task.get("ansible.builtin.assert") or {}).get("that")
        if condition is None:
            continue
        text = " ".join(condition) if isinstance(condition, list) else str(condition)
        text += " " + " ".join(map(str, (task.get("vars") or {}).values()))
        assert machine.search(text), f"{preflight}: {task['name']} checks values only: state it in meta/rules.yml"
