#!/usr/bin/env python3
"""The stand-in engines' command lines, checks and model registries, recorded from the real vLLM and SGLang.

A stand-in that accepts what the real engine refuses hides the mistakes the stack must catch. So the stand-in
engines carry the real engines' argument sets and registries, recorded from the pinned releases into
``engines/<engine>.json``: argument names, how each is stored and how many values it takes, its type, its
choices where they are plain strings or integers, the required ones, the architectures, and vLLM's tool-call
and reasoning parser names (its parsers take any name; it checks them after parsing). A type is recorded only
where one of the conversions below does what the engine's own converter does on every probe value, message
included; other types (vLLM's ``1k`` integers, its config dataclasses) are recorded without one and take any
value. The real-engine test layer records them again from PyPI's wheels and fails when the files drift, and
checks that the stand-in and the real engine give the same verdicts, with the same messages, on the same
command lines.

After parsing, the stand-in applies the engines' own device-free checks that engine_check runs on the real
engines, as far as it keeps them (below: ``vllm_*`` and ``sglang_*``; tests/engines asks both engines the same
questions). It leaves out vLLM's chat template check, SGLang's bucket rules and the rules that read a value
the engine resolves at start (a default it computes, the checkpoint, the device); a parser plugin
(``--tool-parser-plugin``) may register any name, so with one the stand-in takes any parser name.

  standin_engine.py record ENGINE    (with the real engine's Python) prints the recording as JSON
  standin_engine.py install          (with a venv's Python) makes its "vllm" and "sglang" the stand-ins:
                                     the server, and the parsers, checks and registries inference_engine_check
                                     asks

Standard library only: the stand-in venv of the lab and molecule has nothing else. What the recording leaves
out besides: vLLM's ``--flag_with_underscores`` and ``--config.key`` spellings, and the engines' defaults (a
flag left out is None, or False where it is a store_true flag).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENGINES_DIR = HERE / "engines"
PROGS = {"vllm": "vllm serve", "sglang": "sglang.launch_server"}

# The conversions a recorded type may name, and the values the recorder tries each engine converter on: a type
# is recorded only where one of these, with the values it maps to None and its error message, gives what the
# engine's converter gives on every probe.
CONVERSIONS = {"int": int, "float": float, "json": json.loads}
TYPE_PROBES = (
    *("0", "7", "-3", " 8 ", "1_000", "1.5", "1e3", "inf", "NaN", "32k", "lots", "true", "None", "none", ""),
    *("null", "{}", '{"a": 1}', "[1, 2]", "{bad"),
)
VALUE = "{value}"  # where a recorded error message has the value it refuses
# How argparse stores an argument, by its action's class (anything else is recorded as "store").
ACTIONS = {
    argparse.BooleanOptionalAction: "boolean",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._AppendAction: "append",
}


def load(engine):
    return json.loads((ENGINES_DIR / f"{engine}.json").read_text(encoding="utf-8"))


def converter(recorded):
    """A callable that converts as the recorded type does, with the engine converter's name (argparse's message
    says ``invalid NAME value``) or its recorded message."""
    convert, none, message = CONVERSIONS[recorded["conversion"]], set(recorded["none"]), recorded["message"]

    def convert_value(value):
        if value in none:
            return None
        try:
            return convert(value)
        except ValueError:  # json.JSONDecodeError is one
            if message is None:
                raise
            raise argparse.ArgumentTypeError(message.replace(VALUE, value)) from None

    convert_value.__name__ = recorded["name"]
    return convert_value


def add_arguments(parser, engine, recording=None):
    """Add the recorded arguments of ``engine`` to an argparse parser, as the real engine adds its own."""
    for argument in (recording or load(engine))["arguments"]:
        flags, action = argument["flags"], argument.get("action", "store")
        kwargs = {}
        if action == "boolean":  # argparse adds the --no- spelling of each flag itself
            negated = {f"--no-{flag[2:]}" for flag in flags if flag.startswith("--")}
            flags = [flag for flag in flags if flag not in negated]
            kwargs["action"] = argparse.BooleanOptionalAction
        elif action in ("store_true", "store_false") or argument["nargs"] == 0:
            kwargs["action"] = action if action == "store_false" else "store_true"
        else:
            kwargs["nargs"] = argument["nargs"]
            if action == "append":
                kwargs["action"] = "append"
            if argument.get("type"):
                kwargs["type"] = converter(argument["type"])
            if argument["choices"] is not None:
                kwargs["choices"] = argument["choices"]
        if flags:
            parser.add_argument(*flags, dest=argument["dest"], required=argument["required"], **kwargs)
        else:
            parser.add_argument(argument["dest"], **kwargs)
    return parser


def parser_for(engine, recording=None):
    return add_arguments(argparse.ArgumentParser(prog=PROGS[engine], add_help=False), engine, recording)


def architectures(engine):
    return load(engine)["architectures"]


def parser_names(kind):
    """The recorded vLLM's registered tool-call (``tool``) or reasoning (``reasoning``) parser names."""
    return load("vllm")[f"{kind}_parsers"]


