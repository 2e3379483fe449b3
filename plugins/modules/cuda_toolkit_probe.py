#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
"""What each installed CUDA toolkit says it is: the version its version.json records and the release its nvcc
reports, for every toolkit in one call (a slurp and a command a toolkit cost four round trips for two)."""

from __future__ import annotations

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: cuda_toolkit_probe
short_description: Read the version of each CUDA toolkit installed side by side
description:
  - For each X.Y of O(versions), reads C(<prefix>/cuda-X.Y/version.json) and runs C(<prefix>/cuda-X.Y/bin/nvcc
    --version), and says what is wrong with the toolkit in RV(problems). Changes nothing.
  - A toolkit is sound when its version.json records a version X.Y or X.Y.Z and its nvcc reports release X.Y.
  - With O(alternative), also reads the alternatives group of that name as dpkg keeps it (where its link points
    now, and the priority of each registered path), so that the caller asks update-alternatives only when
    something differs.
options:
  versions:
    description: The toolkits, as X.Y.
    type: list
    elements: str
    required: true
  prefix:
    description: The directory that holds C(cuda-X.Y) for each toolkit.
    type: path
    default: /usr/local
  alternative:
    description: The alternatives group to read into RV(alternative); none when empty.
    type: str
    default: ""
  admin_dir:
    description: Where dpkg keeps the alternatives groups (update-alternatives' C(--admindir)).
    type: path
    default: /var/lib/dpkg/alternatives
  alt_dir:
    description: Where the alternatives' links are (update-alternatives' C(--altdir)).
    type: path
    default: /etc/alternatives
extends_documentation_fragment:
  - attributes.read_only
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Read what each toolkit says it is
  cuda_toolkit_probe:
    versions: ["12.8", "13.0"]
  register: __toolkits
"""

RETURN = r"""
toolkits:
  description:
    - One entry a toolkit, in the order of O(versions), with C(version), C(path), C(recorded) (the version
      that version.json records, or null) and C(nvcc) (the release nvcc reports, or null).
  returned: always
  type: list
  elements: dict
  sample: [{version: "12.8", path: /usr/local/cuda-12.8, recorded: "12.8.1", nvcc: "12.8"}]
problems:
  description: One sentence for each toolkit that is not the version it is installed as; empty when all are.
  returned: always
  type: list
  elements: str
alternative:
  description:
    - The group of O(alternative), with C(value) (the path its link points to now, null when none) and
      C(priorities) (the priority of each registered path). Empty when O(alternative) is empty.
  returned: always
  type: dict
  sample: {value: /usr/local/cuda-13.0, priorities: {/usr/local/cuda-12.8: 128, /usr/local/cuda-13.0: 130}}
"""

RELEASE = re.compile(r"release (\d+\.\d+),")


def recorded_version(path):
    """(version, None) from a toolkit's version.json, or (None, why not)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None, f"{path} is missing"
    except (OSError, ValueError) as err:
        return None, f"{path} cannot be read ({err})"
    version = (data.get("cuda") or {}).get("version") if isinstance(data, dict) else None
    if not isinstance(version, str):
        return None, f"{path} records no cuda version"
    return version, None


def records(version, recorded):
    """Whether a version.json's X.Y.Z is toolkit X.Y."""
    return recorded == version or recorded.startswith(version + ".")


def parse_alternatives(text):
    """A dpkg alternatives group file: {path: priority}. After the mode and the link come the secondary links,
    two lines each, up to an empty line; then each path, its priority and one line per secondary link."""
    lines = text.splitlines()
    end = lines.index("", 2) if "" in lines[2:] else len(lines)
    secondaries = (end - 2) // 2
    priorities, index = {}, end + 1
    while index + 1 < len(lines) and lines[index]:
        path, priority = lines[index], lines[index + 1]
        if not priority.lstrip("-").isdigit():
            break
        priorities[path] = int(priority)
        index += 2 + secondaries
    return priorities


def read_alternative(name, admin_dir, alt_dir):
    if not name:
        return {}
    try:
        with open(os.path.join(admin_dir, name), encoding="utf-8") as handle:
            priorities = parse_alternatives(handle.read())
    except OSError:
        priorities = {}
    link = os.path.join(alt_dir, name)
    return {"value": os.readlink(link) if os.path.islink(link) else None, "priorities": priorities}


def probe_toolkit(module, prefix, version):
    path = os.path.join(prefix, f"cuda-{version}")
    found = {"version": version, "path": path, "recorded": None, "nvcc": None}
    problems = []
    found["recorded"], why = recorded_version(os.path.join(path, "version.json"))
    if why:
        problems.append(why)
    elif not records(version, found["recorded"]):
        problems.append(f"{path}/version.json records version {found['recorded']}, not {version}")
    nvcc = os.path.join(path, "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        problems.append(f"{nvcc} is missing")
        return found, problems
    rc, out, err = module.run_command([nvcc, "--version"])
    release = RELEASE.search(out)
    found["nvcc"] = release.group(1) if release else None
    if rc != 0 or found["nvcc"] != version:
        said = (
            f"release {found['nvcc']}"
            if found["nvcc"]
            else f"no release ({(out + err).strip()[-200:] or f'exit {rc}'})"
        )
        problems.append(f"{nvcc} --version reports {said}, not {version}")
    return found, problems


def main():
    module = AnsibleModule(
        argument_spec={
            "versions": {"type": "list", "elements": "str", "required": True},
            "prefix": {"type": "path", "default": "/usr/local"},
            "alternative": {"type": "str", "default": ""},
            "admin_dir": {"type": "path", "default": "/var/lib/dpkg/alternatives"},
            "alt_dir": {"type": "path", "default": "/etc/alternatives"},
        },
        supports_check_mode=True,
    )
    toolkits, problems = [], []
    for version in module.params["versions"]:
        found, wrong = probe_toolkit(module, module.params["prefix"], version)
        toolkits.append(found)
        problems.extend(wrong)
    alternative = read_alternative(module.params["alternative"], module.params["admin_dir"], module.params["alt_dir"])
    module.exit_json(changed=False, toolkits=toolkits, problems=problems, alternative=alternative)


if __name__ == "__main__":
    main()
