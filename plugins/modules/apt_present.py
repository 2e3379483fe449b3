#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
# Documentation only: the work is done on the controller by plugins/action/apt_present.py, which asks
# dpkg_installed on the target and calls ansible.builtin.apt only when something is missing. Without the
# action plugin this file runs as a module that prints nothing, and the task fails.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_present
short_description: Install Debian packages with apt, asking dpkg first so that a run with nothing to install is quick
description:
  - The packages of O(name) are installed as M(ansible.builtin.apt) with C(state=present) installs them.
  - M(dpkg_installed) is asked first. When every package is installed at a version that its specification
    matches, the task reports no change and apt is not called; apt opens its whole cache on every call, two
    to four seconds even when there is nothing to do. Otherwise M(ansible.builtin.apt) is called with the
    whole list and the options below, and its result is the task's result.
  - Specifications as M(dpkg_installed) reads them; anything it cannot read goes to apt.
options:
  name:
    description: The packages to install, each C(name), C(name=version) or C(name=version*), as apt takes them.
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
  hold:
    description:
      - Packages of O(name) to hold once installed (dpkg's selection C(hold), as C(apt-mark hold) sets it), so
        that no upgrade moves them. The dpkg query tells which are held already; only the others are changed,
        with M(ansible.builtin.dpkg_selections). A name that O(name) does not install is refused.
    type: list
    elements: str
    default: []
  source_hint:
    description:
      - A sentence added to the failure when no configured apt source provides a package (apt knows no package of
        that name, or one without an installation candidate), such as which role adds its repository.
    type: str
attributes:
  action:
    support: full
  check_mode:
    description:
      - Asks dpkg in either mode; when something is missing, M(ansible.builtin.apt)'s check mode.
      - A package apt does not know (no configured source provides it) is, in check mode only, reported as one
        the run would install (changed, RV(unknown) naming it) instead of failing the task; on a fresh guest its
        repository is added by an earlier task, which a check run does not do. A real run fails on it.
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
unknown:
  description: In check mode, the name or pattern that apt knows no package for (apt stops at the first).
  returned: in check mode, when apt knows no package of O(name)
  type: list
  elements: str
missing:
  description: The specifications that dpkg did not find installed as specified; empty when apt was not called.
  returned: always
  type: list
  elements: str
held:
  description: The packages of O(hold) that this run held (in check mode, would hold); empty when all were held.
  returned: unless the task failed
  type: list
  elements: str
"""