def probe_outcome(convert, value):
    """What a converter makes of one value, in a form two converters can be compared by."""
    try:
        result = convert(value)
    except argparse.ArgumentTypeError as exc:
        return ["message", str(exc)]
    except (TypeError, ValueError):
        return ["invalid"]
    except Exception as exc:  # argparse lets it through; no recorded type raises it
        return ["raises", type(exc).__name__]
    return ["value", type(result).__name__, repr(result)]


def record_type(convert):
    """The recorded form of an engine converter (``converter`` takes it), or None where none of CONVERSIONS
    does what it does on every probe, or its name or message is not the same in another process."""
    if convert is None:
        return None
    name = getattr(convert, "__name__", repr(convert))  # as argparse names it
    real = {value: probe_outcome(convert, value) for value in TYPE_PROBES}
    none = [value for value, outcome in real.items() if outcome == ["value", "NoneType", "None"]]
    messages = [
        outcome[1].replace(value, VALUE) for value, outcome in real.items() if value and outcome[0] == "message"
    ]
    message = messages[0] if messages else None
    if " at 0x" in name or (message and " at 0x" in message):  # an object's address: this process's only
        return None
    for conversion in CONVERSIONS:
        recorded = {"name": name, "conversion": conversion, "none": none, "message": message}
        stand_in = converter(recorded)
        if all(probe_outcome(stand_in, value) == outcome for value, outcome in real.items()):
            return recorded
    return None


def record_choices(choices):
    """Choices in the engine's order (argparse's message lists them so), sorted where that order is a set's."""
    if choices is None:
        return None
    values = list(choices)
    if not (all(isinstance(c, str) for c in values) or all(type(c) is int for c in values)):
        return None
    return sorted(values) if isinstance(choices, set | frozenset) else values


def record_action(action):
    return next((name for cls, name in ACTIONS.items() if isinstance(action, cls)), "store")


def record_parser(parser):
    """The arguments of a real engine's parser, in the form ``add_arguments`` takes."""
    arguments = []
    for action in parser._actions:  # argparse has no public list of its actions
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        arguments.append(
            {
                "flags": list(action.option_strings),
                "dest": action.dest,
                "action": record_action(action),
                "nargs": action.nargs,
                "type": record_type(action.type) if action.nargs != 0 else None,
                "choices": record_choices(action.choices),
                "required": bool(action.required) if action.option_strings else False,
            }
        )
    return sorted(arguments, key=lambda a: (a["flags"][:1], a["dest"]))


def record_parser_names(engine):
    """vLLM's tool-call and reasoning parser registries (SGLang's are its flags' choices)."""
    if engine != "vllm":
        return {}
    from vllm.reasoning import ReasoningParserManager  # noqa: PLC0415
    from vllm.tool_parsers import ToolParserManager  # noqa: PLC0415

    return {
        "tool_parsers": sorted(ToolParserManager.list_registered()),
        "reasoning_parsers": sorted(ReasoningParserManager.list_registered()),
    }


