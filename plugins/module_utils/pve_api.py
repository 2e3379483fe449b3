"""Connecting to the Proxmox VE API through proxmoxer, and saying what a refusal means.

Shared by our Ansible modules: one argument spec for the connection (credentials with ``no_log`` and an
environment fallback), one way to connect (TLS verified by default, a timeout above proxmoxer's 5 s), and
one translation of PVE's errors into messages that say what to do, above all for the settings PVE keeps
for ``root@pam`` (a container's ``devN``, a VM's raw ``hostpciN``).
"""

from __future__ import annotations

import re

try:
    from proxmoxer import ProxmoxAPI, ResourceException

    HAS_PROXMOXER = True
    PROXMOXER_ERROR = None
except ImportError as exc:  # the module reports it through missing_required_lib
    ProxmoxAPI = ResourceException = None
    HAS_PROXMOXER = False
    PROXMOXER_ERROR = exc

ROOT_ONLY = re.compile(r"only (allowed )?for root@pam|only root can|root@pam only", re.I)


def connection_spec(env_fallback):
    """The connection options every module of ours takes (community.proxmox's names)."""
    return dict(
        api_backend=dict(type="str", choices=["https", "local"], default="https"),
        api_host=dict(type="str", default="localhost", fallback=(env_fallback, ["PROXMOX_HOST"])),
        api_port=dict(type="int", default=8006),
        api_user=dict(type="str", default="root@pam", fallback=(env_fallback, ["PROXMOX_USER"])),
        api_password=dict(type="str", no_log=True, fallback=(env_fallback, ["PROXMOX_PASSWORD"])),
        api_token_id=dict(type="str", fallback=(env_fallback, ["PROXMOX_TOKEN_ID"])),
        api_token_secret=dict(type="str", no_log=True, fallback=(env_fallback, ["PROXMOX_TOKEN_SECRET"])),
        validate_certs=dict(type="bool", default=True),
        ca_path=dict(type="path"),
        api_timeout=dict(type="int", default=30),
    )


def who(params):
    """How the API sees us: root@pam, root@pam!token, or pvesh as root."""
    if params["api_backend"] == "local":
        return "pvesh on the node (root@pam)"
    if params.get("api_token_id"):
        return f"the API token {params['api_user']}!{params['api_token_id']}"
    return params["api_user"]


def connect(params):
    """A ProxmoxAPI for the parameters; raises what proxmoxer raises."""
    if params["api_backend"] == "local":
        return ProxmoxAPI(backend="local", service="PVE")
    verify = params.get("ca_path") or params["validate_certs"]
    kwargs = dict(
        port=params["api_port"],
        user=params["api_user"],
        verify_ssl=verify,
        timeout=params["api_timeout"],
        service="PVE",
    )
    if params.get("api_token_id"):
        kwargs.update(token_name=params["api_token_id"], token_value=params["api_token_secret"])
    else:
        kwargs["password"] = params["api_password"]
    return ProxmoxAPI(params["api_host"], backend="https", **kwargs)


def error_text(exc):
    """PVE's own words from a ResourceException (message plus per-field errors) or any other exception."""
    if ResourceException is not None and isinstance(exc, ResourceException):
        parts = [str(exc.status_message or "").strip(), str(exc.content or "").strip()]
        errors = getattr(exc, "errors", None)
        if errors:
            parts.append("; ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
        return " - ".join(p for p in parts if p)
    return str(exc)


def status_code(exc):
    return getattr(exc, "status_code", None)


def explain(exc, params, what, setting="this setting"):
    """A message for a failed call: PVE's words, and for root@pam-only settings why and what to do instead.

    setting names what PVE keeps for root@pam, for example "a container's devN entries".
    """
    text = error_text(exc)
    if status_code(exc) == 403 and ROOT_ONLY.search(text):
        token = (
            " An API token acts as root@pam!<name>, never as root@pam, even without privilege separation."
            if params.get("api_token_id")
            else ""
        )
        return (
            f"{what}: PVE refused it ({text}). PVE lets only root@pam set {setting}, and the call came from "
            f"{who(params)}.{token} Use api_user root@pam with api_password (keep it in Ansible Vault), or run "
            f"the module on the node with api_backend: local (pvesh as root)."
        )
    return f"{what}: {text}"
