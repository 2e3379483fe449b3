# SPDX-License-Identifier: Apache-2.0
"""Which rendered units changed in a way that needs their service restarted.

Every unit lists the others in ``Conflicts=`` (only one service owns the GPUs), so adding or removing an
inactive service rewrites the active unit's ``Conflicts=`` line. That line is a dependency systemd reads at
``daemon-reload``: it needs no restart, and a restart would reload a model for nothing (30 minutes on the
reference host). Everything else in a unit does need one.

The comment line right above a ``Conflicts=`` line goes with it (the template writes both or neither).
``{{ results | inference_units_to_restart }}`` takes the registered loop results of the template task (run
with ``diff: true``) and gives the names (``inference_service_unit.name``) of the units that changed beyond
their ``Conflicts=`` lines. A changed unit without a diff (a new file) counts as changed.
"""

from __future__ import annotations

import re

RELOAD_ONLY = re.compile(r"^Conflicts=")


def _without_reload_only_lines(text):
    """The unit without its Conflicts= lines and the comment that introduces them."""
    lines = (text or "").splitlines()
    kept = []
    for number, line in enumerate(lines):
        follows = lines[number + 1] if number + 1 < len(lines) else ""
        if RELOAD_ONLY.match(line) or (line.startswith("#") and RELOAD_ONLY.match(follows)):
            continue
        kept.append(line)
    return kept


def needs_restart(result):
    """True when the template result changed the unit beyond lines a daemon-reload applies."""
    if not result.get("changed"):
        return False
    diffs = result.get("diff")
    if not diffs:
        return True
    for diff in diffs if isinstance(diffs, list) else [diffs]:
        if "before" not in diff or "after" not in diff:
            return True
        if _without_reload_only_lines(diff["before"]) != _without_reload_only_lines(diff["after"]):
            return True
    return False


def inference_units_to_restart(results):
    return [r["inference_service_unit"]["name"] for r in results or [] if needs_restart(r)]


class FilterModule:
    def filters(self):
        return {"inference_units_to_restart": inference_units_to_restart}
