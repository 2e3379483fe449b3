"""inference_engine_check against the stand-in engines (the real ones: tests/engines).

The stand-in venv answers with the real releases' recorded parsers and registries, through the same entry
points the check asks of vLLM and SGLang, so these tests run the module and its checker unchanged.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from inference import engine_check
from module_runner import load_module, run_module

from inferhost.sim import ENGINE_DIR

ROOT = Path(__file__).resolve().parents[3]
STANDIN = ENGINE_DIR / "standin_engine.py"
RECORDED = {e: json.loads((ENGINE_DIR / "engines" / f"{e}.json").read_text())["version"] for e in ("vllm", "sglang")}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("standin-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    done = subprocess.run([root / "bin/python", STANDIN, "install"], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "changed"
    again = subprocess.run([root / "bin/python", STANDIN, "install"], check=True, capture_output=True, text=True)
    assert again.stdout.strip() == "unchanged"
    return root


def vllm(venv, name="v", *args, archs=("Qwen3ForCausalLM",)):
    argv = [f"{venv}/bin/vllm", "serve", "/srv/models/m", "--tensor-parallel-size", "2", *args]
    return {"name": name, "engine": "vllm", "virtualenv": str(venv), "argv": argv, "architectures": list(archs)}


def sglang(venv, name="s", *args, archs=("Qwen3ForCausalLM",)):
    argv = [f"{venv}/bin/python", "/usr/local/libexec/inferhost/sglang-launch", "--model-path", "/srv/models/m", *args]
    return {"name": name, "engine": "sglang", "virtualenv": str(venv), "argv": argv, "architectures": list(archs)}


def check(services, cache, **extra):
    return run_module(load_module("inference_engine_check"), {"services": services, "cache": str(cache), **extra})


def test_accepted_services_are_remembered_and_not_asked_again(venv, tmp_path):
    cache = tmp_path / "cache" / "verdicts.json"
    services = [vllm(venv, "v", "--attention-backend", "TRITON_MLA"), sglang(venv, "s", "--tp-size", "2")]
    first = check(services, cache)
    assert not first.get("failed"), first
    assert [(s["version"], s["checked"], s["cached"]) for s in first["services"]] == [
        (RECORDED["vllm"], True, False),
        (RECORDED["sglang"], True, False),
    ]
    assert first["changed"] is False
    assert cache.stat().st_mode & 0o777 == 0o600
    second = check(services, cache)
    assert [s["cached"] for s in second["services"]] == [True, True]
    changed = check([vllm(venv, "v", "--attention-backend", "FLASHINFER"), services[1]], cache)
    assert [s["cached"] for s in changed["services"]] == [False, True]
    rebuilt = check([services[0], {**services[1], "packages_id": "0123456789abcdef"}], cache)
    assert [s["cached"] for s in rebuilt["services"]] == [False, False]  # args as first, then a rebuilt venv
    again = check([services[0], {**services[1], "packages_id": "0123456789abcdef"}], cache)
    assert [s["cached"] for s in again["services"]] == [True, True]


def test_a_misspelt_flag_is_refused_naming_service_flag_and_release(venv, tmp_path):
    result = check([vllm(venv, "kimi", "--tensor-paralel-size", "8"), sglang(venv, "qwen")], tmp_path / "c.json")
    assert result["failed"]
    assert result["msg"] == (
        f"kimi: vllm {RECORDED['vllm']} refuses its command line: unrecognized arguments: --tensor-paralel-size 8; "
        "fix: the service's args (inference_service_services) or the engine's pin (python_env_environments)"
    )
    # The service that passed is remembered; the refused one is asked again next time.
    assert list(json.loads((tmp_path / "c.json").read_text())) == ["qwen"]


def test_a_value_outside_the_engines_choices_and_an_unknown_architecture_are_refused(venv, tmp_path):
    services = [sglang(venv, "q", "--moe-runner-backend", "cutlas", archs=["FalconForCausalLM"])]
    result = check(services, tmp_path / "c.json")
    lines = result["msg"].splitlines()
    assert (
        f"sglang {RECORDED['sglang']} refuses its command line: argument --moe-runner-backend: invalid choice"
        in lines[0]
    )
    assert lines[1].startswith(
        f"q: architecture FalconForCausalLM is not in sglang {RECORDED['sglang']}'s model registry"
    )
    assert not (tmp_path / "c.json").exists() or json.loads((tmp_path / "c.json").read_text()) == {}


def test_a_wrong_type_an_unknown_parser_name_and_a_refusal_after_parsing_are_refused_with_the_engines_message(
    venv, tmp_path
):
    """The stand-in answers as the recorded releases do: their argument types, vLLM's parser registries, and
    the engines' own checks after parsing (tests/engines asks the real ones the same)."""
    auto_tools = ("--enable-auto-tool-choice", "--tool-call-parser")
    services = [
        vllm(venv, "type", "--max-num-seqs", "lots"),
        vllm(venv, "tool", *auto_tools, "hermez"),
        vllm(venv, "reasoning", "--reasoning-parser", "qwen4"),
        vllm(venv, "tools", "--enable-auto-tool-choice"),
        sglang(venv, "s-type", "--max-running-requests", "many"),
        sglang(venv, "s-reasoning", "--reasoning-parser", "qwen4"),
        sglang(venv, "s-conflict", "--enable-tokenizer-batch-encode", "--enable-dynamic-batch-tokenizer"),
    ]
    result = check(services, tmp_path / "c.json")
    refused = dict(line.split(": ", 1) for line in result["msg"].splitlines())
    assert list(refused) == [s["name"] for s in services]
    engine = {"vllm": f"vllm {RECORDED['vllm']}", "sglang": f"sglang {RECORDED['sglang']}"}
    expected = {
        "type": "argument --max-num-seqs: invalid int value: 'lots'",
        "tool": "invalid tool call parser: hermez (chose from { ",
        "reasoning": "Reasoning parser 'qwen4' not found. Available parsers: ",
        "tools": "Error: --enable-auto-tool-choice requires --tool-call-parser",
        "s-type": "argument --max-running-requests: invalid int value: 'many'",
        "s-reasoning": "argument --reasoning-parser: invalid choice: 'qwen4'",
        "s-conflict": "Cannot enable both --enable-tokenizer-batch-encode and --enable-dynamic-batch-tokenizer",
    }
    for service in services:
        line = refused[service["name"]]
        assert line.startswith(f"{engine[service['engine']]} refuses its command line: {expected[service['name']]}")


