# Copyright: inferhost contributors
# Apache License 2.0 (see LICENSE)
"""The Proxmox VE API connection options, as plugins/module_utils/pve_api.py's connection_spec() takes them."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  api_backend:
    description: C(https) talks to O(api_host); C(local) runs C(pvesh) on the node itself, as root (root@pam).
    type: str
    choices: [https, local]
    default: https
  api_host:
    description: The PVE API host (env C(PROXMOX_HOST)).
    type: str
    default: localhost
  api_port:
    description: The PVE API port.
    type: int
    default: 8006
  api_user:
    description: User to log in as, such as C(root@pam) (env C(PROXMOX_USER)).
    type: str
    default: root@pam
  api_password:
    description: The user's password (env C(PROXMOX_PASSWORD)); keep it in Ansible Vault.
    type: str
  api_token_id:
    description: Name of an API token of O(api_user), instead of a password (env C(PROXMOX_TOKEN_ID)).
    type: str
  api_token_secret:
    description: The token's secret (env C(PROXMOX_TOKEN_SECRET)).
    type: str
  validate_certs:
    description: Verify the API's TLS certificate.
    type: bool
    default: true
  ca_path:
    description: CA file to verify the certificate with (on a node, C(/etc/pve/pve-root-ca.pem)).
    type: path
  api_timeout:
    description: Seconds an API call may take (proxmoxer's own default, 5, is too short for a loaded host).
    type: int
    default: 30
  context:
    description:
      - Prefix of error messages, naming what asked for the call (the inventory variable that described it, or the
        host being maintained), so that a refusal names what to fix.
    type: str
    default: ""
notes:
  - The login and every read are repeated on network errors (five attempts, backing off); a write lost on the network
    is repeated only after a read shows that it did not happen. A missing O(ca_path) file and a failed TLS verification
    fail at once, naming the option.
requirements:
  - proxmoxer >= 2.0
"""
