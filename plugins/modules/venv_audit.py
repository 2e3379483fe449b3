#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.python_env.records import VENV_OPTIONS, audit, module_venv

DOCUMENTATION = r"""
module: venv_audit
short_description: List the files of a Python environment that differ from what its wheels installed
description:
  - Reads every C(.dist-info/RECORD) of a virtual environment and compares each listed file's size and
    hash with the file on disk; walks site-packages for files that no RECORD lists.
  - Changes the stack made on purpose are reported as I(expected), the rest as I(drift), so an edit
    left behind in an installed package (a debugging C(torch.save) in a model file) is found.
  - Read-only; runs the same in check mode.
options:
  expected:
    description:
      - Changes that are not drift. O(expected[].path) is a glob relative to site-packages, or absolute.
      - With O(expected[].sha256) the file must also have that content.
      - Entries of the manifest C(<path>/.inferhost/patched.json), written by roles that change installed
        files, are added to this list.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Glob of the file(s).
        type: str
        required: true
      sha256:
        description: Hex SHA-256 the file must have.
        type: str
      reason:
        description: Why the change is there (reported with it).
        type: str
  ignore:
    description: Basename globs that are never reported. C(__pycache__) directories are always skipped.
    type: list
    elements: str
    default: ["*.pyc"]
  hash_mode:
    description:
      - C(full) hashes every recorded file.
      - C(mtime) hashes only files modified after their package's RECORD was written (quick; misses an
        edit that forged an old modification time).
    type: str
    choices: [full, mtime]
    default: full
  fail_on_drift:
    description: Fail when drift is found (after reporting it).
    type: bool
    default: false
extends_documentation_fragment:
  - venv
  - attributes.read_only
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Audit the SGLang environment
  venv_audit:
    path: /opt/venvs/sglang
    expected:
      - path: 00-inferhost-nccl.pth
        reason: NCCL settings hook (role nccl_tuning)
  register: audit

- name: Fail on any file that differs from its wheel
  venv_audit:
    path: /opt/venvs/vllm
    fail_on_drift: true
"""

RETURN = r"""
drift:
  description: Files that differ from their RECORD or are in none, and were not declared.
  returned: always
  type: list
  elements: dict
  sample:
    - path: lib/python3.12/site-packages/vllm/model_executor/models/deepseek_v2.py
      kind: modified
      package: vllm
      detail: sha256 differs from RECORD
expected:
  description: Files that differ as declared, with the reason.
  returned: always
  type: list
  elements: dict
packages:
  description: Number of installed distributions audited.
  returned: always
  type: int
files:
  description: Number of files listed in RECORD files.
  returned: always
  type: int
summary:
  description: One line per finding, drift first, for display.
  returned: always
  type: list
  elements: str
"""


def summary(result):
    lines = [f"DRIFT {d['kind']}: {d['path']} ({d['package'] or 'no package'}; {d['detail']})" for d in result["drift"]]
    lines += [f"expected {e['kind']}: {e['path']} ({e['reason']})" for e in result["expected"]]
    return lines


def main():
    module = AnsibleModule(
        argument_spec={
            **VENV_OPTIONS,
            "expected": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "path": {"type": "str", "required": True},
                    "sha256": {"type": "str"},
                    "reason": {"type": "str"},
                },
            },
            "ignore": {"type": "list", "elements": "str", "default": ["*.pyc"]},
            "hash_mode": {"type": "str", "choices": ["full", "mtime"], "default": "full"},
            "fail_on_drift": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    root, site = module_venv(module)
    try:
        result = audit(
            site,
            root,
            expected=[{k: v for k, v in e.items() if v is not None} for e in module.params["expected"]],
            ignore=module.params["ignore"],
            hash_mode=module.params["hash_mode"],
        )
    except (OSError, ValueError) as err:
        module.fail_json(msg=f"cannot audit {root}: {err}")
    result["summary"] = summary(result)
    result["site_packages"] = site
    if result["drift"] and module.params["fail_on_drift"]:
        module.fail_json(
            msg=f"{root}: {len(result['drift'])} file(s) differ from their wheels: "
            + "; ".join(f"{d['path']} ({d['kind']})" for d in result["drift"][:20]),
            **result,
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
