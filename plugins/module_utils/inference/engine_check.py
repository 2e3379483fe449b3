"""Ask an inference engine, inside its own environment, whether it would take a service.

The ``inference_engine_check`` module runs this file's source with the Python of the service's virtual
environment, so the answer comes from the installed engine itself, not from a list kept here:

* the command line's arguments go through the engine's own parser: ``vllm serve``'s (with the checks vLLM
  makes right after parsing) or SGLang's ``ServerArgs.add_cli_args``;
* the checkpoint's ``config.json`` ``architectures`` are looked up in the engine's model registry. vLLM's
  registry lists its architectures without importing a model. SGLang's imports every model module, and
  those load its CUDA kernels, so its registry is read as SGLang builds it: each ``sglang/srt/models``
  module's ``EntryClass``, taken from the source.

Without a GPU (a guest whose GPUs are with the VM, a test machine), vLLM resolves no platform and its parser
would fail on device defaults: the CPU platform is selected then. Parsing only; nothing is loaded or started.

Request on stdin: ``{"engine": "vllm" | "sglang", "services": [{"name", "args", "architectures"}]}``, where
``args`` is the argv after the program (after ``vllm serve`` or after the SGLang launcher).
Answer on stdout: ``{"engine", "version", "services": [{"name", "refusals": [{"what", "message"}]}]}``, where
``what`` is ``argument`` (``message``: the parser's error) or ``architecture`` (``message``: the name it lacks).
Only the standard library is imported outside the engine.
"""

# The engines are imported inside functions: this file is also imported where no engine is installed.
# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import sys
from importlib import metadata, util
from pathlib import Path


def parse(parser, args):
    """(namespace, None) or (None, the parser's error message without its usage text)."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parser.parse_args(args), None
    except SystemExit:
        lines = [line for line in errors.getvalue().splitlines() if line.strip()]
        message = lines[-1] if lines else "the command line was refused"
        return None, message.split(" error: ", 1)[-1]


def entry_classes(source):
    """Names a model module registers (its module-level ``EntryClass``: one class or a list of them)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            names.update(
                v.id if isinstance(v, ast.Name) else v.attr for v in values if isinstance(v, ast.Name | ast.Attribute)
            )
    return names


def vllm_engine():
    """The parser of ``vllm serve``, its post-parse check and the registry's architectures."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # releases before 0.12 kept it in vllm.utils
        from vllm.utils import FlexibleArgumentParser
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.model_executor.models import ModelRegistry

    return (
        make_arg_parser(FlexibleArgumentParser(prog="vllm serve")),
        validate_parsed_serve_args,
        set(ModelRegistry.get_supported_archs()),
    )


def sglang_engine():
    """The parser of ``sglang.launch_server`` (it checks nothing more before loading) and the registry."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    archs = set()
    for directory in util.find_spec("sglang.srt.models").submodule_search_locations:
        for path in sorted(Path(directory).glob("*.py")):
            archs |= entry_classes(path.read_text(encoding="utf-8-sig"))
    return parser, None, archs


def check_args(parser, validate, args):
    """The engine's refusal of a command line, or None."""
    namespace, error = parse(parser, args)
    if error or validate is None:
        return error
    try:
        validate(namespace)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


ENGINES = {"vllm": vllm_engine, "sglang": sglang_engine}


def answer(request):
    engine = request["engine"]
    parser, validate, archs = ENGINES[engine]()
    services = []
    for service in request["services"]:
        refusals = []
        error = check_args(parser, validate, [str(a) for a in service["args"]])
        if error:
            refusals.append({"what": "argument", "message": error})
        for arch in service.get("architectures") or []:
            if arch not in archs:
                refusals.append({"what": "architecture", "message": arch})
        services.append({"name": service["name"], "refusals": refusals})
    return {"engine": engine, "version": metadata.version(engine), "services": services}


def main():
    request = json.load(sys.stdin)
    # Engines log to stdout, some from C code: the answer gets the real stdout, everything else goes to stderr.
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    with contextlib.redirect_stdout(sys.stderr):
        result = answer(request)
    with os.fdopen(answer_fd, "w", encoding="utf-8") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
