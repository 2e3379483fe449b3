#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib
from ansible.module_utils.pve_api import HAS_PROXMOXER, PROXMOXER_ERROR, connect, connection_spec, error_text, who

DOCUMENTATION = r"""
module: pve_api_login
short_description: Try the Proxmox VE API login before a role stores or uses the credentials
description:
  - Logs in to the PVE API with the given credentials and reads the API version, nothing else.
  - A refused login fails naming O(variable), the inventory variable the password comes from, so that a wrong
    password is refused before it is written anywhere (gpu-switch's password file) or used for a change.
  - Read-only; runs the same in check mode.
options:
  variable:
    description: The name of the variable that holds the password (or token), for the message.
    type: str
    required: true
  api_backend:
    description: https (default) or local (pvesh on the node; nothing to try).
    type: str
    choices: [https, local]
    default: https
  api_host:
    description: API host.
    type: str
    default: localhost
  api_port:
    description: API port.
    type: int
    default: 8006
  api_user:
    description: User, such as root@pam.
    type: str
    default: root@pam
  api_password:
    description: The password.
    type: str
  api_token_id:
    description: API token name, instead of a password.
    type: str
  api_token_secret:
    description: API token secret.
    type: str
  validate_certs:
    description: Verify the API's TLS certificate.
    type: bool
    default: true
  ca_path:
    description: CA file to verify the certificate with.
    type: path
  api_timeout:
    description: Seconds per API call.
    type: int
    default: 30
requirements: [proxmoxer >= 2.0]
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Try the Proxmox login before storing the password
  pve_api_login:
    variable: gpu_switch_proxmox_password
    api_host: 127.0.0.1
    api_user: root@pam
    api_password: "{{ gpu_switch_proxmox_password }}"
    ca_path: /etc/pve/pve-root-ca.pem
  no_log: true
"""

RETURN = r"""
version:
  description: The PVE version the API reports.
  returned: success
  type: str
  sample: "8.4.1"
"""


def main():
    spec = connection_spec(env_fallback)
    spec["variable"] = dict(type="str", required=True)
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    if p["api_backend"] == "local":
        module.exit_json(changed=False, version="")
    if not HAS_PROXMOXER:
        module.fail_json(msg=missing_required_lib("proxmoxer"), exception=str(PROXMOXER_ERROR))
    where = f"https://{p['api_host']}:{p['api_port']}"
    if not (p["api_password"] or p["api_token_id"]):
        module.fail_json(msg=f"{p['variable']} is empty: {who(p)} cannot log in to the Proxmox API at {where}.")
    try:
        version = connect(p).version.get() or {}
    except Exception as exc:  # noqa: BLE001 - any failed login becomes the message
        module.fail_json(
            msg=f"{p['variable']}: {who(p)} could not log in to the Proxmox API at {where} ({error_text(exc)}). "
            f"Nothing was stored or changed with it. Set the right password in the inventory variable it comes from "
            f"({p['variable']}; in inventory/example, vault_proxmox_password in the vault file) and run again."
        )
    module.exit_json(changed=False, version=str(version.get("version", "")))


if __name__ == "__main__":
    main()
