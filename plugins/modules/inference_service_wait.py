#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Documentation only: the work is done on the controller by plugins/action/inference_service_wait.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: inference_service_wait
short_description: Wait for an inference service to serve its model, showing progress
description:
  - Probes the service with M(inference_service_probe) until C(/health) answers 200, C(/v1/models) lists the
    model and the unit is active, printing elapsed time, unit state, health and the unit's last log line at
    every probe, instead of waiting silently through a 30-minute model load.
  - Fails at once when the unit has failed or stays inactive, and after O(timeout).
  - In check mode it probes once and reports, without waiting.
version_added: "0.1.0"
author: inferhost contributors
options:
  unit:
    description: The service's systemd unit.
    type: str
    required: true
  timeout:
    description: Seconds to wait in all.
    type: int
    default: 2700
  interval:
    description: Seconds between probes.
    type: int
    default: 10
  grace:
    description: Seconds an inactive unit may take to begin starting.
    type: int
    default: 30
extends_documentation_fragment:
  - inference_client
attributes:
  action:
    support: full
  check_mode:
    support: partial
    details: Probes once and reports, without waiting.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Wait until the model is served
  inference_service_wait:
    url: http://127.0.0.1:8000
    model: Qwen3.5-397B-A17B
    unit: inference-qwen35.service
    timeout: 2700
"""

RETURN = r"""
ready:
  description: Whether the service served the model.
  returned: always
  type: bool
elapsed_s:
  description: Seconds waited.
  returned: always
  type: float
last_log:
  description: The unit's last log line at the last probe.
  returned: always
  type: str
"""
