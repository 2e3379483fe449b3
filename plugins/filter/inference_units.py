# SPDX-License-Identifier: Apache-2.0
"""Which rendered units changed in a way that needs their service restarted.

Every unit lists the others in ``Conflicts=`` (only one service owns the GPUs), so adding or removing an
inactive service rewrites the active unit's ``Conflicts=`` line. That line is a dependency systemd reads at
``daemon-reload``: it needs no restart, and a restart would reload a model for nothing (30 minutes on the
reference host). Everything else in a unit does need one.

The comment line right above a ``Conflicts=`` line goes with it (the template writes both or neither).
``{{ result | inference_units_to_restart(services, unit_dir) }}`` takes the registered result of the
config_files task that writes the units (run with ``diff: true``), the services of the plan (``name`` and
``unit``) and the directory of the units, and gives the names of the services whose unit changed beyond its
``Conflicts=`` lines. A changed unit without a text diff (a new file, or a change of mode or owner) counts as
changed.
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


def _diff_path(diff):
    """The path of one config_files diff entry: the header of a text diff, the path of an attribute diff."""
    if "before_header" in diff:
        return diff["before_header"]
    for side in ("after", "before"):
        if isinstance(diff.get(side), dict) and "path" in diff[side]:
            return diff[side]["path"]
    return None


def needs_restart(path, diffs):
    """True when the changed unit at path changed beyond lines a daemon-reload applies."""
    mine = [diff for diff in diffs if _diff_path(diff) == path]
    if not mine:
        return True
    for diff in mine:
        before, after = diff.get("before"), diff.get("after")
        if not isinstance(before, str) or not isinstance(after, str):
            return True
        if _without_reload_only_lines(before) != _without_reload_only_lines(after):
            return True
    return False


def inference_units_to_restart(result, services, unit_dir):
    changed = set((result or {}).get("changed_paths") or [])
    diffs = (result or {}).get("diff") or []  # config_files gives a list, one entry a changed path
    names = []
    for service in services or []:
        path = f"{unit_dir.rstrip('/')}/{service['unit']}"
        if path in changed and needs_restart(path, diffs):
            names.append(service["name"])
    return names


class FilterModule:
    def filters(self):
        return {"inference_units_to_restart": inference_units_to_restart}
