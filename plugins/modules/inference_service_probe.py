#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import re
import subprocess

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: inference_service_probe
short_description: Probe an inference service once - HTTP health, listed models, unit state, last log line
description:
  - One look at an OpenAI-compatible service on the target, for readiness waits and validation.
  - Reads C(/health) and C(/v1/models); reads the systemd unit's state and its last journal line.
  - The API key is read on the target from the unit's secret environment file, so it never travels.
  - Changes nothing. The action M(inference_service_wait) calls it in a loop and prints progress.
version_added: "0.1.0"
author: inferhost contributors
options:
  unit:
    description: The systemd unit of the service; its state and last log line are reported.
    type: str
  http_timeout:
    description: Seconds per HTTP request.
    type: int
    default: 5
  complete:
    description:
      - Also ask a one-token completion (C(POST /v1/completions)) when the service answers ready; the wait of a
        service across several nodes needs it, as the head's C(/health) answers 200 for a while after a rank died.
    type: bool
    default: false
extends_documentation_fragment:
  - inference_client
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Look at the service once
  inference_service_probe:
    url: http://127.0.0.1:8000
    model: Qwen3.5-397B-A17B
    unit: inference-qwen35.service
    secret_file: /etc/inferhost/services/qwen35.secret.env
  register: __probe
"""

RETURN = r"""
ready:
  description: C(/health) answered 200 and C(/v1/models) lists the model.
  returned: always
  type: bool
health:
  description: HTTP status of C(/health), or the connection error.
  returned: always
  type: raw
models_status:
  description: HTTP status of C(/v1/models), or the connection error.
  returned: always
  type: raw
models:
  description: Model ids listed by C(/v1/models).
  returned: always
  type: list
  elements: str
unit_state:
  description: ActiveState, SubState, Result, NRestarts, MainPID and ExecMainStatus of the unit.
  returned: when unit is given
  type: dict
last_log:
  description: The unit's last journal line that is not an access-log line of a probe.
  returned: when unit is given
  type: str
completion:
  description: The one-token completion, C(ok) and C(problem) (what came back when it failed).
  returned: when complete is true and the service answers ready
  type: dict
"""


PROBE_LINE = re.compile(r'"(GET /(health|v1/models|metrics)|POST /v1/completions) HTTP')


def unit_state(module, unit):
    # No systemd on the machine (a service run by hand, a container without an init): no state, which the wait reads
    # as "?" and judges by the API alone. run_command would fail the module on a missing command.
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return {}, ""
    props = "ActiveState,SubState,Result,NRestarts,MainPID,ExecMainStatus"
    rc, out, err = module.run_command([systemctl, "show", unit, "--property", props])
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if rc == 0 else {}
    try:
        log = subprocess.run(
            ["journalctl", "--unit", unit, "--lines", "40", "--output", "cat", "--no-pager", "--quiet"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        log = []
    # The engine's own progress, not the access-log lines of these very probes.
    useful = [line for line in log if line.strip() and not PROBE_LINE.search(line)]
    return state, (useful or log or [""])[-1].strip()


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "unit": {"type": "str"},
            "secret_file": {"type": "path"},
            "http_timeout": {"type": "int", "default": 5},
            "complete": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    # Imported after argument parsing, so ansible-lint's args rule can validate tasks without our module_utils.
    from ansible.module_utils.inference.client import one_token, read_key, readiness  # noqa: PLC0415

    params = module.params
    key = read_key(params["secret_file"])
    result = {"changed": False, **readiness(params["url"], params["model"], key, timeout=params["http_timeout"])}
    if params["complete"] and result["ready"]:
        result["completion"] = one_token(params["url"], params["model"], key, timeout=max(60, params["http_timeout"]))
    if params["unit"]:
        result["unit_state"], result["last_log"] = unit_state(module, params["unit"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
