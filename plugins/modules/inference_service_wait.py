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
  - Served means a one-token completion came back too (O(complete)), since a dead engine answers C(/health) for a
    while. Completions that fail O(confirm) times in a row while the service says it is healthy fail the wait.
  - Fails at once when the unit has failed or stays inactive, and after O(timeout); and, naming the engine's last log
    line before it, when systemd restarted the unit on its own during the wait (its C(NRestarts) grew), instead of
    waiting through the next load.
  - In check mode it probes once and reports, without waiting.
  - With O(group), a service across several nodes, every node of the group runs this task at the same time (one
    fork each, so the play's forks must be at least the number of nodes, and no C(--limit) may leave one out). The
    head's wait is ready only when every rank's unit is active and a one-token completion through the head comes
    back (C(/health) answers 200 for a while after a rank died). When a rank's unit fails or stays inactive, or
    completions fail while C(/health) says ok, it stops every rank (the head first; each stop returns once the
    unit's GPUs are free) and starts them again, the ranks above 0 first and the head last. The other nodes'
    waits carry out these stops and starts on their own units and end with the head's result. The waits talk
    through a file on the controller (O(board_dir)).
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
  group:
    description:
      - The service's group, as M(inference_service_plan) returns it (C(group)) - C(service), C(nodes) (inventory
        hostnames in rank order, the head first) and this node's C(rank). O(url) is needed on rank 0 only.
    type: dict
  max_restarts:
    description: Restarts of the whole group before the wait gives up (with O(group)).
    type: int
    default: 2
  confirm:
    description:
      - Completions that must fail in a row, C(/health) saying ok, before the wait fails (one node) or the group is
        restarted (with O(group)). A failed unit restarts the group at once.
    type: int
    default: 2
  join_timeout:
    description: Seconds the waits of the group's nodes may take to find each other (with O(group)).
    type: int
    default: 300
  complete:
    description:
      - Ask a one-token completion once the service answers ready, and count it served only when it comes back
        (one node; a group's head always asks). C(false) for a caller that asks its own (C(validate.yml)).
    type: bool
    default: true
  board_dir:
    description: Directory on the controller for the file the group's waits share; default the temporary directory.
    type: path
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

- name: Wait until the group of ranks across nodes serves (every node of the group runs this task)
  inference_service_wait:
    url: http://127.0.0.1:8000
    model: MiniMax-M2.5
    unit: inference-minimax-m25.service
    group: {service: minimax-m25, nodes: [inference-ct, inference-ct2], rank: 0}
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
  returned: unless group is given
  type: str
restarts:
  description: Why the group was restarted, one entry per restart.
  returned: when group is given
  type: list
  elements: str
"""
