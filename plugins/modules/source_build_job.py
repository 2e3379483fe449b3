#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.source_build import buildjob

DOCUMENTATION = r"""
module: source_build_job
short_description: Run one source build to its wheel, with a state file, a log file and a lock
description:
  - The body of a long build, meant to be started with C(async) and C(poll=0) so it survives a dropped
    connection; M(source_build_wait) follows it.
  - Writes C(build.log) (the command, its environment, all output) and C(state.json) in O(job_dir);
    on success moves the single wheel the build produced into O(job_dir) with C(build.json) (the key's
    inputs), so a wheel is only ever in the cache complete.
  - Refuses to start while a build of the same name runs, whatever its key (the checkout and build directory
    are the name's); a refused key's C(state.json) says which build runs.
options:
  job_dir:
    description: The cache directory of the key (from M(source_build_plan)).
    type: path
    required: true
  argv:
    description: The build command; C({staging}) is replaced by the directory the wheel must go to.
    type: list
    elements: str
    required: true
  cwd:
    description: Directory to run the build in.
    type: path
    required: true
  environment:
    description: The complete process environment (nothing is inherited).
    type: dict
    required: true
  info:
    description: Data written to C(build.json) with the wheel (key inputs, plan).
    type: dict
    default: {}
  timeout:
    description: Seconds after which the build is stopped and reported failed.
    type: int
    default: 36000
  clean_paths:
    description: Paths relative to O(cwd) removed before the build (stale incremental state).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Start the build, detached from this connection
  source_build_job:
    job_dir: "{{ plan.job_dir }}"
    argv: "{{ plan.argv }}"
    cwd: "{{ plan.cwd }}"
    environment: "{{ plan.environment }}"
  async: 36000
  poll: 0
"""

RETURN = r"""
status:
  description: succeeded or failed.
  returned: always
  type: str
rc:
  description: Exit status of the build (124 after the timeout).
  returned: always
  type: int
wheel:
  description: Path of the cached wheel.
  returned: on success
  type: str
"""


def main():
    module = AnsibleModule(
        argument_spec={
            "job_dir": {"type": "path", "required": True},
            "argv": {"type": "list", "elements": "str", "required": True},
            "cwd": {"type": "path", "required": True},
            "environment": {"type": "dict", "required": True},
            "info": {"type": "dict", "default": {}},
            "timeout": {"type": "int", "default": 36000},
            "clean_paths": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=False,
    )
    p = module.params
    try:
        state = buildjob.run(
            p["job_dir"],
            argv=p["argv"],
            cwd=p["cwd"],
            env={k: str(v) for k, v in p["environment"].items()},
            info=p["info"],
            timeout_s=p["timeout"],
            clean_paths=p["clean_paths"],
        )
    except (buildjob.JobError, OSError) as err:
        module.fail_json(msg=str(err))
    if state["status"] != "succeeded":
        module.fail_json(msg=state.get("reason", "build failed"), **state)
    module.exit_json(changed=True, **state)


if __name__ == "__main__":
    main()
