"""Every role declares its variables in meta/argument_specs.yml, mirrored by defaults/main.yml, and a
value of the wrong type is rejected with a message that names the variable."""

import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

ROOT = Path(__file__).resolve().parents[3]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())
WRONG = {"list": {"not": "a list"}, "dict": ["not", "a dict"], "bool": "perhaps", "int": "many", "float": "lots"}


def spec_of(role):
    path = ROOT / "roles" / role / "meta" / "argument_specs.yml"
    assert path.exists(), f"role {role} has no meta/argument_specs.yml"
    return yaml.safe_load(path.read_text())["argument_specs"]["main"]["options"]


def defaults_of(role):
    path = ROOT / "roles" / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


@pytest.mark.parametrize("role", ROLES)
def test_every_option_is_documented(role):
    undocumented = [name for name, opt in spec_of(role).items() if not opt.get("description")]
    assert not undocumented, f"{role}: options without a description: {undocumented}"


@pytest.mark.parametrize("role", ROLES)
def test_defaults_mirror_the_spec(role):
    spec, defaults = spec_of(role), defaults_of(role)
    assert not set(defaults) - set(spec), f"{role}: defaults without a spec entry: {sorted(set(defaults) - set(spec))}"
    optional = {name for name, opt in spec.items() if not opt.get("required")}
    assert not optional - set(defaults), (
        f"{role}: optional options without a default: {sorted(optional - set(defaults))}"
    )
    for name, opt in spec.items():
        if "default" in opt and name in defaults and "{{" not in str(defaults[name]):
            assert opt["default"] == defaults[name], f"{role}: {name} default differs between spec and defaults"


@pytest.mark.parametrize("role", ROLES)
def test_a_wrong_type_is_rejected_by_name(role):
    spec = spec_of(role)
    typed = {name: opt["type"] for name, opt in spec.items() if opt.get("type") in WRONG}
    if not typed:
        pytest.skip(f"{role} has only string-like options")
    for name, kind in typed.items():
        params = {k: v for k, v in defaults_of(role).items() if "{{" not in str(v)}
        params[name] = WRONG[kind]
        result = ArgumentSpecValidator(spec).validate(params)
        messages = " ".join(result.error_messages)
        assert name in messages, f"{role}: a {kind} option given {WRONG[kind]!r} was not rejected by name: {messages!r}"


def test_a_real_run_stops_before_any_change(tmp_path):
    """The role's argument spec is checked before its first task: nothing is written."""
    conf = tmp_path / "nccl.conf"
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Apply nccl_tuning with a string where a list belongs",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "roles": [
                        {
                            "role": "nccl_tuning",
                            "nccl_tuning_settings": "NCCL_PROTO=LL",
                            "nccl_tuning_conf_path": str(conf),
                            "nccl_tuning_env_file": str(tmp_path / "nccl.env"),
                        }
                    ],
                }
            ]
        )
    )
    proc = subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "nccl_tuning_settings" in proc.stdout + proc.stderr
    assert "Validating arguments against arg spec" in proc.stdout
    assert not conf.exists() and not (tmp_path / "nccl.env").exists()


def test_a_service_may_set_its_collectives_per_layer_and_a_wrong_type_is_rejected():
    """model.collectives_per_layer is declared (int) in inference_service's spec, so an inventory can set it."""
    spec = {"inference_service_services": spec_of("inference_service")["inference_service_services"]}

    def errors(value):
        model = {"path": "/srv/models/MiniMax-M2.5", "collectives_per_layer": value}
        service = {"name": "mm", "engine": "vllm", "environment": "/opt/venvs/vllm", "model": model, "gpus": [0]}
        result = ArgumentSpecValidator(spec).validate({"inference_service_services": [service]})
        return [e.error_message if hasattr(e, "error_message") else str(e) for e in result.errors]

    assert errors(3) == []
    (message,) = errors("many")
    assert "collectives_per_layer" in message and "int" in message
