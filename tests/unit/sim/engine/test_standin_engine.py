"""The stand-in engines' recorder: what it keeps of a real parser, and the parser it gives back.

The real releases are recorded and compared in tests/engines; these tests use argparse parsers built here, with
converters shaped as the engines' own (vLLM's optional integers, its ``1k`` integers).
"""

import argparse
import contextlib
import io
import json
import sys

import pytest

from inferhost.sim import ENGINE_DIR

sys.path.insert(0, str(ENGINE_DIR))
import standin_engine  # noqa: E402


def optional_int(val):  # shaped as vLLM's optional_type(int): its name and message are the engine's
    if val in ("", "None"):
        return None
    try:
        return int(val)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"Value {val} cannot be converted to {int}.") from exc


optional_int.__name__ = "_optional_type"


def human_readable_int(val):  # shaped as vLLM's: 1k, 2M
    val = val.strip()
    multipliers = {"k": 10**3, "M": 10**6}
    if val[-1:] in multipliers:
        return int(float(val[:-1]) * multipliers[val[-1]])
    return int(val)


def addressed(val):  # a message that names an object by its address
    raise argparse.ArgumentTypeError(f"Value {val} cannot be converted to {addressed}.")


def test_plain_types_are_recorded_by_name():
    assert standin_engine.record_type(int) == {"name": "int", "conversion": "int", "none": [], "message": None}
    assert standin_engine.record_type(float)["conversion"] == "float"
    assert standin_engine.record_type(json.loads) == {
        "name": "loads",
        "conversion": "json",
        "none": ["null"],
        "message": None,
    }


def test_an_engine_converter_is_recorded_with_its_none_values_and_message():
    recorded = standin_engine.record_type(optional_int)
    assert recorded == {
        "name": "_optional_type",
        "conversion": "int",
        "none": ["None", ""],
        "message": "Value {value} cannot be converted to <class 'int'>.",
    }
    stand_in = standin_engine.converter(recorded)
    assert stand_in("12") == 12 and stand_in("None") is None
    with pytest.raises(argparse.ArgumentTypeError, match=r"^Value lots cannot be converted to <class 'int'>\.$"):
        stand_in("lots")


@pytest.mark.parametrize("convert", [None, str, human_readable_int, addressed])
def test_a_converter_no_conversion_reproduces_is_recorded_without_a_type(convert):
    assert standin_engine.record_type(convert) is None


def test_choices_keep_the_engines_order_unless_they_are_a_set():
    assert standin_engine.record_choices(["b", "a"]) == ["b", "a"]
    assert standin_engine.record_choices({"b", "a"}) == ["a", "b"]
    assert standin_engine.record_choices([16, 1, 8]) == [16, 1, 8]
    assert standin_engine.record_choices([True, False]) is None
    assert standin_engine.record_choices(["a", 1]) is None
    assert standin_engine.record_choices(None) is None


def engine_parser():
    parser = argparse.ArgumentParser(prog="engine", add_help=False)
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-log-len", type=optional_int)
    parser.add_argument("--max-model-len", type=human_readable_int)
    parser.add_argument("--block-size", type=int, choices=[1, 8, 16])
    parser.add_argument("--dtype", choices=["auto", "bfloat16"])
    parser.add_argument("--enable-auto-tool-choice", "-at", action=argparse.BooleanOptionalAction)
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--middleware", action="append", default=[])
    parser.add_argument("--limit-mm-per-prompt", type=json.loads)
    return parser


def verdict(parser, argv):
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            namespace = parser.parse_args(argv)
    except SystemExit:
        return "refused", errors.getvalue().splitlines()[-1]
    # --max-model-len's converter is recorded without a type: the stand-in keeps the string it was given.
    return "taken", {k: v for k, v in vars(namespace).items() if v not in (None, [], False) and k != "max_model_len"}


@pytest.mark.parametrize(
    "argv",
    [
        ["m", "--max-num-seqs", "8", "--max-log-len", "None", "--max-model-len", "32k"],
        ["--max-num-seqs", "lots"],
        ["--max-log-len", "lots"],
        ["--block-size", "8"],
        ["--block-size", "7"],
        ["--block-size", "big"],
        ["--dtype", "bf16"],
        ["--enable-auto-tool-choice", "--no-enable-auto-tool-choice"],
        ["--no-enable-auto-tool-choice", "-at"],
        ["--middleware", "a", "--middleware", "b", "--trust-remote-code"],
        ["--limit-mm-per-prompt", '{"image": 2}'],
        ["--limit-mm-per-prompt", "{image: 2}"],
    ],
)
def test_the_recorded_parser_takes_and_refuses_what_the_engines_does_with_its_message(argv):
    recording = {"arguments": standin_engine.record_parser(engine_parser())}
    stand_in = standin_engine.add_arguments(argparse.ArgumentParser(prog="engine", add_help=False), "x", recording)
    assert verdict(stand_in, argv) == verdict(engine_parser(), argv)


def args(**given):
    """A stand-in's parsed arguments: what is not given is None, as the stand-in parser leaves it."""
    names = (
        "enable_auto_tool_choice tool_call_parser enable_log_outputs enable_log_requests tool_parser_plugin "
        "reasoning_parser reasoning_parser_plugin structured_outputs_config"
    )
    return argparse.Namespace(**{**dict.fromkeys(names.split()), **given})


@pytest.fixture(autouse=True)
def no_plugins(monkeypatch):
    monkeypatch.setattr(standin_engine, "PLUGINS", {})


def test_vllm_checks_the_structured_outputs_reasoning_parser_and_a_plugin_brings_any_name():
    config = json.dumps({"reasoning_parser": "r9"})
    with pytest.raises(KeyError, match="invalid reasoning parser: r9 "):
        standin_engine.check_parsed("vllm", args(structured_outputs_config=config))
    standin_engine.check_parsed("vllm", args(structured_outputs_config=config, reasoning_parser_plugin="/p/r9.py"))


def test_vllm_takes_its_registered_parser_names():
    tool, reasoning = standin_engine.parser_names("tool")[0], standin_engine.parser_names("reasoning")[0]
    standin_engine.check_parsed(
        "vllm", args(enable_auto_tool_choice=True, tool_call_parser=tool, reasoning_parser=reasoning)
    )
    with pytest.raises(TypeError, match="--enable-log-outputs requires --enable-log-requests"):
        standin_engine.check_parsed("vllm", args(enable_log_outputs=True))
