"""The real vLLM and SGLang, installed from PyPI at the example inventory's pins, asked about its services.

Each engine is installed once into .cache/engines/<engine>-<version> (no GPU needed: only the parsers and
registries run). Then the role's own module, inference_engine_check, asks each engine about:

* every service of inventory/example, which must be accepted;
* bad variants of them, each refused with its message: a misspelt flag, a flag the pinned release does not
  have, a value outside its choices or of the wrong type, a parser name it does not have, a combination its
  checks after parsing refuse, an architecture it does not know.

The stand-in engines of the lab and molecule (src/inferhost/sim/engine/standin_engine.py) must stay what the real ones
are: their recordings must equal a fresh recording from the real release, and the same module run against a
stand-in venv must give the same verdict, message for message, on every service asked here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from module_runner import load_module, run_module

from inferhost.sim import ENGINE_DIR

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "engines"
UV = ROOT / ".cache" / "tools" / "bin" / "uv"
EXAMPLE = ROOT / "inventory" / "example" / "group_vars"
MODELS = ROOT / "tests" / "unit" / "inference" / "fixtures" / "models"
CHECKPOINTS = {  # the example's model paths -> the config.json fixtures of the same checkpoints
    "/srv/models/Qwen3.5-397B-A17B-NVFP4": "Qwen3.5-397B-A17B-NVFP4",
    "/srv/models/Kimi-K2.5": "Kimi-K2.5",
    "/srv/models/MiniMax-M2.5": "MiniMax-M2.5",
}
sys.path.insert(0, str(ENGINE_DIR))
import standin_engine  # noqa: E402
from inference import command  # noqa: E402


def example_pins():
    """{engine: version} from the example's python_env_environments (``vllm==X``, ``sglang==Y``)."""
    data = yaml.safe_load((EXAMPLE / "inference_guests" / "python_env.yml").read_text())
    pins = {}
    for environment in data["python_env_environments"]:
        for step in environment["steps"]:
            for spec in step["packages"]:
                name, _, version = spec.partition("==")
                if name in ("vllm", "sglang"):
                    pins[name] = version
    return pins


PINS = example_pins()


def engine_environment(engine):
    """The engine's environment, installed from PyPI at the example's pin the first time."""
    root = CACHE / f"{engine}-{PINS[engine]}"
    python = root / "bin" / "python"
    probe = [str(python), "-c", f"from importlib import metadata; print(metadata.version({engine!r}))"]
    if (
        python.exists()
        and subprocess.run(probe, capture_output=True, text=True, check=False).stdout.strip() == PINS[engine]
    ):
        return root
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": str(root)}
    subprocess.run([str(UV), "venv", "--quiet", "--clear", "--python", "python3", str(root)], check=True, env=env)
    subprocess.run([str(UV), "pip", "install", "--quiet", f"{engine}=={PINS[engine]}"], check=True, env=env)
    return root


@pytest.fixture(scope="module")
def environments():
    return {engine: engine_environment(engine) for engine in sorted(PINS)}


def example_services():
    return yaml.safe_load((EXAMPLE / "inference_containers" / "inference_service.yml").read_text())[
        "inference_service_services"
    ]


def planned(service, environments, *, architectures=None, name=None, node=None):
    """A service as inference_service_plan hands it to inference_engine_check, in the cached environment; ``node``:
    the inventory host whose rank's command line is asked (a service with nodes)."""
    config = json.loads((MODELS / CHECKPOINTS[service["model"]["path"]] / "config.json").read_text())
    where = command.placement(service, node, {"ct-a": "192.0.2.101", "ct-b": "192.0.2.102"}) if node else None
    return {
        "name": name or service["name"],
        "engine": service["engine"],
        "virtualenv": str(environments[service["engine"]]),
        "model_path": service["model"]["path"],
        "argv": command.build_argv(service, where=where),
        "architectures": architectures or config["architectures"],
    }


def with_args(service, **args):
    return {**service, "args": {**service.get("args", {}), **args}}


