"""The gpu_switch role and the configuration schema of gpu-switch (config.py's SCHEMA) agree.

The role builds the file as one mapping (tasks/config.yml, the set_fact of __gpu_switch_config). Every key
it writes is a field of the schema; every field but those in NOT_WRITTEN is written. A field's role variable
is the first public variable its value names, the role's own or, for the Proxmox connection, that of role
pve_api (run before it in the play); that variable's argument spec (the role's meta/argument_specs.yml) has the field's
type, default, choices and requiredness, field by field where a whole section comes from one mapping. And
the role's own template task writes what check-config accepts, and refuses a bad file before it is in place.
"""

from __future__ import annotations

import json
import re
import stat
import sys
from pathlib import Path

import pytest
import yaml
from gpu_switch.config import SCHEMA, Field, Section, load_config
from localhost import run_playbook

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "gpu_switch"
# The role run before it in the play, whose variables hold the Proxmox connection settings.
API_ROLE = ROOT / "roles" / "pve_api"
PUBLIC = re.compile(r"(?<!\w)(?:gpu_switch|pve_api)_\w+")
INTERNAL = re.compile(r"(?<!\w)__gpu_switch_\w+")

# Fields the role does not write, and why.
NOT_WRITTEN = {
    "roots": "a host's own /sys, /proc, /run, /dev and /var/lib/gpu-switch; only tests and the lab move them",
}
# Defaults the role chooses apart from the command's, and why.
ROLE_DEFAULTS = {
    "proxmox.ca_file": "the role trusts PVE's cluster CA, whose certificate names 127.0.0.1; alone, the command "
    "trusts the system CAs",
}
# The argument spec types that carry each schema type (the role takes whole seconds).
SPEC_TYPES = {
    "str": {"str"},
    "path": {"path"},
    "int": {"int"},
    "float": {"int", "float"},
    "bool": {"bool"},
    "list": {"list"},
}


def role_mapping() -> dict:
    tasks = yaml.safe_load((ROLE / "tasks" / "config.yml").read_text())
    facts = [
        t["ansible.builtin.set_fact"] for t in tasks if "__gpu_switch_config" in t.get("ansible.builtin.set_fact", {})
    ]
    assert len(facts) == 1, "tasks/config.yml builds __gpu_switch_config in one set_fact"
    return facts[0]["__gpu_switch_config"]


def spec_options() -> dict:
    options = {}
    for role in (API_ROLE, ROLE):
        spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
        options.update(spec["argument_specs"]["main"]["options"])
    return options


def written(mapping: dict, section: Section = SCHEMA, where: str = ""):
    """(field path, schema entry, the role's value) of each key the role writes."""
    for key, value in mapping.items():
        path = f"{where}{key}"
        assert key in section.fields, f"the role writes {path}, a key the schema does not have"
        entry = section.fields[key]
        if isinstance(value, dict):
            assert isinstance(entry, Section), f"the role writes {path} key by key, but it is a single field"
            yield from written(value, entry, f"{path}.")
        else:
            yield path, entry, value


def fields(section: Section = SCHEMA, where: str = ""):
    """The path of every field and section of the schema."""
    for key, entry in section.fields.items():
        yield f"{where}{key}"
        if isinstance(entry, Section):
            yield from fields(entry, f"{where}{key}.")


def plain(value):
    """A default as the role spells it: nothing is None, a tuple a list."""
    if value in ("", [], {}, ()):
        return None
    return list(value) if isinstance(value, tuple) else value


def drift(path: str, entry: Field, option: dict, *, top: bool) -> list[str]:
    """How the argument spec option differs from the schema's field."""
    problems = []
    if option.get("type", "str") not in SPEC_TYPES[entry.type]:
        problems.append(f"type {option.get('type', 'str')}, the schema's {entry.type}")
    if option.get("elements") != entry.elements:
        problems.append(f"elements {option.get('elements')}, the schema's {entry.elements}")
    if list(option.get("choices") or []) != list(entry.choices or []):
        problems.append(f"choices {option.get('choices')}, the schema's {entry.choices}")
    if entry.required:
        if plain(option.get("default")) is not None:
            problems.append(f"a default ({option['default']!r}) for a field the schema requires")
        if top and not option.get("required"):
            problems.append("not required, but the schema requires it")
    elif option.get("required"):
        problems.append("required, but the schema has a default")
    else:
        ours, theirs = plain(option.get("default")), plain(entry.default)
        if path in ROLE_DEFAULTS:
            if ours == theirs:
                problems.append(f"the same default as the schema: drop it from ROLE_DEFAULTS ({ours!r})")
        elif ours != theirs:
            problems.append(f"default {ours!r}, the schema's {theirs!r}")
    return [f"{path}: {problem}" for problem in problems]


