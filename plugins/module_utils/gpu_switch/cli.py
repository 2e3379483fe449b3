"""The gpu-switch command.

gpu-switch [--config FILE] [--json] status | to-vm | to-ct | recover [--dry-run] [--force] [--timeout SECONDS]
gpu-switch [--json] check-config [FILE]

check-config reads FILE (default: the configuration the other commands read) by the schema and touches
nothing else: the role validates the file it writes with it before it is put in place.

Exit 0: done, or nothing to do. 1: the move failed (or was refused) and the GPUs are where they were.
2: bad configuration or usage. 3: the move failed and could not be fully rolled back. Every failure ends
with one line, on stderr, that says why.

This file only parses the arguments and hands them to the facade (``switch.Switcher``); running the command and
printing its answer are ``command.py``'s.
"""

from __future__ import annotations

import argparse
import os
import sys

from .command import answer, check_config, failure, outcome_of, render, run
from .config import DEFAULT_PATH
from .switch import Switcher

# run, failure, render and check_config live in command.py; the names stay here for the callers of cli.
__all__ = ["COMMANDS", "check_config", "failure", "main", "parser", "render", "run"]

COMMANDS = ("status", "to-vm", "to-ct", "recover", "check-config")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 86400 seconds")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-switch",
        description="Move the GPUs between the container and the VM.",
        epilog="Exit codes: 0 done or nothing to do; 1 failed and rolled back (or refused); "
        "2 bad configuration or usage; 3 failed and not fully rolled back.",
    )
    p.add_argument("command", choices=COMMANDS, help="status, to-vm, to-ct, recover or check-config")
    p.add_argument("file", nargs="?", metavar="FILE", help="check-config: the file to check (default: as --config)")
    p.add_argument(
        "--config", metavar="FILE", help=f"configuration file (default {DEFAULT_PATH}, or $GPU_SWITCH_CONFIG)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--force", action="store_true", help="stop the giving guest hard if it does not shut down")
    p.add_argument("--timeout", type=_seconds, metavar="SECONDS", help="guest shutdown timeout")
    return p


def main(argv: list[str] | None = None, *, stdout=None, stderr=None, **switcher_kwargs) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.file and args.command != "check-config":
        p.error(f"FILE is for check-config only; {args.command} reads --config FILE")
    outcome = outcome_of(
        args.command,
        args.config or os.environ.get("GPU_SWITCH_CONFIG") or DEFAULT_PATH,
        lambda config: Switcher(config, **switcher_kwargs),
        file=args.file,
        dry_run=args.dry_run,
        force=args.force,
        timeout=args.timeout,
    )
    return answer(outcome, args.command, as_json=args.json, stdout=stdout or sys.stdout, stderr=stderr or sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