# name -> (service of the example, change, what the refusal must say)
BAD = {
    "vllm-misspelt-flag": ("kimi-k25", {"tensor-paralel-size": 8}, "unrecognized arguments: --tensor-paralel-size 8"),
    # Multi-step scheduling left vLLM with its V0 engine: the flag is in older releases only.
    "vllm-removed-flag": ("minimax-m25", {"num-scheduler-steps": 8}, "unrecognized arguments: --num-scheduler-steps 8"),
    "vllm-bad-choice": ("kimi-k25", {"kv-cache-dtype": "bf16"}, "argument --kv-cache-dtype: invalid choice: 'bf16'"),
    "vllm-wrong-type": ("minimax-m25", {"max-num-seqs": "lots"}, "argument --max-num-seqs: invalid int value: 'lots'"),
    # vLLM's own converter for an optional integer, with its own message.
    "vllm-wrong-type-optional": (
        "minimax-m25",
        {"max-log-len": "lots"},
        "argument --max-log-len: Value lots cannot be converted to <class 'int'>.",
    ),
    # vLLM's parser takes any parser name; validate_api_server_args checks it against the registry.
    "vllm-unknown-tool-parser": ("kimi-k25", {"tool-call-parser": "hermez"}, "invalid tool call parser: hermez (chose"),
    # Looked up when the engine starts, after the model is loaded; the check asks the registry now.
    "vllm-unknown-reasoning-parser": (
        "kimi-k25",
        {"reasoning-parser": "kimi_k3"},
        "Reasoning parser 'kimi_k3' not found. Available parsers: ",
    ),
    # validate_parsed_serve_args.
    "vllm-auto-tool-choice-without-parser": (
        "kimi-k25",
        {"tool-call-parser": None},
        "Error: --enable-auto-tool-choice requires --tool-call-parser",
    ),
    "sglang-misspelt-flag": ("qwen35", {"moe-runer-backend": "triton"}, "unrecognized arguments: --moe-runer-backend"),
    # vLLM's name for the context length; SGLang calls it --context-length.
    "sglang-foreign-flag": ("qwen35", {"max-model-len": 65536}, "unrecognized arguments: --max-model-len 65536"),
    "sglang-bad-choice": ("qwen35", {"tool-call-parser": "qwen3-coder"}, "argument --tool-call-parser: invalid choice"),
    "sglang-wrong-type": (
        "qwen35",
        {"max-running-requests": "lots"},
        "argument --max-running-requests: invalid int value: 'lots'",
    ),
    # SGLang's parser names are its registries, as the flags' choices.
    "sglang-unknown-reasoning-parser": (
        "qwen35",
        {"reasoning-parser": "qwen3-thinkin"},
        "argument --reasoning-parser: invalid choice: 'qwen3-thinkin'",
    ),
    # ServerArgs's device-free steps (its __post_init__): conflicting flags.
    "sglang-two-tokenizer-batchings": (
        "qwen35",
        {"enable-tokenizer-batch-encode": True, "enable-dynamic-batch-tokenizer": True},
        "Cannot enable both --enable-tokenizer-batch-encode and --enable-dynamic-batch-tokenizer",
    ),
    "sglang-hierarchical-cache-without-radix-cache": (
        "qwen35",
        {"enable-hierarchical-cache": True, "disable-radix-cache": True},
        "enable-hierarchical-cache and disable-radix-cache are mutually exclusive",
    ),
}
# name -> (service of the example spread over two containers, the node whose rank's command line is asked): the
# head (rank 0) and a rank above it, whose vLLM command line runs headless.
MULTI_NODE = {
    "vllm-head": ("minimax-m25", "ct-a"),
    "vllm-rank-1": ("minimax-m25", "ct-b"),
    "sglang-head": ("qwen35", "ct-a"),
    "sglang-rank-1": ("qwen35", "ct-b"),
}
UNKNOWN_ARCH = {  # name -> (service, architecture its engine's registry lacks)
    "vllm-unknown-arch": ("kimi-k25", "Qwen3_5MoeForConditionalGeneration"),
    "sglang-unknown-arch": ("qwen35", "FalconForCausalLM"),
}


def asked(environments):
    """Every example service and every bad variant, as planned in these environments."""
    examples = {s["name"]: s for s in example_services()}
    services = [planned(s, environments) for s in examples.values()]
    for name, (base, args, _message) in BAD.items():
        services.append(planned(with_args(examples[base], **args), environments, name=name))
    for name, (base, arch) in UNKNOWN_ARCH.items():
        services.append(planned(examples[base], environments, architectures=[arch], name=name))
    for name, (base, node) in MULTI_NODE.items():
        spread = {**examples[base], "nodes": ["ct-a", "ct-b"], "network_interface": "eth1"}
        services.append(planned(spread, environments, name=name, node=node))
    return services


@pytest.fixture(scope="module")
def verdicts(environments, tmp_path_factory):
    """One run of the role's module over every example service and every bad variant (one process per engine)."""
    services = asked(environments)
    cache = tmp_path_factory.mktemp("engine-check") / "verdicts.json"
    result = run_module(load_module("inference_engine_check"), {"services": services, "cache": str(cache)})
    return {s["name"]: s for s in result["services"]}, result, services, cache


