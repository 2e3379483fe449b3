#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import time

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible.module_utils.pve_api import (
    MODULE_OPTIONS,
    ApiError,
    Client,
    Login,
    check_login_params,
    connection_spec,
    quorum,
)

DOCUMENTATION = r"""
---
module: pve_cluster_quorum
short_description: Wait until a Proxmox VE node sees its cluster quorate and itself online
description:
  - Reads C(GET /cluster/status) through the node's API until the row of type C(cluster) says C(quorate) and the
    node's own row says C(online), or O(timeout) seconds have passed (then it fails, saying what it saw last).
  - A node outside any cluster has no row of type C(cluster) and counts as quorate.
  - An API that does not answer yet (a node that has just booted) or refuses with an error is asked again until
    O(timeout); the failure names the last error.
  - Reads only: the same in check mode.
version_added: "0.1.0"
author: inferhost contributors
options:
  node:
    description: The node whose view of the cluster is asked for, and which must be online in it.
    type: str
    required: true
  timeout:
    description: Seconds to wait for quorum.
    type: int
    default: 600
  interval:
    description: Seconds between two reads.
    type: int
    default: 5
extends_documentation_fragment:
  - pve_api
attributes:
  check_mode:
    support: full
    details: Reads only, as in a real run.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Wait for the cluster's quorum after pve1's reboot
  pve_cluster_quorum:
    api_password: "{{ vault_proxmox_password }}"
    ca_path: /etc/pve/pve-root-ca.pem
    node: pve1
    timeout: 900
"""

RETURN = r"""
quorate:
  description: Whether the cluster is quorate with the node online (always true on success).
  returned: success
  type: bool
status:
  description: What the cluster's status showed last, in words.
  returned: always
  type: str
  sample: "cluster lab quorate: 3 of 3 nodes online"
reads:
  description: How many times the status was read (the first read included).
  returned: success
  type: int
msg:
  description: The node and what it sees.
  returned: always
  type: str
"""


def module_args():
    return dict(
        node=dict(type="str", required=True),
        timeout=dict(type="int", default=600),
        interval=dict(type="int", default=5),
    )


def wait_for_quorum(client, node: str, timeout: float, interval: float, *, clock=time.monotonic, sleep=time.sleep):
    """(quorate, what was seen last, reads): read /cluster/status until quorate with node online, or timeout.

    An API error (none answering yet, a login refused while the node starts) is what was seen, and is read again.
    """
    deadline = clock() + timeout
    reads = 0
    while True:
        reads += 1
        try:
            ok, seen = quorum(client.cluster_status(), node)
        except ApiError as exc:
            ok, seen = False, f"the API did not answer: {exc.reason}"
            client.forget_login()
        if ok or clock() >= deadline:
            return ok, seen, reads
        sleep(interval)


def main():
    module = AnsibleModule(argument_spec={**connection_spec(env_fallback), **module_args()}, **MODULE_OPTIONS)
    p = module.params
    prefix = f"{p['context']}: " if p["context"] else ""
    for name, low in (("timeout", 0), ("interval", 1)):
        if p[name] < low:
            module.fail_json(msg=f"{prefix}{name} is {p[name]}; expected a number of seconds of at least {low}")
    check_login_params(module)
    client = Client(Login.from_params(p), p["node"])
    ok, seen, reads = wait_for_quorum(client, p["node"], p["timeout"], p["interval"])
    if not ok:
        module.fail_json(
            msg=f"{prefix}{p['node']}: no quorum within {p['timeout']} s; last seen: {seen}. Nothing after this "
            "step ran: bring the cluster's other nodes back (pvecm status on a node shows the votes), then run the "
            "play again",
            status=seen,
        )
    module.exit_json(changed=False, quorate=True, status=seen, reads=reads, msg=f"{p['node']}: {seen}")


if __name__ == "__main__":
    main()
