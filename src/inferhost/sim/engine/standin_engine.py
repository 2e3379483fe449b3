#!/usr/bin/env python3
"""The stand-in engines' command lines and model registries, recorded from the real vLLM and SGLang.

A stand-in that accepts what the real engine refuses hides the mistakes the stack must catch. So the stand-in
engines carry the real engines' argument sets and registries, recorded from the pinned releases into
``engines/<engine>.json`` (argument names, how many values each takes, their choices where they are plain
strings, the required ones, the architectures). The real-engine test layer records them again from PyPI's
wheels and fails when the files drift, and checks that the stand-in and the real engine give the same
verdicts on the same command lines.

  standin_engine.py record ENGINE    (with the real engine's Python) prints the recording as JSON
  standin_engine.py install          (with a venv's Python) makes its "vllm" and "sglang" the stand-ins:
                                     the server, and the parsers and registries inference_engine_check asks

Standard library only: the stand-in venv of the lab and molecule has nothing else. What the recording leaves
out: vLLM's post-parse rules (``validate_parsed_serve_args``), its ``--flag_with_underscores`` and
``--config.key`` spellings, and choices checked after a type conversion.
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

    # parents[4]: the repository root (src/inferhost/sim/engine/standin_engine.py).
    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "plugins" / "module_utils" / "inference"))
    import engine_check  # noqa: PLC0415  (the production check's own way into each engine)

    parser, _validate, archs = engine_check.ENGINES[engine]()
    return {
        "engine": engine,
        "version": metadata.version(engine),
        "arguments": record_parser(parser),
        "architectures": sorted(archs),
    }


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