def test_the_role_writes_every_field_of_the_schema_and_no_other_key():
    done = {path for path, _, _ in written(role_mapping())}

    def under(path, others):
        return any(path == other or path.startswith(f"{other}.") for other in others)

    missing = [path for path in fields() if not under(path, done) and not any(d.startswith(f"{path}.") for d in done)]
    unexplained = [path for path in missing if not under(path, NOT_WRITTEN)]
    assert not unexplained, f"fields the role does not write: {unexplained}"
    assert set(NOT_WRITTEN) <= set(missing), "NOT_WRITTEN names a field the role writes"


def test_each_field_has_its_role_variable_with_the_schemas_type_default_and_choices():
    options, problems = spec_options(), []
    for path, entry, value in written(role_mapping()):
        names = PUBLIC.findall(str(value))
        if not names:
            assert INTERNAL.search(str(value)), f"{path}: the role writes neither a variable nor a computed value"
            continue
        option = options.get(names[0])
        assert option is not None, f"{path}: {names[0]} has no argument spec"
        if isinstance(entry, Field):
            problems += drift(path, entry, option, top=True)
            continue
        # A whole section from one mapping: the mapping's options are the section's fields.
        sub = option.get("options") or {}
        if option.get("type") != "dict" or set(sub) != set(entry.fields):
            problems.append(f"{path}: {names[0]} is not a dict with the options {list(entry.fields)}")
            continue
        for key, field in entry.fields.items():
            problems += drift(f"{path}.{key}", field, sub[key], top=False)
        given = plain(option.get("default"))
        if entry.optional:
            if given is not None:
                problems.append(f"{path}: {names[0]} names an optional section by default ({given!r})")
        elif given != {key: plain(field.default) for key, field in entry.fields.items()}:
            problems.append(f"{path}: {names[0]} defaults to {given!r}, not the fields' defaults")
    assert not problems, "the argument spec drifted from the schema:\n" + "\n".join(problems)


# --- the role's own tasks, run on this machine ---------------------------------------------------------

REQUIRED = {
    "pve_api_password": "secret",
    "pve_api_node": "pve1",
    "gpu_switch_container_vmid": 101,
    "gpu_switch_vm_vmid": 201,
}
VARIANTS = {
    "by-address": {"gpu_switch_gpus": ["0000:01:00.0", "0000:02:00.0"]},
    "by-match": {
        "gpu_switch_gpu_match": {"vendor": "0x10de", "class": "0x0300"},
        "pve_api_user": "gpu-switch@pve",
        "pve_api_token_id": "switch",
        "pve_api_token_secret": "token-secret",
        "pve_api_validate_certs": False,
        "gpu_switch_persistenced_unit": "",
        "gpu_switch_timeouts": {"shutdown": 30},
        "gpu_switch_move_in_parallel": True,
    },
    # Over the file by-address wrote.
    "refused": {"gpu_switch_gpus": ["0000:01:00.0"], "gpu_switch_hostpci_options": "pcie=2"},
}


def role_task(path: Path, src: str) -> dict:
    """The role's task that renders templates/src, as an ansible.builtin.template task (a config_files task
    renders it with the template lookup, byte for byte the same)."""
    for task in yaml.safe_load(path.read_text()):
        if task.get("ansible.builtin.template", {}).get("src") == src:
            args = {k: v for k, v in task["ansible.builtin.template"].items() if k not in ("owner", "group")}
            return {**task, "ansible.builtin.template": {**args, "src": str(ROLE / "templates" / src)}}
        files = task.get("config_files", {}).get("files", [])
        if isinstance(files, str):  # built in Jinja: {'dest': <expression>, 'content': lookup(<template>)}
            entry = re.search(
                r"\{'dest': ([^{}]+?), 'content': lookup\('ansible\.builtin\.template', '" + re.escape(src), files
            )
            files = [{"dest": "{{ " + entry.group(1) + " }}", "content": f"'{src}'"}] if entry else []
        for entry in files:
            if f"'{src}'" in entry["content"]:
                mode = task["config_files"]["mode"]
                args = {"src": str(ROLE / "templates" / src), "dest": entry["dest"], "mode": mode}
                return {"name": task["name"], "ansible.builtin.template": args}
    raise LookupError(f"{path} renders no {src}")