def record(engine):
    """Record ``engine`` from its installed release (run with the engine environment's Python)."""
    from importlib import metadata  # noqa: PLC0415

    # parents[4]: the repository root (src/inferhost/sim/engine/standin_engine.py).
    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "plugins" / "module_utils" / "inference"))
    import engine_check  # noqa: PLC0415  (the production check's own way into each engine)

    parser, _validate, archs = engine_check.ENGINES[engine]()
    return {
        "engine": engine,
        "version": metadata.version(engine),
        "arguments": record_parser(parser),
        "architectures": sorted(archs),
        **record_parser_names(engine),
    }


# The engines' own checks after parsing, as far as the stand-in keeps them (the module's docstring says what
# it leaves out). Each raises what the engine raises, with the engine's message; the stand-in's vllm and sglang
# packages (site/) answer engine_check with them, and the stand-in server runs them (check_parsed).
PLUGINS = {}  # kind -> the parser plugin file given in this process: it may register any name


def load_parser_plugin(kind, path):
    PLUGINS[kind] = path


class VllmParserManager:
    """What vLLM's parser registries of both kinds (KIND: ``tool``, ``reasoning``) answer alike: the registered
    names, and a plugin file to import (after which any name goes)."""

    KIND = ""

    @classmethod
    def list_registered(cls):
        return parser_names(cls.KIND)

    @classmethod
    def import_parser(cls, plugin_path):
        load_parser_plugin(cls.KIND, plugin_path)


def vllm_validate_parsed_serve_args(args):
    """vLLM's ``validate_parsed_serve_args``, less its chat template check."""
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
    if args.enable_log_outputs and not args.enable_log_requests:
        raise TypeError("Error: --enable-log-outputs requires --enable-log-requests")


def vllm_validate_api_server_args(args):
    """vLLM's ``validate_api_server_args``: the tool-call parser (with auto tool choice) and the reasoning parser
    of ``--structured-outputs-config`` must be registered names."""
    tool_parsers = parser_names("tool")
    if args.enable_auto_tool_choice and "tool" not in PLUGINS and args.tool_call_parser not in tool_parsers:
        raise KeyError(f"invalid tool call parser: {args.tool_call_parser} (chose from {{ {','.join(tool_parsers)} }})")
    config = args.structured_outputs_config
    with contextlib.suppress(ValueError):
        config = json.loads(config) if isinstance(config, str) else config
    reasoning_parser = config.get("reasoning_parser") if isinstance(config, dict) else None
    reasoning_parsers = parser_names("reasoning")
    if reasoning_parser and "reasoning" not in PLUGINS and reasoning_parser not in reasoning_parsers:
        raise KeyError(f"invalid reasoning parser: {reasoning_parser} (chose from {{ {','.join(reasoning_parsers)} }})")


def vllm_get_reasoning_parser(name):
    """vLLM's ``ReasoningParserManager.get_reasoning_parser``: a registered name, else its KeyError."""
    if "reasoning" not in PLUGINS and name not in parser_names("reasoning"):
        registered = ", ".join(parser_names("reasoning"))
        raise KeyError(f"Reasoning parser '{name}' not found. Available parsers: {registered}")
    return name


def sglang_tokenizer_batching(args):
    """SGLang's ``ServerArgs._handle_tokenizer_batching``: its refusal."""
    if args.enable_tokenizer_batch_encode and args.enable_dynamic_batch_tokenizer:
        raise ValueError(
            "Cannot enable both --enable-tokenizer-batch-encode and --enable-dynamic-batch-tokenizer. "
            "Please choose one tokenizer batching approach."
        )


def sglang_cache_compatibility(args):
    """SGLang's ``ServerArgs._handle_cache_compatibility``, less its rule on the SGLANG_ENABLE_SPEC_V2 variable."""
    if args.enable_hierarchical_cache and args.disable_radix_cache:
        raise ValueError(
            "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive "
            "and cannot be used at the same time. Please use only one of them."
        )
    if args.disaggregation_decode_enable_offload_kvcache and args.disaggregation_mode != "decode":
        raise ValueError("The argument disaggregation-decode-enable-offload-kvcache is only supported for decode side.")
    ratio = args.swa_full_tokens_ratio
    if ratio is not None and not (0 < ratio <= 1.0):
        raise ValueError("--swa-full-tokens-ratio should be in range (0, 1.0].")


