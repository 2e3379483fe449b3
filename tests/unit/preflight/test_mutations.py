"""Every option of every role, given the mistakes people make in YAML: each refused by the controller's preflight,
naming the variable, or accepted on purpose with the reason in the role's meta/rules.yml (``accepts``).

The mutations come from the option's own argument spec: the wrong type, the YAML trap of its type (a float where
a string or path is meant: 3.10 unquoted is 3.1; a string where a list is meant), a relative path, and numbers
out of range (below zero, and above 65535 for a port). The preflight runs as the validation play runs it:
Ansible's argument spec validation, the YAML traps, and the role's value rules.
"""

import importlib.util
from pathlib import Path

import pytest
import yaml
from preflight import checks, inventory, rules

ROOT = Path(__file__).resolve().parents[3]
ROLES = inventory.role_names()
SPECS, DECLARED, RULES, ACCEPTED = {}, set(), {}, {}
for _role in ROLES:
    _dir = str(ROOT / "roles" / _role)
    SPECS[_role], _names = inventory.load_role(_dir)
    DECLARED |= _names
    RULES[_role] = inventory.load_rules(_dir)
    ACCEPTED[_role] = rules.accepted(_dir, inventory.load_yaml)


def _validator():
    spec = importlib.util.spec_from_file_location(
        "inferhost_action_preflight", ROOT / "plugins/action/inferhost_preflight.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.validate


VALIDATE = _validator()


def mutations(name, option):
    """(mutation, value) pairs for one option, from its type."""
    kind = option.get("type", "str")
    if option.get("choices"):
        return [("not-a-choice", "no-such-choice")]
    out = {
        "str": [("yaml-trap", 3.1), ("wrong-type", ["a", "b"])],
        "path": [("yaml-trap", 3.1), ("wrong-type", ["a"]), ("relative-path", "relative/path")],
        "int": [("wrong-type", "lots"), ("negative", -1)],
        "float": [("wrong-type", "fast"), ("negative", -1.0)],
        "bool": [("wrong-type", "maybe")],
        "list": [("yaml-trap", "a,b"), ("wrong-type", {"a": 1})],
        "dict": [("wrong-type", "not a mapping")],
    }.get(kind, [])
    if kind == "int" and name.endswith("_port"):
        out.append(("too-large", 70000))
    if kind == "list" and option.get("elements") == "int":
        out.append(("wrong-elements", ["x"]))
    return out


CASES = [
    pytest.param(role, name, mutation, value, id=f"{name}:{mutation}")
    for role in ROLES
    for name, option in SPECS[role].items()
    if isinstance(option, dict)
    for mutation, value in mutations(name, option)
]


def refused(role, name, value):
    view = inventory.HostView("h", {name: value}, {name: value}.__getitem__, ["g"])
    found = checks.Checker({"h": view}, ["h"], {"h": [role]}, SPECS, DECLARED, validator=VALIDATE, rules=RULES).run()
    return [p for p in found if p.variable == name or p.variable.startswith((f"{name}[", f"{name}."))]


@pytest.mark.parametrize(("role", "name", "mutation", "value"), CASES)
def test_a_mistaken_value_is_refused_naming_the_variable_or_accepted_with_a_reason(role, name, mutation, value):
    reason = (ACCEPTED[role].get(name) or {}).get(mutation)
    found = refused(role, name, value)
    if reason:
        assert not found, f"{name}: {mutation} is declared accepted ({reason}), but the preflight refuses it"
        return
    assert found, (
        f"{name} = {value!r} ({mutation}) reaches the machines: refuse it with a rule in roles/{role}/meta/rules.yml, "
        f"or say under accepts why the role takes it"
    )
    problem = found[0]
    assert problem.expected and problem.fix, problem.line()


def test_every_acceptance_names_an_option_and_a_mutation_the_test_makes():
    for role in ROLES:
        for name, reasons in ACCEPTED[role].items():
            made = {m for m, _ in mutations(name, SPECS[role].get(name) or {})}
            assert name in SPECS[role], f"roles/{role}/meta/rules.yml accepts {name}, which the role does not declare"
            for mutation, reason in reasons.items():
                assert mutation in made, f"{role}: {name} accepts {mutation}, a mutation its type never gets"
                assert str(reason).strip(), f"{role}: {name} accepts {mutation} without a reason"


def test_the_count_of_mutations(record_property):
    """How many mistakes the test makes (the closing note of the work quotes it)."""
    record_property("mutations", len(CASES))
    accepted = sum(len(r) for a in ACCEPTED.values() for r in a.values())
    assert len(CASES) > 300 and accepted < len(CASES) // 4, (len(CASES), accepted)
    yaml.safe_dump({"mutations": len(CASES), "accepted": accepted})
