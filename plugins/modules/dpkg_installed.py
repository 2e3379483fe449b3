#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
"""Which of a list of apt package specifications dpkg has installed as specified, and which it has not.

The action apt_present (plugins/action/apt_present.py) asks this module first and calls ansible.builtin.apt
only when something is missing: asking dpkg takes a fraction of a second, while apt opens its whole cache
(two to four seconds a call) even when every package is already there.
"""

from __future__ import annotations

import fnmatch
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: dpkg_installed
short_description: Tell which apt package specifications dpkg has installed as specified
description:
  - Asks dpkg about the packages of O(name) and returns the specifications it does not find installed at a
    version that they match. It installs nothing; M(apt_present) calls it before it calls apt.
  - A specification is C(name), C(name=version) (the exact version) or C(name=version*) (a version that
    begins so), optionally with C(:architecture) after the name. Anything else (a version comparison, a
    path to a C(.deb)) is always reported missing, for apt to read.
  - A package counts as installed only when dpkg lists it as fully installed. Half-installed, unpacked or
    removed packages (only their configuration files left) are missing.
options:
  name:
    description: Package specifications, as M(ansible.builtin.apt) takes them.
    type: list
    elements: str
    required: true
extends_documentation_fragment:
  - attributes.read_only
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Ask dpkg whether the driver is installed at the version
  dpkg_installed:
    name: [libnvidia-compute-590=590.48.01*, nvidia-utils-590=590.48.01*]
  register: __driver_installed
"""

RETURN = r"""
missing:
  description: The specifications that dpkg did not find installed as specified.
  returned: always
  type: list
  elements: str
installed:
  description: The installed version of each package asked about and found installed.
  returned: always
  type: dict
held:
  description: The packages asked about that dpkg's selections hold (C(apt-mark hold)), installed or not.
  returned: always
  type: list
  elements: str
"""

# name, then an optional :arch, then an optional =version (a trailing * makes it a prefix).
SPEC = re.compile(r"^(?P<name>[a-z0-9][a-z0-9+.-]+)(?::(?P<arch>[a-z0-9-]+))?(?:=(?P<version>[^=<>\s]+))?$")
FIELDS = "${Package}\t${Architecture}\t${Version}\t${db:Status-Abbrev}\n"


def parse_spec(spec):
    """(name, arch, version) of a specification, or None for one only apt understands."""
    found = SPEC.match(spec.strip())
    if not found:
        return None
    return found.group("name"), found.group("arch"), found.group("version")


def parse_dpkg(output):
    """dpkg-query's lines: name -> [(arch, version)] of the fully installed packages only."""
    installed = {}
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) != 4:
            continue
        name, arch, version, status = parts
        # Status-Abbrev: wanted state, current state, error flag; "ii " and "hi " are installed and sound.
        if status[1:2] == "i" and status[2:3] in ("", " "):
            installed.setdefault(name, []).append((arch, version))
    return installed


def parse_held(output):
    """dpkg-query's lines: the names whose wanted state is hold (Status-Abbrev "h.."), sorted."""
    rows = (line.split("\t") for line in output.splitlines())
    return sorted({parts[0] for parts in rows if len(parts) == 4 and parts[3][:1] == "h"})


def version_matches(found, wanted):
    """apt's reading of name=version: the exact version, or with a trailing * a pattern."""
    if wanted is None:
        return True
    if wanted.endswith("*"):
        return fnmatch.fnmatchcase(found, wanted)
    return found == wanted


def satisfied(parsed, installed):
    if parsed is None:
        return False
    name, arch, version = parsed
    return any(
        version_matches(found_version, version)
        for found_arch, found_version in installed.get(name, [])
        if not arch or found_arch in (arch, "all")
    )


def missing_specs(specs, installed):
    return [spec for spec in specs if not satisfied(parse_spec(spec), installed)]


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "list", "elements": "str", "required": True},
        },
        supports_check_mode=True,
    )
    specs = [spec for spec in module.params["name"] if spec.strip()]
    names = sorted({parsed[0] for parsed in map(parse_spec, specs) if parsed})
    output = ""
    if names:
        # rc 1 only says that some name is unknown to dpkg: those are missing, the rest is on stdout.
        rc, output, err = module.run_command(["dpkg-query", "-W", "-f", FIELDS, *names])
        if rc not in (0, 1):
            module.fail_json(msg=f"dpkg-query failed (rc {rc}): {err.strip()}")
    installed = parse_dpkg(output)
    module.exit_json(
        changed=False,
        missing=missing_specs(specs, installed),
        installed={name: versions[0][1] for name, versions in installed.items()},
        held=parse_held(output),
    )


if __name__ == "__main__":
    main()
