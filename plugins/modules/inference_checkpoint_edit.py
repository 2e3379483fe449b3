#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import json
import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: inference_checkpoint_edit
short_description: Set or remove one key of a checkpoint's JSON configuration, keeping a backup
description:
  - Edits one key of a JSON file of a model checkpoint (for example C(hf_quant_config.json)), addressed by a
    dotted path. The original is kept as a timestamped backup next to the file, and the change is shown with
    C(--diff).
  - Which edits are still needed for the installed engine version is decided by M(inference_service_plan);
    this module only applies them.
version_added: "0.1.0"
author: inferhost contributors
options:
  path:
    description: The JSON file.
    type: path
    required: true
  key:
    description: Dotted path of the key, for example C(quantization.kv_cache_quant_algo).
    type: str
    required: true
  state:
    description: C(absent) removes the key; C(present) sets it to O(value).
    type: str
    choices: [present, absent]
    default: absent
  value:
    description: The value for O(state=present) (any JSON value).
    type: raw
  backup:
    description: Keep a timestamped copy of the original before writing.
    type: bool
    default: true
extends_documentation_fragment:
  - attributes.edit
"""

EXAMPLES = r"""
- name: Drop the FP8 KV-cache declaration the engine cannot serve yet
  inference_checkpoint_edit:
    path: /srv/models/Kimi-K2.5/hf_quant_config.json
    key: quantization.kv_cache_quant_algo
    state: absent
"""

RETURN = r"""
backup_file:
  description: The backup of the original, when one was written.
  returned: changed and backup
  type: str
before:
  description: The key's value before the edit (null when absent).
  returned: always
  type: raw
"""


MISSING = object()


def edit(document, key, state, value):
    """Return ``(new_document, old_value)``; ``old_value`` is MISSING when the key was absent."""
    parts = key.split(".")
    new = json.loads(json.dumps(document))
    node = new
    for depth, part in enumerate(parts[:-1], start=1):
        child = node.get(part, MISSING)
        if child is MISSING:
            if state == "absent":
                return new, MISSING
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ValueError(f"{'.'.join(parts[:depth])} is not a JSON object")
        node = child
    old = node.get(parts[-1], MISSING)
    if state == "absent":
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value
    return new, old


def render(document):
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "key": {"type": "str", "required": True, "no_log": False},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "absent"},
            "value": {"type": "raw"},
            "backup": {"type": "bool", "default": True},
        },
        required_if=[("state", "present", ["value"])],
        supports_check_mode=True,
    )
    path, key, state = module.params["path"], module.params["key"], module.params["state"]
    if not os.path.isfile(path):
        module.fail_json(msg=f"{path} does not exist: the checkpoint must be downloaded before it is edited")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        document = json.loads(text)
        new, old = edit(document, key, state, module.params["value"])
    except ValueError as exc:
        module.fail_json(msg=f"{path}: {exc}")
    before = None if old is MISSING else old
    changed = new != document
    result = {"changed": changed, "before": before, "path": path}
    if changed:
        result["diff"] = {"before": text, "after": render(new), "before_header": path, "after_header": path}
        if not module.check_mode:
            if module.params["backup"]:
                result["backup_file"] = module.backup_local(path)
            tmp = f"{path}.inferhost-tmp"
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(render(new))
            module.atomic_move(tmp, path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
