# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
"""Check and diff mode as our modules support them, one variant per kind of module.

A module names its kind with ``extends_documentation_fragment: [attributes.read_only]`` (or ``attributes.edit``);
a module with its own details (gpu_switch, source_build_job) writes its attributes out instead.
"""

from __future__ import annotations


class ModuleDocFragment:
    # A module that reads and reports: it runs the same in check mode and has nothing to show as a diff.
    READ_ONLY = r"""
attributes:
  check_mode:
    description: Runs the same in check mode; it changes nothing in either mode.
    support: full
  diff_mode:
    description: Returns no diff, having changed nothing.
    support: none
"""

    # A module that edits one thing in place: check mode reports the change without making it, and the
    # change is returned as a diff.
    EDIT = r"""
attributes:
  check_mode:
    description: Reports the change it would make, and makes none.
    support: full
  diff_mode:
    description: Returns the change as a before/after diff (shown with C(--diff)).
    support: full
"""