def sglang_other_validations(args):
    """SGLang's ``ServerArgs._handle_other_validations``: the modalities of ``--limit-mm-data-per-request``."""
    limits = args.limit_mm_data_per_request
    allowed_modalities = {"image", "video", "audio"}
    for modality in limits if isinstance(limits, dict) else ():
        if modality not in allowed_modalities:
            raise ValueError(
                f"Invalid modality '{modality}' in --limit-mm-data-per-request."
                f"Allowed modalities are: {list(allowed_modalities)}"
            )


def check_parsed(engine, args):
    """Raise as the engine does after parsing ``args``, before it loads anything (engine_check's order)."""
    if engine == "vllm":
        vllm_validate_parsed_serve_args(args)
        for kind in ("tool", "reasoning"):
            plugin = getattr(args, f"{kind}_parser_plugin")
            if plugin and len(plugin) > 3:
                load_parser_plugin(kind, plugin)
        vllm_validate_api_server_args(args)
        if args.reasoning_parser:
            vllm_get_reasoning_parser(args.reasoning_parser)
    else:
        for rule in (sglang_tokenizer_batching, sglang_cache_compatibility, sglang_other_validations):
            rule(args)


def record_hash(text):
    """A file's hash as a wheel's RECORD writes it (urlsafe base64 of the SHA-256, unpadded)."""
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def install_files():
    """{path relative to the venv: text} of the stand-in engines in the running venv."""
    site = Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    files = {
        str(site / path.relative_to(HERE / "site")): path.read_text() for path in sorted((HERE / "site").rglob("*.py"))
    }
    files[str(site / "inferhost-standin.pth")] = f"{HERE}\n"  # read by python -I too
    archs = ", ".join(architectures("sglang"))
    files[str(site / "sglang/srt/models/recorded.py")] = (
        f'"""The recorded SGLang\'s architectures."""\nEntryClass = [{archs}]\n'
    )
    files["bin/vllm"] = f"#!{sys.executable}\nimport sys\n\nimport openai_standin\n\nsys.exit(openai_standin.main())\n"
    for engine in PROGS:
        dist_info = site / f"{engine}-{load(engine)['version']}.dist-info"
        files[str(dist_info / "METADATA")] = (
            f"Metadata-Version: 2.1\nName: {engine}\nVersion: {load(engine)['version']}\n"
        )
        # As a wheel's RECORD (paths relative to site-packages): each file with its hash, and the recording,
        # which is what the stand-in runs.
        owned = {
            os.path.relpath(p, site): t
            for p, t in files.items()
            if p.startswith((str(site / engine) + "/", str(dist_info)))
        }
        owned[f"{HERE}/engines/{engine}.json"] = (ENGINES_DIR / f"{engine}.json").read_text(encoding="utf-8")
        lines = [f"{p},sha256={record_hash(t)},{len(t.encode())}" for p, t in sorted(owned.items())]
        files[str(dist_info / "RECORD")] = "\n".join([*lines, f"{dist_info.name}/RECORD,,"]) + "\n"
    return files


def install():
    """Write the stand-in engines into the running venv; True when anything changed."""
    prefix = Path(sys.prefix)
    files = install_files()
    changed = False
    site = Path(sysconfig.get_path("purelib"))
    for stale in [*site.glob("vllm-*.dist-info"), *site.glob("sglang-*.dist-info")]:
        if str(stale.relative_to(prefix) / "METADATA") not in files:  # another recorded release's
            shutil.rmtree(stale)
            changed = True
    for relative, text in files.items():
        path = prefix / relative
        if path.exists() and path.read_text() == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if relative.startswith("bin/") else 0o644)
        changed = True
    return changed


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        print("changed" if install() else "unchanged")
        sys.exit(0)
    if sys.argv[1:2] != ["record"] or len(sys.argv) != 3 or sys.argv[2] not in PROGS:
        sys.exit("usage: standin_engine.py record vllm|sglang | install")
    with contextlib.redirect_stdout(sys.stderr):  # the engines log to stdout
        recording = record(sys.argv[2])
    json.dump(recording, sys.stdout, indent=1)
    sys.stdout.write("\n")
