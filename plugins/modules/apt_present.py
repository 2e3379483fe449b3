#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
"""Which of a list of apt package specifications dpkg has installed, and which it has not.

The task runs through plugins/action/apt_present.py: it calls this module first and M(ansible.builtin.apt)
only when something is missing. Asking dpkg takes a fraction of a second; M(ansible.builtin.apt) opens apt's
whole cache (two to four seconds a call), even when every package is already there.
"""

from __future__ import annotations

import fnmatch
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: apt_present
short_description: Install Debian packages with apt, asking dpkg first so that a run with nothing to install is quick
description:
  - The packages of O(name) are installed as M(ansible.builtin.apt) with C(state=present) installs them.
  - dpkg is asked first. When every package is installed, and at a version that its specification matches,
    the task reports no change and apt is not called. Otherwise M(ansible.builtin.apt) is called with the whole
    list and the options below, and its result is the task's result.
  - A specification is C(name), C(name=version) (the exact version) or C(name=version*) (a version that
    begins so), optionally with C(:architecture) after the name. Anything else (a version comparison, a
    path to a C(.deb)) is always passed to apt.
  - A package counts as installed only when dpkg lists it as fully installed. Half-installed, unpacked or
    removed packages (only their configuration files left) go to apt.
options:
  name:
    description: Package specifications, as M(ansible.builtin.apt) takes them.
    type: list
    elements: str
    required: true
  install_recommends:
    description: Passed to M(ansible.builtin.apt) when it is called.
    type: bool
  allow_change_held_packages:
    description: Passed to M(ansible.builtin.apt) when it is called.
    type: bool
    default: false
  allow_downgrade:
    description: Passed to M(ansible.builtin.apt) when it is called.
    type: bool
    default: false
attributes:
  action:
    support: full
  check_mode:
    description: Asks dpkg in either mode; when something is missing, M(ansible.builtin.apt)'s check mode.
    support: full
  diff_mode:
    description: M(ansible.builtin.apt)'s, when it is called; nothing to show otherwise.
    support: full
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Install the driver at the version
  apt_present:
    name: [libnvidia-compute-590=590.48.01*, nvidia-utils-590=590.48.01*]
    allow_change_held_packages: true
"""

RETURN = r"""
missing:
  description: The specifications that dpkg did not find installed as specified; empty when apt was not called.
  returned: always
  type: list
  elements: str
installed:
  description: The installed version of each package that was asked about and found installed.
  returned: always
  type: dict
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
            "install_recommends": {"type": "bool"},
            "allow_change_held_packages": {"type": "bool", "default": False},
            "allow_downgrade": {"type": "bool", "default": False},
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
    )


if __name__ == "__main__":
    main()
