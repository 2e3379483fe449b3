# SPDX-License-Identifier: Apache-2.0
"""Whether NCCL, initialised by validate.yml's probe (playbooks/files/validate-nccl-init.py), took the inventory's
NCCL settings.

NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=ENV makes NCCL log ``NCCL_X set by environment to V`` for each setting it
reads, but only when it reads it. One rank selects no algorithm and no protocol (there is nothing to reduce
across), so NCCL 2.28 on one GPU never reads NCCL_PROTO or NCCL_ALGO and never reports them; it does report
NCCL_P2P_LEVEL (and NCCL_NVLS_ENABLE). With one rank those two are checked in the environment of the probe's
process after NCCL's init (what NCCL would read), and the verdict says they are not NCCL-confirmed. With two or
more ranks every setting must be reported by NCCL.

``{{ result.stdout_lines | nccl_init_verdict(nccl_tuning_settings) }}`` takes the probe's output lines and the
settings ({name, value, reason}) and gives {ok, world_size, confirmed, environment_only, wrong, reported, msg}:
the ``NAME=VALUE`` settings NCCL reported, those only found in the environment, a phrase for each setting that
failed, everything NCCL reported, and one line for the playbook to print.
"""

from __future__ import annotations

import json
import re

# The probe's machine-readable line: this prefix, then a JSON object (world_size, nccl_version, environment).
RESULT_PREFIX = "validate-nccl-init: result "
# NCCL ends some of these lines with a full stop, which is not part of the value.
REPORTED = re.compile(r"\b(NCCL_[A-Z0-9_]+) set by environment to (\S+?)\.?$")
# Settings only a choice of algorithm and protocol reads: a single rank makes no such choice.
SINGLE_RANK_UNREAD = frozenset({"NCCL_PROTO", "NCCL_ALGO"})


def _result(lines):
    for line in reversed(lines):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    return None


def _reported(lines):
    """{name: value} of every "set by environment" line, in the order NCCL first printed them."""
    found = {}
    for line in lines:
        match = REPORTED.search(line.rstrip())
        if match:
            found.setdefault(match.group(1), match.group(2))
    return found


def _pairs(names_values):
    return ", ".join(f"{name}={value}" for name, value in names_values) or "nothing"


def nccl_init_verdict(stdout_lines, settings):
    lines = [str(line) for line in stdout_lines or []]
    wanted = {str(s["name"]): str(s["value"]) for s in settings or []}
    reported = _reported(lines)
    result = _result(lines)
    verdict = {
        "ok": False,
        "world_size": None,
        "confirmed": [],
        "environment_only": [],
        "wrong": [],
        "reported": [f"{name}={value}" for name, value in reported.items()],
    }
    if result is None:
        tail = "; ".join(lines[-5:]) or "no output"
        verdict["msg"] = f'The NCCL probe printed no line starting "{RESULT_PREFIX.strip()}"; its output ends: {tail}'
        return verdict

    world = int(result["world_size"])
    environment = result.get("environment") or {}
    single = world == 1
    for name, value in wanted.items():
        if reported.get(name) == value:
            verdict["confirmed"].append(f"{name}={value}")
        elif name in reported:
            verdict["wrong"].append(f"{name}={value} (NCCL reported {reported[name]})")
        elif not (single and name in SINGLE_RANK_UNREAD):
            verdict["wrong"].append(f"{name}={value} (NCCL did not report it)")
        elif environment.get(name) == value:
            verdict["environment_only"].append(f"{name}={value}")
        elif name in environment:
            verdict["wrong"].append(f"{name}={value} (the environment of the probe has {name}={environment[name]})")
        else:
            verdict["wrong"].append(f"{name}={value} (not in the environment of the probe)")
    verdict["ok"] = not verdict["wrong"]
    verdict["world_size"] = world

    others = [(name, value) for name, value in reported.items() if name not in wanted]
    head = f"NCCL {result.get('nccl_version', '?')} on {world} GPU(s)"
    parts = [f"reported {', '.join(verdict['confirmed']) or 'no inventory setting'}"]
    if verdict["environment_only"]:
        parts.append(
            f"{', '.join(verdict['environment_only'])} only in the environment of the probe, not NCCL-confirmed:"
            " one rank selects no algorithm or protocol, so NCCL reads neither (run on 2 or more GPUs to confirm)"
        )
    if others:
        parts.append(f"also reported, not from the inventory: {_pairs(others)}")
    if verdict["wrong"]:
        verdict["msg"] = f"{head} did not take {', '.join(verdict['wrong'])}; it " + "; ".join(parts)
    else:
        verdict["msg"] = f"{head}: all-reduce correct; " + "; ".join(parts)
    return verdict


class FilterModule:
    def filters(self):
        return {"nccl_init_verdict": nccl_init_verdict}
