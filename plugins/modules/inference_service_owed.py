#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import datetime
import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: inference_service_owed
short_description: Whether the running inference service owes a restart that an earlier run did not do
description:
  - A run that writes a service's definition (its unit, key file, guard, launcher, checkpoint edit) and stops before
    it restarts the service leaves the engine on its old definition, and the next run, finding nothing to change,
    would never restart it. This module tells from the target itself, whatever task the earlier run stopped after.
  - The service owes a restart when the role's record names it (O(marker)), when systemd has not loaded its unit file
    as it is on disk (C(NeedDaemonReload=yes)), or when one of O(paths) changed after the engine's main process
    started while the unit runs.
  - Changes nothing.
version_added: "0.2.0"
author: inferhost contributors
options:
  unit:
    description: The service's systemd unit.
    type: str
    required: true
  name:
    description: The service's name, as the role's record of an owed restart holds it.
    type: str
    required: true
  marker:
    description: The role's record of an owed restart (a file naming the service).
    type: path
    required: true
  paths:
    description:
      - The files the service's definition is made of; a directory stands for the files under it, less compiled
        Python and the names in O(ignore). Missing paths are skipped.
    type: list
    elements: path
    default: []
  ignore:
    description: File names under the directories of O(paths) that are no part of the service's definition.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Read the restart an earlier run owes the active service
  inference_service_owed:
    unit: inference-qwen35.service
    name: qwen35
    marker: /var/lib/inferhost-service/restart-owed
    paths: [/etc/inferhost/services/qwen35.secret.env, /usr/local/lib/inferhost/gpu-guard]
    ignore: [watchdog.py]
  register: __owed
"""

RETURN = r"""
owed:
  description: The service owes a restart.
  returned: always
  type: bool
reasons:
  description: Why, one line each.
  returned: always
  type: list
  elements: str
daemon_reload:
  description: systemd must read the unit files again before the restart (C(NeedDaemonReload=yes)).
  returned: always
  type: bool
marker:
  description: The role's record names the service.
  returned: always
  type: bool
"""

RUNNING = ("active", "activating", "reloading")


def files_of(paths, ignore):
    """Every file that ``paths`` stands for."""
    for path in paths:
        if os.path.isfile(path):
            yield path
        elif os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                for name in names:
                    if not name.endswith(".pyc") and name not in ignore:
                        yield os.path.join(root, name)


def started_at(text):
    """Epoch seconds of systemd's timestamp in the us+utc format (``Sun 2026-12-06 04:06:57.900514 UTC``)."""
    parts = text.split()
    if len(parts) < 3:
        return None
    try:
        when = datetime.datetime.strptime(f"{parts[1]} {parts[2]}", "%Y-%m-%d %H:%M:%S.%f")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.UTC).timestamp()


def unit_state(module, unit):
    props = "NeedDaemonReload,ActiveState,ExecMainStartTimestamp"
    rc, out, _err = module.run_command(["systemctl", "show", "--timestamp=us+utc", unit, "--property", props])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if rc == 0 else {}


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "name": {"type": "str", "required": True},
            "marker": {"type": "path", "required": True},
            "paths": {"type": "list", "elements": "path", "default": []},
            "ignore": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    reasons = []
    try:
        with open(p["marker"], encoding="utf-8") as handle:
            marked = handle.read().strip() == p["name"]
    except FileNotFoundError:
        marked = False
    if marked:
        reasons.append(f"an earlier run recorded it ({p['marker']})")
    state = unit_state(module, p["unit"])
    reload = state.get("NeedDaemonReload") == "yes"
    if reload:
        reasons.append(f"systemd has not loaded {p['unit']} as it is on disk (NeedDaemonReload=yes)")
    began = started_at(state.get("ExecMainStartTimestamp", ""))
    if state.get("ActiveState") in RUNNING and began:
        newer = sorted(f for f in files_of(p["paths"], set(p["ignore"])) if os.stat(f).st_mtime > began)
        if newer:
            reasons.append(f"changed after the engine started: {', '.join(newer[:5])}")
    module.exit_json(changed=False, owed=bool(reasons), reasons=reasons, daemon_reload=reload, marker=marked)


if __name__ == "__main__":
    main()