@pytest.fixture(scope="module")
def converged(tmp_path_factory):
    """The role's set_fact and template tasks, with the installed command as the role writes it: each variant's
    results, by play, in task order."""
    tmp = tmp_path_factory.mktemp("role")
    command = tmp / "gpu-switch"  # runs the role's wrapper with this Python, over this checkout's package
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp}/wrapper.py" "$@"\n')
    command.chmod(command.stat().st_mode | stat.S_IXUSR)
    defaults = {
        **yaml.safe_load((API_ROLE / "defaults" / "main.yml").read_text()),
        **yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
    }
    tasks = yaml.safe_load((ROLE / "tasks" / "config.yml").read_text())
    build = next(t for t in tasks if "__gpu_switch_config" in t.get("ansible.builtin.set_fact", {}))
    write = {**role_task(ROLE / "tasks" / "config.yml", "config.yml.j2"), "ignore_errors": True}
    wrapper = role_task(ROLE / "tasks" / "install.yml", "gpu-switch.j2")
    wrapper["ansible.builtin.template"].update(dest=str(tmp / "wrapper.py"), backup=False)
    plays = []
    for name, given in VARIANTS.items():
        folder = tmp / ("by-address" if name == "refused" else name)
        folder.mkdir(exist_ok=True)
        local = {
            "gpu_switch_config_dir": str(folder),
            "gpu_switch_command_path": str(command),
            "gpu_switch_lib_dir": str(ROOT / "plugins" / "module_utils"),
        }
        play_tasks = [build, write, write] if name == "by-address" else [build, write]
        plays.append(
            {
                "name": name,
                "hosts": "localhost",
                "gather_facts": False,
                "vars_files": [str(ROLE / "vars" / "main.yml")],
                "vars": {**defaults, **REQUIRED, **given, **local},
                "tasks": [wrapper, *play_tasks] if not plays else play_tasks,
            }
        )
    (tmp / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ANSIBLE_STDOUT_CALLBACK", "json")
        proc = run_playbook(tmp / "play.yml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    results = {p["play"]["name"]: [t["hosts"]["localhost"] for t in p["tasks"]] for p in report["plays"]}
    return tmp, results


def test_the_role_writes_a_file_check_config_accepts_and_a_rerun_changes_nothing(converged):
    tmp, results = converged
    first, again = results["by-address"][-2:]
    assert first["changed"] is True and not first.get("failed")
    assert again["changed"] is False
    config = load_config(str(tmp / "by-address" / "config.yml"), environ={})
    assert config.gpus == ("0000:01:00.0", "0000:02:00.0") and config.proxmox.ca_file == "/etc/pve/pve-root-ca.pem"
    assert config.proxmox.password_file == f"{tmp}/by-address/password" and config.persistenced_unit


def test_the_other_spelling_of_each_choice_is_written_as_the_command_reads_it(converged):
    tmp, results = converged
    assert results["by-match"][-1]["changed"] is True
    text = (tmp / "by-match" / "config.yml").read_text()
    assert "token_name: switch" in text and "gpus" not in text
    config = load_config(str(tmp / "by-match" / "config.yml"), environ={})
    assert config.gpu_match == {"vendor": "0x10de", "class": ["0x0300"]} and config.proxmox.token_name == "switch"
    assert config.proxmox.ca_file is None and not config.proxmox.verify_ssl and config.persistenced_unit is None
    assert config.timeouts.shutdown == 30 and config.timeouts.task == 600 and config.parallel


def test_a_file_check_config_refuses_is_not_put_in_place(converged):
    tmp, results = converged
    refused = results["refused"][-1]
    assert refused["failed"] is True and refused["msg"] == "failed to validate"
    assert "vm.hostpci_options: 'pcie=2' is not a list of pcie=" in refused["stderr"]
    # The file by-address wrote is still there, untouched.
    assert load_config(str(tmp / "by-address" / "config.yml"), environ={}).hostpci_options == "pcie=1"
