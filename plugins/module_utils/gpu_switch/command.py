# SPDX-License-Identifier: Apache-2.0
"""One gpu-switch command, from its parsed arguments to what it prints and its exit code: the command run on
the facade (every GpuSwitchError, and any other exception, turned into an Outcome with its exit code and
one-line reason), ``check-config``, and the answer as JSON or text with the reason on stderr.

The command line (``cli.py``) and the Ansible module call it; neither runs a command another way.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from .config import Config, load_config
from .errors import EXIT_STRANDED, EXIT_USAGE, ConfigError, GpuSwitchError
from .outcome import Outcome, reason_of
from .switch import Switcher


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
    if switcher is not None and switcher.holders:
        result["holders"] = [h.as_dict() for h in switcher.holders]
    prefix = "" if stranded or exc.exit_code == EXIT_USAGE else f"{command} refused, nothing was changed: "
    return Outcome(result, exc.exit_code, prefix + exc.reason)


def check_config(path: str) -> Outcome:
    """Read the file by the schema, as the command would but for the environment's roots (the file alone)."""
    result = {"command": "check-config", "config": path, "changed": False}
    try:
        load_config(path, environ={})
    except ConfigError as exc:
        return Outcome({**result, "valid": False, "error": exc.reason}, exc.exit_code, exc.reason)
    return Outcome({**result, "valid": True})


def outcome_of(
    command: str,
    path: str,
    make_switcher: Callable[[Config], Switcher],
    *,
    file: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    timeout: float | None = None,
) -> Outcome:
    """The command's Outcome, whatever happens: the contract is that every failure ends with a one-line reason."""
    switcher = None
    try:
        if command == "check-config":
            return check_config(file or path)
        switcher = make_switcher(load_config(path))
        return run(command, switcher, dry_run=dry_run, force=force, timeout=timeout)
    except GpuSwitchError as exc:
        return failure(command, exc, switcher)
    except Exception as exc:  # noqa: BLE001 - the contract: every failure ends with a one-line reason
        return Outcome(
            {"command": command, "error": reason_of(exc), "rolled_back": False},
            EXIT_STRANDED,
            f"{reason_of(exc)}; check gpu-switch status",
        )


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


def answer(outcome: Outcome, command: str, *, as_json: bool, stdout, stderr) -> int:
    """Print the outcome (one JSON object, or text) and, on failure, the one line that says why; the exit code."""
    if as_json:
        json.dump(outcome.result, stdout, sort_keys=True)
        stdout.write("\n")
    elif command == "check-config":
        if outcome.result.get("valid"):
            stdout.write(f"{outcome.result['config']}: valid\n")
    else:
        stdout.write(render(outcome.result) + "\n")
    stdout.flush()
    if outcome.exit_code:
        stderr.write(f"gpu-switch: {outcome.reason}\n")
        stderr.flush()
    return outcome.exit_code