@pytest.fixture(scope="module")
def standin_verdicts(tmp_path_factory):
    """The same run against the stand-in engines, installed in a venv as the lab and molecule install them."""
    venv = tmp_path_factory.mktemp("standin") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([venv / "bin" / "python", ENGINE_DIR / "standin_engine.py", "install"], check=True)
    services = asked(dict.fromkeys(PINS, venv))
    cache = tmp_path_factory.mktemp("standin-check") / "verdicts.json"
    result = run_module(load_module("inference_engine_check"), {"services": services, "cache": str(cache)})
    return {s["name"]: s for s in result["services"]}


def test_the_example_pins_are_the_stand_ins_recordings():
    for engine, version in PINS.items():
        assert standin_engine.load(engine)["version"] == version, f"re-record {ENGINE_DIR / 'engines' / engine}.json"


@pytest.mark.parametrize("engine", sorted(PINS))
def test_the_stand_in_recording_equals_the_real_release(environments, engine):
    recorder = [str(environments[engine] / "bin" / "python"), str(ENGINE_DIR / "standin_engine.py")]
    fresh = json.loads(subprocess.run([*recorder, "record", engine], capture_output=True, text=True, check=True).stdout)
    recorded = standin_engine.load(engine)
    assert fresh["arguments"] == recorded["arguments"]
    assert fresh["architectures"] == recorded["architectures"]
    assert fresh == recorded  # the parser registries too (vLLM's tool-call and reasoning parser names)


def test_every_example_service_is_accepted_by_its_engine(verdicts):
    by_name, _result, _services, _cache = verdicts
    for service in example_services():
        verdict = by_name[service["name"]]
        assert verdict["checked"] and not verdict["cached"], verdict
        assert verdict["refusals"] == [], verdict
        assert verdict["version"] == PINS[service["engine"]]


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_command_line_is_refused_by_the_engine_with_its_message(verdicts, name):
    by_name, result, _services, _cache = verdicts
    base, _args, message = BAD[name]
    engine = by_name[name]["engine"]
    [refusal] = by_name[name]["refusals"]
    assert refusal.startswith(f"{name}: {engine} {PINS[engine]} refuses its command line: ")
    assert message in refusal
    assert result["failed"] and refusal in result["msg"]


@pytest.mark.parametrize("name", sorted(UNKNOWN_ARCH))
def test_an_unknown_architecture_is_refused_naming_it_and_the_release(verdicts, name):
    by_name, _result, _services, _cache = verdicts
    arch = UNKNOWN_ARCH[name][1]
    engine = by_name[name]["engine"]
    [refusal] = by_name[name]["refusals"]
    assert f"architecture {arch} is not in {engine} {PINS[engine]}'s model registry" in refusal


def test_the_stand_in_gives_the_real_engines_verdict_on_every_command_line(verdicts, standin_verdicts):
    by_name, _result, services, _cache = verdicts
    for service in services:
        real, standin = by_name[service["name"]], standin_verdicts[service["name"]]
        assert standin["checked"] and standin["version"] == real["version"], standin
        assert standin["refusals"] == real["refusals"], service["name"]


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_bad_command_line_is_refused_by_the_stand_in_with_the_engines_message(standin_verdicts, name):
    [refusal] = standin_verdicts[name]["refusals"]
    assert BAD[name][2] in refusal


@pytest.mark.parametrize("name", sorted(MULTI_NODE))
def test_each_ranks_command_line_across_two_nodes_is_accepted_by_its_engine(verdicts, name):
    by_name, _result, services, _cache = verdicts
    argv = next(s["argv"] for s in services if s["name"] == name)
    assert "--nnodes" in argv and "--node-rank" in argv  # what the engine was asked about
    assert ("--headless" in argv) is (name == "vllm-rank-1")
    verdict = by_name[name]
    assert verdict["checked"] and verdict["refusals"] == [], verdict


def test_an_unchanged_service_is_not_asked_again(verdicts, environments):
    """The passes of the run above are remembered, its refusals are not: no engine starts for the examples."""
    _by_name, _result, _services, cache = verdicts
    services = [planned(s, environments) for s in example_services()]
    assert sorted(json.loads(cache.read_text())) == sorted([*(s["name"] for s in services), *MULTI_NODE])
    result = run_module(load_module("inference_engine_check"), {"services": services, "cache": str(cache)})
    assert not result.get("failed"), result
    assert all(s["cached"] and s["checked"] for s in result["services"]), result
