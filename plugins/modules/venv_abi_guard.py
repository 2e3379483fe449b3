#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.python_env.pins import (
    check,
    describe,
    installed_versions,
    normalize_name,
    pins_from_requirements,
)
from ansible.module_utils.python_env.records import VENV_OPTIONS, module_venv

DOCUMENTATION = r"""
module: venv_abi_guard
short_description: Fail when a package an environment's spec pins is no longer installed at its version
description:
  - Reads the installed versions from the environment's C(.dist-info) metadata and compares them with
    every exact pin (C(name==version)) in O(requirements), and with O(pins).
  - Meant to run after every change to an environment. A dependency resolved later that replaced
    C(torch ...+cu130) with another build fails the play here, naming the package and both versions,
    instead of failing later with C(undefined symbol) in a CUDA extension.
  - A pin with a local label (C(+cu130)) must match it exactly; a pin without one accepts any label.
  - Read-only; runs the same in check mode.
options:
  requirements:
    description: Requirement strings of the environment's spec; only exact pins are checked.
    type: list
    elements: str
    default: []
  pins:
    description: Further pins, name to version.
    type: dict
    default: {}
  only:
    description: Check only these package names (all pins when empty).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - venv
  - attributes.read_only
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Check that torch is still the nightly CUDA 13.0 build
  venv_abi_guard:
    path: /opt/venvs/sglang
    requirements:
      - torch==2.10.0.dev20251215+cu130
      - flashinfer-python==0.6.3
"""

RETURN = r"""
pins:
  description: The pins that were checked, name to version.
  returned: always
  type: dict
installed:
  description: Installed version of each pinned package (null when missing).
  returned: always
  type: dict
violations:
  description: Pins not satisfied, each with name, pinned and installed.
  returned: always
  type: list
  elements: dict
"""


def main():
    module = AnsibleModule(
        argument_spec={
            **VENV_OPTIONS,
            "requirements": {"type": "list", "elements": "str", "default": []},
            "pins": {"type": "dict", "default": {}},
            "only": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    root, site = module_venv(module)
    try:
        pins = pins_from_requirements(module.params["requirements"])
    except ValueError as err:
        module.fail_json(msg=str(err))
    pins.update({normalize_name(k): str(v) for k, v in module.params["pins"].items()})
    if module.params["only"]:
        wanted = {normalize_name(n) for n in module.params["only"]}
        pins = {k: v for k, v in pins.items() if k in wanted}
    installed = installed_versions(site)
    violations = check(pins, installed)
    result = {
        "pins": pins,
        "installed": {name: installed.get(name) for name in pins},
        "violations": violations,
    }
    if violations:
        module.fail_json(
            msg=f"ABI guard: {root} no longer has the versions its spec pins: "
            + "; ".join(describe(violations))
            + ". A dependency resolved later replaced them: install it with --no-deps, or add a constraint.",
            **result,
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
