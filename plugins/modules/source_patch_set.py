#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.source_build.patchset import PatchError, Repo, reconcile

DOCUMENTATION = r"""
module: source_patch_set
short_description: Apply a patch set from data to a git checkout, idempotently
description:
  - Brings the work tree of a git checkout to I(HEAD with every patch applied, in order).
  - Compares trees, not files - already applied is a no-op; a pristine tree gets the set; a tree with an
    older set or a hand edit is restored from HEAD first (reported in RV(reverted)) and patched again.
  - A patch that no longer applies to the checked-out commit fails before anything is touched, naming
    the patch, the file and git's reason, so a moved upstream is found at once.
options:
  path:
    description: The git work tree.
    type: path
    required: true
  patches:
    description: The patch set, applied in order.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Short name, used in messages and in the wheel cache key.
        type: str
        required: true
      diff:
        description:
          - Unified diff (as from C(git diff)), paths relative to the repository root.
          - An empty line in a hunk is a blank context line, so editors that strip trailing spaces do no harm.
        type: str
        required: true
      reason:
        description: Why the patch exists.
        type: str
  strip:
    description: Leading path components to remove from the diff's paths (C(-p)).
    type: int
    default: 1
extends_documentation_fragment:
  - attributes.edit
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Apply the SM120 patch set to sgl-kernel
  source_patch_set:
    path: /var/lib/inferhost/source-build/src/sgl-kernel
    patches: "{{ build.patches }}"
"""

RETURN = r"""
commit:
  description: The checked-out commit.
  returned: always
  type: str
state:
  description: applied, pristine (no patches), or would-apply (check mode).
  returned: always
  type: str
files:
  description: Files the patch set writes.
  returned: always
  type: list
  elements: str
reverted:
  description: Files that differed from the expected result and were restored before patching.
  returned: when changed
  type: list
  elements: str
unexpected:
  description: Of those, the files the patch set does not touch (hand edits).
  returned: when changed
  type: list
  elements: str
"""


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "patches": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "name": {"type": "str", "required": True},
                    "diff": {"type": "str", "required": True},
                    "reason": {"type": "str"},
                },
            },
            "strip": {"type": "int", "default": 1},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    if not os.path.isdir(os.path.join(path, ".git")) and not os.path.isfile(os.path.join(path, ".git")):
        module.fail_json(msg=f"{path} is not a git work tree")
    git = module.get_bin_path("git", required=True)

    def run(argv, cwd, env, data):
        environ = dict(os.environ, **(env or {}), LC_ALL="C")
        rc, out, err = module.run_command(argv, cwd=cwd, data=data, binary_data=True, environ_update=environ)
        return rc, out, err

    patches = module.params["patches"]
    try:
        result = reconcile(Repo(path, run, git), patches, module.params["strip"], module.check_mode)
    except PatchError as err:
        module.fail_json(msg=str(err))
    if result["changed"]:
        text = "".join(f"# {p['name']}: {p.get('reason') or ''}\n{p['diff']}" for p in patches)
        if result["reverted"]:
            text = f"# restored from HEAD first: {', '.join(result['reverted'])}\n" + text
        result["diff"] = {"prepared": text}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
