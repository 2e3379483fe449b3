#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.source_build import buildjob

DOCUMENTATION = r"""
module: source_build_wait
short_description: Follow a source build - wait a while, then report its status, elapsed time and log tail
description:
  - Waits up to O(wait) seconds for the build in O(job_dir) to end, then returns. Called in a loop by the
    role, each return shows progress; a play that lost its connection attaches to a running build the same way.
  - A build whose process is gone without having written its result is reported as C(lost).
  - With O(name_dir) instead of O(job_dir), follows the build of that name that runs now, whatever its key
    (C(idle) when none runs). The checkout and build directory belong to the name, so a play waits for it
    before it touches them.
  - Read-only; runs the same in check mode.
options:
  job_dir:
    description: The cache directory of the key. One of O(job_dir) and O(name_dir) is required.
    type: path
  name_dir:
    description: The cache directory of the build name (C(<cache>/<name>)), to follow whichever key of it is building.
    type: path
  start_grace:
    description:
      - Seconds during which a build with no trace yet is taken as starting (status C(starting), not done)
        rather than absent. The role passes the time left of a grace period that begins when it starts the
        detached build, which may not have taken its lock by the first poll.
    type: int
    default: 0
  wait:
    description: Seconds to wait for the end of the build before reporting.
    type: int
    default: 60
  lines:
    description: Lines of the log to return.
    type: int
    default: 15
extends_documentation_fragment:
  - attributes.read_only
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Follow the build
  source_build_wait:
    job_dir: "{{ plan.job_dir }}"
    wait: 60
  register: progress

- name: Follow the build of flash-attn that runs now, if any
  source_build_wait:
    name_dir: /var/cache/inferhost/wheels/flash-attn
    wait: 60
"""

RETURN = r"""
status:
  description:
    - running, cached (finished with its wheel), failed, lost or absent.
    - starting while a build with no trace yet is within O(start_grace).
    - idle when O(name_dir) has no build running.
  returned: always
  type: str
key:
  description: The key of the build followed (O(name_dir) only; null when idle).
  returned: with name_dir
  type: str
done:
  description: False while the build runs.
  returned: always
  type: bool
elapsed_human:
  description: Time since the build started (or its duration), like C(1h02m03s).
  returned: always
  type: str
tail:
  description: The last lines of the build log.
  returned: always
  type: list
  elements: str
log:
  description: Path of the build log.
  returned: always
  type: str
"""


def main():
    module = AnsibleModule(
        argument_spec={
            "job_dir": {"type": "path"},
            "name_dir": {"type": "path"},
            "wait": {"type": "int", "default": 60},
            "lines": {"type": "int", "default": 15},
            "start_grace": {"type": "int", "default": 0},
        },
        mutually_exclusive=[("job_dir", "name_dir")],
        required_one_of=[("job_dir", "name_dir")],
        supports_check_mode=True,
    )
    p = module.params
    if p["name_dir"]:
        report = buildjob.wait_name(p["name_dir"], p["wait"], lines=p["lines"])
    else:
        report = buildjob.wait(p["job_dir"], p["wait"], lines=p["lines"], start_grace_s=p["start_grace"])
    module.exit_json(changed=False, **report)


if __name__ == "__main__":
    main()