def test_a_parser_plugin_is_loaded_before_the_names_are_checked(venv, tmp_path):
    plugin = ("--tool-parser-plugin", "/etc/inferhost/site_parser.py")
    result = check(
        [vllm(venv, "v", "--enable-auto-tool-choice", "--tool-call-parser", "site", *plugin)], tmp_path / "c"
    )
    assert not result.get("failed"), result


def test_the_checkers_message_is_the_engines_whatever_it_raises():
    parser = argparse.ArgumentParser(prog="engine")
    parser.add_argument("--n", type=int)

    def refuse(error):
        def check_parsed(args):
            raise error

        return check_parsed

    assert engine_check.check_args(parser, None, ["--n", "x"]) == "argument --n: invalid int value: 'x'"
    assert engine_check.check_args(parser, refuse(KeyError("invalid tool call parser: x")), []) == (
        "invalid tool call parser: x"
    )
    assert engine_check.check_args(parser, refuse(AssertionError("tp_size must divide")), []) == "tp_size must divide"
    assert engine_check.check_args(parser, refuse(AssertionError()), []) == "AssertionError"
    assert engine_check.check_args(parser, refuse(ValueError("no")), ["--n", "1"]) == "no"
    assert engine_check.check_args(parser, lambda args: None, ["--n", "1"]) is None


def test_the_command_lines_the_role_builds_with_metrics_and_parsers_are_taken(venv, tmp_path):
    # SGLang serves /metrics only with --enable-metrics, which the role adds to its command lines.
    sglang_line = sglang(venv, "s", "--enable-metrics", "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes")
    parsers = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")
    result = check([sglang_line, vllm(venv, "v", *parsers)], tmp_path / "c.json")
    assert not result.get("failed"), result.get("msg")


def test_check_mode_asks_but_remembers_nothing(venv, tmp_path):
    result = check([vllm(venv)], tmp_path / "c.json", _ansible_check_mode=True)
    assert not result.get("failed") and result["services"][0]["checked"]
    assert not (tmp_path / "c.json").exists()


def test_a_missing_environment_stops_only_the_active_service_outside_check_mode(tmp_path):
    absent = vllm(tmp_path / "nowhere")
    result = check([absent], tmp_path / "c.json", active="v")
    assert result["failed"] and "v: no Python in" in result["msg"] and "build it first" in result["msg"]
    inactive = check([absent], tmp_path / "c.json", active="other")
    assert not inactive.get("failed") and "the engine checks it once it exists" in json.dumps(inactive["warnings"])
    checking = check([absent], tmp_path / "c.json", active="v", _ansible_check_mode=True)
    assert not checking.get("failed")


def test_an_environment_without_the_engine_is_refused_with_the_engines_error(tmp_path):
    empty = tmp_path / "empty"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(empty)], check=True)
    result = check([vllm(empty, "v")], tmp_path / "c.json")
    assert result["failed"]
    assert f"v: vllm in {empty} could not be asked: ModuleNotFoundError: No module named 'vllm'" in result["msg"]
