#!/usr/bin/python
# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib
from ansible.module_utils.pve_api import HAS_PROXMOXER, PROXMOXER_ERROR, Client, Login, connection_spec, error_text

DOCUMENTATION = r"""
module: pve_api_login
short_description: Try the Proxmox VE API login before a role stores or uses the credentials
description:
  - Logs in to the PVE API with the given credentials and reads the API version, nothing else.
  - A refused login fails naming O(variable), the inventory variable the password comes from, so that a wrong
    password is refused before it is written anywhere (gpu-switch's password file) or used for a change (role
    pve_api runs it before the roles that use the API).
  - With O(api_backend=local) (pvesh on the node) there is no login to try; it returns at once.
  - Read-only; runs the same in check mode.
options:
  variable:
    description: The name of the variable that holds the password (or token), for the message.
    type: str
    required: true
extends_documentation_fragment:
  - pve_api
  - attributes.read_only
author: inferhost contributors
"""

EXAMPLES = r"""
- name: Try the Proxmox login before storing the password
  pve_api_login:
    variable: pve_api_password
    api_host: 127.0.0.1
    api_user: root@pam
    api_password: "{{ pve_api_password }}"
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
    login = Login.from_params(p)
    where = f"https://{login.host}:{login.port}"
    if not (p["api_password"] or p["api_token_id"]):
        module.fail_json(msg=f"{p['variable']} is empty: {login.who} cannot log in to the Proxmox API at {where}.")
    try:
        version = Client(login).version()
    except Exception as exc:  # noqa: BLE001 - any failed login becomes the message
        module.fail_json(
            msg=f"{p['variable']}: {login.who} could not log in to the Proxmox API at {where} ({error_text(exc)}). "
            f"Nothing was stored or changed with it. Set the right password in the inventory variable it comes from "
            f"({p['variable']}; in inventory/example, vault_proxmox_password in the vault file) and run again."
        )
    module.exit_json(changed=False, version=str(version.get("version", "")))


if __name__ == "__main__":
    main()
