"""Ask an inference engine, inside its own environment, whether it would take a service.

The ``inference_engine_check`` module runs this file's source with the Python of the service's virtual
environment, so the answer comes from the installed engine itself, not from a list kept here:

* the command line's arguments go through the engine's own parser (``vllm serve``'s, or SGLang's
  ``ServerArgs.add_cli_args``), then through the engine's own checks of the parsed arguments that need no
  device and no checkpoint (``check_parsed``: vLLM's ``validate_parsed_serve_args`` and
  ``validate_api_server_args``, and its reasoning parser lookup; the device-free steps of SGLang's
  ``ServerArgs``), so a refusal the engine would give at start, or only after loading the model, comes now;
* the checkpoint's ``config.json`` ``architectures`` are looked up in the engine's model registry. vLLM's
  registry lists its architectures without importing a model. SGLang's imports every model module, and
  those load its CUDA kernels, so its registry is read as SGLang builds it: each ``sglang/srt/models``
  module's ``EntryClass``, taken from the source.

Without a GPU (a guest whose GPUs are with the VM, a test machine), vLLM resolves no platform and its parser
would fail on device defaults: the CPU platform is selected then. Nothing is loaded or started.

Request on stdin: ``{"engine": "vllm" | "sglang", "services": [{"name", "args", "architectures"}]}``, where
``args`` is the argv after the program (after ``vllm serve`` or after the SGLang launcher).
Answer on stdout: ``{"engine", "version", "services": [{"name", "refusals": [{"what", "message"}]}]}``, where
``what`` is ``argument`` (``message``: the engine's error, from its parser or its checks) or ``architecture``
(``message``: the name it lacks).
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
    """The parser of ``vllm serve``, its checks of the parsed arguments and the registry's architectures."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # releases before 0.12 kept it in vllm.utils
        from vllm.utils import FlexibleArgumentParser
    try:  # later releases keep the server's setup in the launchers package
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.entrypoints.launchers.launcher import validate_api_server_args
    except ImportError:
        from vllm.entrypoints.openai.api_server import validate_api_server_args
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.model_executor.models import ModelRegistry
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    def check_parsed(args):
        # What ``vllm serve`` checks before it loads anything: the serve subcommand's validate, then the API
        # server's setup (a parser plugin file is imported first: it registers the names it brings).
        validate_parsed_serve_args(args)
        if args.tool_parser_plugin and len(args.tool_parser_plugin) > 3:
            ToolParserManager.import_tool_parser(args.tool_parser_plugin)
        if args.reasoning_parser_plugin and len(args.reasoning_parser_plugin) > 3:
            ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)
        validate_api_server_args(args)
        # validate_api_server_args reads the reasoning parser of --structured-outputs-config only: the engine
        # looks up --reasoning-parser's name after the model is loaded (its structured output manager), with
        # this call.
        if args.reasoning_parser:
            ReasoningParserManager.get_reasoning_parser(args.reasoning_parser)

    return (
        make_arg_parser(FlexibleArgumentParser(prog="vllm serve")),
        check_parsed,
        set(ModelRegistry.get_supported_archs()),
    )


# The steps of SGLang's ServerArgs.__post_init__ that refuse arguments and need no device and no checkpoint,
# in its order. The others, and most of check_server_args (which runs on the resolved arguments), need the GPU
# memory, the checkpoint's config or both. Run on the arguments as given, _handle_cache_compatibility can refuse
# one thing the engine takes: a --swa-full-tokens-ratio outside (0, 1], which SGLang resets to 1 for
# MiMo-V2-Flash and Step-3.5 with the hierarchical cache before it checks.
SGLANG_DEVICE_FREE_STEPS = ("_handle_tokenizer_batching", "_handle_cache_compatibility", "_handle_other_validations")
# check_server_args's checks of its bucket flags (a static rule on the values as given).
SGLANG_BUCKET_FLAGS = ("--prompt-tokens-buckets", "--generation-tokens-buckets")


def sglang_engine():
    """The parser of ``sglang.launch_server``, its device-free checks and the registry."""
    from sglang.srt.server_args import ServerArgs

    class ParsedServerArgs(ServerArgs):
        def __post_init__(self):
            """Left out: it resolves the arguments from the device and the checkpoint (steps run below)."""

    def check_parsed(args):
        server_args = ParsedServerArgs.from_cli_args(args)  # the engine's own mapping of the parsed arguments
        for step in SGLANG_DEVICE_FREE_STEPS:
            getattr(server_args, step)()
        for flag in SGLANG_BUCKET_FLAGS:
            server_args.validate_buckets_rule(flag, getattr(server_args, flag[2:].replace("-", "_")))

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    archs = set()
    for directory in util.find_spec("sglang.srt.models").submodule_search_locations:
        for path in sorted(Path(directory).glob("*.py")):
            archs |= entry_classes(path.read_text(encoding="utf-8-sig"))
    return parser, check_parsed, archs


def check_args(parser, check_parsed, args):
    """The engine's refusal of a command line (its message), or None."""
    namespace, error = parse(parser, args)
    if error or check_parsed is None:
        return error
    try:
        check_parsed(namespace)
    except KeyError as exc:  # str() of a KeyError is its message's repr
        return str(exc.args[0]) if exc.args else "KeyError"
    # ImportError: a registered parser whose module does not import (vLLM fails on it at start too).
    except (AssertionError, ImportError, OSError, TypeError, ValueError) as exc:
        return str(exc) or type(exc).__name__
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
