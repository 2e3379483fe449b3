"""The gpu-switch command.

gpu-switch [--config FILE] [--json] status | to-vm | to-ct | recover [--dry-run] [--force] [--timeout SECONDS]
gpu-switch [--json] check-config [FILE]

check-config reads FILE (default: the configuration the other commands read) by the schema and touches
nothing else: the role validates the file it writes with it before it is put in place.

Exit 0: done, or nothing to do. 1: the move failed (or was refused) and the GPUs are where they were.
2: bad configuration or usage. 3: the move failed and could not be fully rolled back. Every failure ends
with one line, on stderr, that says why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from .config import DEFAULT_PATH, load_config
from .errors import EXIT_STRANDED, EXIT_USAGE, ConfigError, GpuSwitchError
from .switch import Outcome, Switcher, _reason

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


def run(command: str, switcher: Switcher, *, dry_run=False, force=False, timeout=None) -> Outcome:
    """Run one command; every GpuSwitchError becomes an Outcome with its exit code and reason."""
    try:
        if command == "status":
            return switcher.status()
        if command == "recover":
            return switcher.recover(dry_run=dry_run, force=force, shutdown_timeout=timeout)
        return switcher.move(command[3:], dry_run=dry_run, force=force, shutdown_timeout=timeout)
    except GpuSwitchError as exc:
        return failure(command, exc, switcher)


def failure(command: str, exc: GpuSwitchError, switcher: Switcher | None = None) -> Outcome:
    """The result for a failure before any change: the current state where it can be read, and the reason."""
    result: dict = {"command": command, "owner": "unknown", "gpus": [], "changed": False, "steps": []}
    if switcher is not None and not isinstance(exc, ConfigError):
        with contextlib.suppress(GpuSwitchError):
            result.update(switcher.describe(switcher.read_state()))
    stranded = exc.exit_code == EXIT_STRANDED
    result.update(error=exc.reason, rolled_back=not stranded)
    if getattr(switcher, "_holders", None):
        result["holders"] = [h.as_dict() for h in switcher._holders]
    prefix = "" if stranded or exc.exit_code == EXIT_USAGE else f"{command} refused, nothing was changed: "
    return Outcome(result, exc.exit_code, prefix + exc.reason)


def render(result: dict) -> str:
    lines = [f"owner: {result.get('owner')}"]
    for gpu in result.get("gpus", []):
        functions = " ".join(f"{f['address']}={f['driver'] or 'unbound'}" for f in gpu["functions"])
        lines.append(f"gpu {gpu['address']}  iommu group {gpu['iommu_group']}  numa {gpu['numa_node']}  {functions}")
    for role in ("container", "vm"):
        if role in result:
            guest = result[role]
            config = " ".join(f"{k}={v}" for k, v in guest.get("config", {}).items()) or "(no GPU entries)"
            lines.append(f"{role} {guest['vmid']}: {guest['status']}  {config}")
    if result.get("steps"):
        lines.append("plan:" if result.get("dry_run") else "steps:")
        for step in result["steps"]:
            note = f"  ({step['note']})" if step.get("note") else ""
            lines.append(f"  {step['state']:<11} {step['name']:<13} {step['detail']}{note}")
    for holder in result.get("holders", []):
        where = f" in CT {holder['container']}" if holder.get("container") is not None else ""
        lines.append(f"holder: pid {holder['pid']} {holder['command']}{where} ({holder['path']})")
    if result.get("needs_reboot"):
        lines.append(f"needs host reboot: {', '.join(result['needs_reboot'])}")
    if result.get("journal"):
        lines.append(f"journal: {result['journal'].get('text')}")
    if result.get("dry_run"):
        lines.append("dry run: nothing was changed" + ("" if result.get("would_change") else "; nothing to do"))
    elif "error" not in result and result.get("command"):
        lines.append("done" if result.get("changed") else "nothing to do")
    return "\n".join(lines)


def check_config(path: str) -> Outcome:
    """Read the file by the schema, as the command would but for the environment's roots (the file alone)."""
    result = {"command": "check-config", "config": path, "changed": False}
    try:
        load_config(path, environ={})
    except ConfigError as exc:
        return Outcome({**result, "valid": False, "error": exc.reason}, exc.exit_code, exc.reason)
    return Outcome({**result, "valid": True})


def main(argv: list[str] | None = None, *, stdout=None, stderr=None, **switcher_kwargs) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    p = parser()
    args = p.parse_args(argv)
    if args.file and args.command != "check-config":
        p.error(f"FILE is for check-config only; {args.command} reads --config FILE")
    path = args.config or os.environ.get("GPU_SWITCH_CONFIG") or DEFAULT_PATH
    switcher = None
    try:
        if args.command == "check-config":
            outcome = check_config(args.file or path)
        else:
            switcher = Switcher(load_config(path), **switcher_kwargs)
            outcome = run(args.command, switcher, dry_run=args.dry_run, force=args.force, timeout=args.timeout)
    except GpuSwitchError as exc:
        outcome = failure(args.command, exc, switcher)
    except Exception as exc:  # noqa: BLE001 - the contract: every failure ends with a one-line reason
        outcome = Outcome(
            {"command": args.command, "error": _reason(exc), "rolled_back": False},
            EXIT_STRANDED,
            f"{_reason(exc)}; check gpu-switch status",
        )
    if args.json:
        json.dump(outcome.result, stdout, sort_keys=True)
        stdout.write("\n")
    elif args.command == "check-config":
        if outcome.result.get("valid"):
            stdout.write(f"{outcome.result['config']}: valid\n")
    else:
        stdout.write(render(outcome.result) + "\n")
    stdout.flush()
    if outcome.exit_code:
        stderr.write(f"gpu-switch: {outcome.reason}\n")
        stderr.flush()
    return outcome.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
