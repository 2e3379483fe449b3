#!/usr/bin/env python3
"""The stand-in engines' command lines and model registries, recorded from the real vLLM and SGLang.

A stand-in that accepts what the real engine refuses hides the mistakes the stack must catch. So the stand-in
engines carry the real engines' argument sets and registries, recorded from the pinned releases into
``engines/<engine>.json`` (argument names, how many values each takes, their choices where they are plain
strings, the required ones, the architectures). The real-engine test layer records them again from PyPI's
wheels and fails when the files drift, and checks that the stand-in and the real engine give the same
verdicts on the same command lines.

  standin_engine.py record ENGINE    (with the real engine's Python) prints the recording as JSON

Standard library only: the stand-in venv of the lab and molecule has nothing else. What the recording leaves
out: vLLM's post-parse rules (``validate_parsed_serve_args``), its ``--flag_with_underscores`` and
``--config.key`` spellings, and choices checked after a type conversion.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

ENGINES_DIR = Path(__file__).with_name("engines")
PROGS = {"vllm": "vllm serve", "sglang": "sglang.launch_server"}


def load(engine):
    return json.loads((ENGINES_DIR / f"{engine}.json").read_text(encoding="utf-8"))


def add_arguments(parser, engine, recording=None):
    """Add the recorded arguments of ``engine`` to an argparse parser, as the real engine adds its own."""
    for argument in (recording or load(engine))["arguments"]:
        kwargs = {}
        if argument["nargs"] == 0:
            kwargs["action"] = "store_true"
        else:
            kwargs["nargs"] = argument["nargs"]
            if argument["choices"] is not None:
                kwargs["choices"] = argument["choices"]
        if argument["flags"]:
            parser.add_argument(*argument["flags"], dest=argument["dest"], required=argument["required"], **kwargs)
        else:
            parser.add_argument(argument["dest"], **kwargs)
    return parser


def parser_for(engine, recording=None):
    return add_arguments(argparse.ArgumentParser(prog=PROGS[engine], add_help=False), engine, recording)


def architectures(engine):
    return load(engine)["architectures"]


def record_parser(parser):
    """The arguments of a real engine's parser, in the form ``add_arguments`` takes."""
    arguments = []
    for action in parser._actions:  # argparse has no public list of its actions
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        choices = action.choices
        plain = choices is not None and all(isinstance(c, str) for c in choices)
        arguments.append(
            {
                "flags": list(action.option_strings),
                "dest": action.dest,
                "nargs": action.nargs,
                "choices": sorted(choices) if plain else None,
                "required": bool(action.required) if action.option_strings else False,
            }
        )
    return sorted(arguments, key=lambda a: (a["flags"][:1], a["dest"]))


def record(engine):
    """Record ``engine`` from its installed release (run with the engine environment's Python)."""
    from importlib import metadata  # noqa: PLC0415

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "module_utils" / "inference"))
    import engine_check  # noqa: PLC0415  (the production check's own way into each engine)

    parser, _validate, archs = engine_check.ENGINES[engine]()
    return {
        "engine": engine,
        "version": metadata.version(engine),
        "arguments": record_parser(parser),
        "architectures": sorted(archs),
    }


if __name__ == "__main__":
    if sys.argv[1:2] != ["record"] or len(sys.argv) != 3 or sys.argv[2] not in PROGS:
        sys.exit("usage: standin_engine.py record vllm|sglang")
    with contextlib.redirect_stdout(sys.stderr):  # the engines log to stdout
        recording = record(sys.argv[2])
    json.dump(recording, sys.stdout, indent=1)
    sys.stdout.write("\n")
