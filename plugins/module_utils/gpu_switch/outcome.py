# SPDX-License-Identifier: Apache-2.0
"""What a command answers: the Outcome (JSON result, exit code, one-line reason), and the words its results
share: an error's reason, where the GPUs are now, and the owner and drivers view (a result's ``before``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import EXIT_OK, GpuSwitchError


@dataclass
class Outcome:
    """What a command returns: the JSON result, the exit code, and the one-line reason on failure."""

    result: dict
    exit_code: int = EXIT_OK
    reason: str | None = None


def drivers_view(result: dict) -> dict:
    """Owner and the driver of every function: the 'before' of a result (and the diff of the Ansible module)."""
    return {
        "owner": result.get("owner"),
        "drivers": {f["address"]: f["driver"] for g in result.get("gpus", []) for f in g["functions"]},
    }


def reason_of(exc: BaseException) -> str:
    """The one-line reason of a failure: a GpuSwitchError's own, anything else named as an internal error."""
    if isinstance(exc, GpuSwitchError):
        return exc.reason
    return f"internal error: {type(exc).__name__}: {exc}"


def where_now(result: dict) -> str:
    """Where a result leaves the GPUs and the guests, in a few words for the reason line."""
    drivers = sorted({f["driver"] or "unbound" for g in result.get("gpus", []) for f in g["functions"]})
    parts = [f"owner {result.get('owner')}", f"drivers {'/'.join(drivers)}"]
    for role in ("container", "vm"):
        if role in result:
            parts.append(f"{'CT' if role == 'container' else 'VM'} {result[role]['vmid']} {result[role]['status']}")
    return ", ".join(parts)
