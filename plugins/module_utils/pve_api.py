"""The Proxmox VE API client, on proxmoxer: login, TLS and its errors, retries, task waiting.

Everything of ours that talks to the API goes through it: the Ansible modules (``pve_guest_gpu_config``,
``pve_api_login``) as ``ansible.module_utils.pve_api``; gpu-switch (``gpu_switch/pve.py``), which imports it
from beside its package (the ``gpu_switch`` role installs this file next to it on the host); the lab and the
tests. It imports nothing from Ansible, and proxmoxer and requests only where they are installed: a module
reports a missing proxmoxer itself (``HAS_PROXMOXER``), the client as an ApiError.

- Login: a password (PVE hands out a ticket) or an API token over HTTPS, or ``pvesh`` on the node as root
  (``local``). PVE lets only ``root@pam`` set a container's ``devN`` and a VM's raw ``hostpciN``, and a token
  is never ``root@pam``: ``explain`` says so when PVE refuses.
- TLS: verified unless switched off, against a CA file or the system CAs. A missing CA file and a failed
  verification are not a flaky network: no retry, and the message names the setting to fix.
- Retries: the login and every read are repeated on network errors only, backing off. A config write is
  repeated only after a read shows it did not happen, a power action only after the guest's status shows it
  did not (the digest still guards a repeated write against other writers).
- Tasks: waited for with our own deadline by polling their status (proxmoxer's blocking wait returns None
  when it gives up, which must never pass for success); any exit status other than OK is a failure.
- Every HTTP request has a timeout (default 30 s; proxmoxer's own 5 s is too short on a loaded host).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

try:
    import requests
except ImportError:  # pragma: no cover - proxmoxer depends on it
    requests = None
try:
    from proxmoxer import ProxmoxAPI, ResourceException

    HAS_PROXMOXER = True
    PROXMOXER_ERROR = None
except ImportError as exc:  # pragma: no cover - hosts get python3-proxmoxer from the roles
    ProxmoxAPI = ResourceException = None
    HAS_PROXMOXER = False
    PROXMOXER_ERROR = exc

KINDS = {"lxc": "CT", "qemu": "VM"}
ROOT_ONLY = re.compile(r"only (allowed )?for root@pam|only root can|root@pam only", re.I)


def label(kind: str, vmid: int) -> str:
    """A guest as messages name it: CT 101, VM 201."""
    return f"{KINDS[kind]} {vmid}"


def quorum(rows: list[dict], node: str | None = None) -> tuple[bool, str]:
    """Whether /cluster/status (rows) shows a quorate cluster with node online, and in words what it shows.

    A node outside any cluster has no row of type cluster and counts as quorate: it needs nobody's vote.
    """
    cluster = next((r for r in rows if r.get("type") == "cluster"), None)
    nodes = [r for r in rows if r.get("type") == "node"]
    online = sorted(str(r.get("name")) for r in nodes if str(r.get("online", "1")) in ("1", "True", "true"))
    offline = sorted(str(r.get("name")) for r in nodes if str(r.get("name")) not in online)
    mine = next((r for r in nodes if r.get("name") == node), None) if node else None
    if node and mine is None and nodes:
        return False, f"node {node} is not in the cluster's status (nodes: {', '.join(sorted(online + offline))})"
    if mine is not None and str(mine.get("name")) in offline:
        return False, f"node {node} is offline in the cluster's status"
    if cluster is None:
        return True, "a single node outside any cluster (quorate by itself)"
    quorate = str(cluster.get("quorate", "0")) in ("1", "True", "true")
    detail = (
        f"cluster {cluster.get('name', '?')} {'quorate' if quorate else 'NOT quorate'}: "
        f"{len(online)} of {len(nodes)} nodes online" + (f" (offline: {', '.join(offline)})" if offline else "")
    )
    return quorate, detail


class ApiError(Exception):
    """The API refused a request or could not be reached. reason: what failed and why; status: the HTTP status
    of a refusal; text (set by the client): PVE's or the network's own words, without what was being done."""

    def __init__(self, reason: str, status: int | None = None):
        super().__init__(reason)
        self.reason, self.status = reason, status


class TaskFailed(ApiError):
    """A task ended with an exit status other than OK, or did not end in time."""

    def __init__(self, reason: str, upid: str | None = None, exitstatus: str | None = None):
        super().__init__(reason)
        self.upid, self.exitstatus = upid, exitstatus


@dataclass(frozen=True)
class Login:
    """Where the API is and who logs in: secret is the password, or the token's secret when token_name is set.

    ca_setting names the setting that ca_file comes from, as the messages about it say it.
    """

    host: str = "127.0.0.1"
    port: int = 8006
    user: str = "root@pam"
    secret: str | None = field(default=None, repr=False)
    token_name: str | None = None
    verify_ssl: bool = True
    ca_file: str | None = None
    timeout: float = 30.0
    backend: str = "https"
    ca_setting: str = "ca_file"

    @classmethod
    def from_params(cls, params: dict) -> Login:
        """The login that a module's connection options (connection_spec) describe. A CA file is used even when
        validate_certs is off: naming one asks for verification."""
        token = params.get("api_token_id")
        return cls(
            host=params["api_host"],
            port=params["api_port"],
            user=params["api_user"],
            secret=params.get("api_token_secret") if token else params.get("api_password"),
            token_name=token,
            verify_ssl=bool(params["validate_certs"] or params.get("ca_path")),
            ca_file=params.get("ca_path"),
            timeout=params["api_timeout"],
            backend=params["api_backend"],
            ca_setting="ca_path",
        )

    @property
    def identity(self) -> str:
        """The user, or user!token."""
        return f"{self.user}!{self.token_name}" if self.token_name else self.user

    @property
    def who(self) -> str:
        """How the API sees us: root@pam, the API token root@pam!name, or pvesh as root."""
        if self.backend == "local":
            return "pvesh on the node (root@pam)"
        if self.token_name:
            return f"the API token {self.identity}"
        return self.user

    @property
    def verify(self) -> bool | str:
        """proxmoxer's verify_ssl: the CA file, True for the system CAs, or False."""
        return (self.ca_file or True) if self.verify_ssl else False


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
        context=dict(type="str", default=""),
    )


# What every module of ours that logs in passes to AnsibleModule beside its argument spec: one way to log in.
MODULE_OPTIONS = {
    "supports_check_mode": True,
    "required_together": [("api_token_id", "api_token_secret")],
    "mutually_exclusive": [("api_password", "api_token_id")],
}


def check_login_params(module, what=""):
    """Fail before any API call: proxmoxer missing, or no secret to log in with over https. ``what`` says what the
    module needs the login for; the message starts with the module's context, when it has one."""
    if not HAS_PROXMOXER:
        module.fail_json(msg=module_missing_lib(), exception=str(PROXMOXER_ERROR))
    p = module.params
    if p["api_backend"] == "https" and not (p["api_password"] or p["api_token_id"]):
        prefix = f"{p['context']}: " if p.get("context") else ""
        module.fail_json(
            msg=f"{prefix}api_password (or api_token_id and api_token_secret) is needed to log in to the PVE API "
            f"over https{what}"
        )


def module_missing_lib() -> str:
    """Ansible's words for the missing client library."""
    from ansible.module_utils.basic import missing_required_lib  # noqa: PLC0415 - only on this path

    return missing_required_lib("proxmoxer")


def log_in_or_fail(module, client, login, variable="", advice=""):
    """Log in before any change; a refusal fails the module naming the login (and the inventory variable the
    password comes from, when given), with nothing changed."""
    try:
        client.log_in()
    except Exception as exc:  # noqa: BLE001 - login failures become a message
        named = f"{variable}: " if variable else ""
        module.fail_json(
            msg=f"{named}could not log in to the PVE API at {login.host}:{login.port} as {login.who}: "
            f"{error_text(exc)}. Nothing was changed{advice}."
        )


def error_text(exc: BaseException) -> str:
    """PVE's own words for a failure: a refusal's message, reason and per-field errors, or the exception's text.
    For the client's ApiError, the words it kept from what it caught (without what it was doing)."""
    text = getattr(exc, "text", None)
    if text is not None:
        return text
    if ResourceException is not None and isinstance(exc, ResourceException):
        parts = [str(exc.status_message or "").strip(), str(exc.content or "").strip()]
        errors = getattr(exc, "errors", None)
        if errors:
            parts.append("; ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
        return " - ".join(p for p in parts if p)
    return str(exc)


def status_code(exc: BaseException) -> int | None:
    """The HTTP status of a refusal (proxmoxer's status_code, the client's status), or None."""
    return getattr(exc, "status_code", None) or getattr(exc, "status", None)


def explain(exc: BaseException, login: Login, what: str, setting: str = "this setting") -> str:
    """A message for a failed call: PVE's words, and for root@pam-only settings why and what to do instead.

    setting names what PVE keeps for root@pam, for example "a container's devN entries".
    """
    text = error_text(exc)
    # PVE refuses a permission as 403, and a raw hostpciN from anyone but root@pam as 500 (a plain die).
    if status_code(exc) in (403, 500) and ROOT_ONLY.search(text):
        token = (
            " An API token acts as root@pam!<name>, never as root@pam, even without privilege separation."
            if login.token_name
            else ""
        )
        return (
            f"{what}: PVE refused it ({text}). PVE lets only root@pam set {setting}, and the call came from "
            f"{login.who}.{token} Use api_user root@pam with api_password (keep it in Ansible Vault), or run "
            f"the module on the node with api_backend: local (pvesh as root)."
        )
    return f"{what}: {text}"


def _network_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    if requests is not None:
        errors.append(requests.exceptions.RequestException)
    return tuple(errors)


def _describe(exc: BaseException) -> str:
    """The first line of an exception's text (its type when it has none), at most 300 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:300]


class Client:
    """The API for one node, logged in on first use. Raises api_error and task_failed (ApiError and TaskFailed
    here; a caller with its own error classes of the same signatures sets them in a subclass).

    Seams: factory builds the proxmoxer object instead of a login (tests pass a stand-in); clock and sleep
    measure and pass the time of retries and task waits; attempts bounds the retries; poll is the longest
    pause between two reads of a task's status.
    """

    api_error: type[ApiError] = ApiError
    task_failed: type[TaskFailed] = TaskFailed

    def __init__(
        self,
        login: Login,
        node: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        attempts: int = 5,
        factory: Callable | None = None,
        poll: float = 1.0,
    ):
        self.login, self.node = login, node
        self.clock, self.sleep, self.attempts, self.poll = clock, sleep, attempts, poll
        self._factory = factory
        self._api = None
        self._network = _network_errors()

    # ------------------------------------------------------------ plumbing

    def connect(self):
        """A new proxmoxer object (which logs in over HTTPS at once). Raises what proxmoxer raises, or api_error
        when proxmoxer or the CA file is missing."""
        if self._factory is not None:
            return self._factory()
        if ProxmoxAPI is None:  # pragma: no cover
            raise self._failure("the Python proxmoxer module is missing (apt install python3-proxmoxer)")
        login = self.login
        if login.backend == "local":
            return ProxmoxAPI(backend="local", service="PVE")
        if login.verify_ssl and login.ca_file and not os.path.isfile(login.ca_file):
            raise self._failure(
                f"{login.ca_setting} {login.ca_file} does not exist: point it at the CA of the API certificate "
                "(PVE's own: /etc/pve/pve-root-ca.pem), or leave it empty for the system CAs"
            )
        auth = (
            {"token_name": login.token_name, "token_value": login.secret}
            if login.token_name
            else {"password": login.secret}
        )
        return ProxmoxAPI(
            login.host,
            port=login.port,
            user=login.user,
            verify_ssl=login.verify,
            timeout=login.timeout,
            service="PVE",
            **auth,
        )

    def log_in(self):
        """The proxmoxer object, logging in first if not yet done (retried on network errors)."""
        if self._api is None:
            self._api = self._retry("log in", self.connect)
        return self._api

    @property
    def api(self):
        return self.log_in()

    def forget_login(self) -> None:
        """Log in again on the next call (after the API went away, as during the node's reboot)."""
        self._api = None

    def _failure(self, reason: str, status: int | None = None, text: str | None = None) -> ApiError:
        error = self.api_error(reason, status)
        error.text = reason if text is None else text
        return error

    def _error(self, what: str, exc: BaseException) -> ApiError:
        """A failure that is not the network's: PVE's refusal (with its HTTP status), a refused login, or other."""
        status = getattr(exc, "status_code", None)
        content = getattr(exc, "content", None) or getattr(exc, "status_message", None)
        if status is not None:
            reason = f"{what}: {content or _describe(exc)} (HTTP {status})"
        elif type(exc).__name__ == "AuthenticationError":
            reason = f"{what}: Proxmox refused the login of {self.login.identity}"
        else:
            reason = f"{what}: {_describe(exc)}"
        return self._failure(reason, status, error_text(exc))

    def _unreachable(self, what: str, exc: BaseException, detail: str) -> ApiError:
        text = f"{detail} ({_describe(exc)})"
        return self._failure(f"{what}: {text}", text=text)

    def _tls_error(self, what: str, exc: BaseException) -> ApiError | None:
        """A certificate problem is not a flaky network: no retry, and say what to fix."""
        if requests is not None and isinstance(exc, requests.exceptions.SSLError):
            login = self.login
            where = f"the CA in {login.ca_file}" if login.ca_file else f"the system CAs (set {login.ca_setting})"
            return self._unreachable(what, exc, f"TLS verification of {login.host}:{login.port} against {where} failed")
        return None

    def _retry(self, what: str, fn: Callable):
        """Call fn, retrying on network errors only (for reads, which are safe to repeat)."""
        delay = 0.5
        for attempt in range(self.attempts):
            try:
                return fn()
            except self._network as exc:
                tls = self._tls_error(what, exc)
                if tls:
                    raise tls from None
                if attempt + 1 == self.attempts:
                    where = f"{self.login.host}:{self.login.port}"
                    detail = f"Proxmox API at {where} unreachable after {self.attempts} attempts"
                    raise self._unreachable(what, exc, detail) from None
                self.sleep(delay)
                delay = min(delay * 2, 5.0)
            except (ApiError, self.api_error):
                raise
            except Exception as exc:  # noqa: BLE001 - proxmoxer raises ResourceException and others
                raise self._error(what, exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _guest(self, kind: str, vmid: int):
        return getattr(self.api.nodes(self.node), kind)(vmid)

    # --------------------------------------------------------------- reads

    def version(self) -> dict:
        return dict(self._retry("read the API version", self.api.version.get) or {})

    def resources(self, kind: str) -> list[dict]:
        """The cluster's resources of one type (vm: every guest, with its type and node)."""
        what = f"list the cluster's {kind} resources"
        return list(self._retry(what, lambda: self.api.cluster.resources.get(type=kind)) or [])

    def status(self, kind: str, vmid: int) -> str:
        data = self._retry(f"read the status of {label(kind, vmid)}", self._guest(kind, vmid).status.current.get)
        return str((data or {}).get("status", "unknown"))

    def config(self, kind: str, vmid: int) -> dict:
        return dict(self._retry(f"read the config of {label(kind, vmid)}", self._guest(kind, vmid).config.get) or {})

    def pending(self, kind: str, vmid: int) -> list[dict]:
        """The guest's config as rows of key, value, pending value and delete flag (GET .../pending)."""
        return list(
            self._retry(f"read the pending changes of {label(kind, vmid)}", self._guest(kind, vmid).pending.get) or []
        )

    def storage(self, storage: str) -> dict:
        return dict(self._retry(f"read storage {storage}", self.api.storage(storage).get) or {})

    def set_storage_content(self, storage: str, content: str, digest: str | None = None) -> None:
        data = {"content": content, **({"digest": digest} if digest else {})}
        try:
            self.api.storage(storage).put(**data)
        except Exception as exc:  # noqa: BLE001
            raise self._error(f"allow snippets on storage {storage}", exc) from None

    def cluster_status(self) -> list[dict]:
        """GET /cluster/status: one row of type cluster (absent on a node outside any cluster), one per node."""
        return list(self._retry("read the cluster's status", self.api.cluster.status.get) or [])

    def pci_mappings(self) -> list[dict]:
        """The cluster's PCI resource mappings the login may see: [{'id', 'map': [entry strings], ...}]."""
        return list(self._retry("list the cluster's PCI mappings", self.api.cluster.mapping.pci.get) or [])

    def pci_mapping(self, mapping_id: str) -> dict:
        """One PCI mapping with the digest of the mappings' file (for a guarded update)."""
        what = f"read PCI mapping {mapping_id}"
        return dict(self._retry(what, self.api.cluster.mapping.pci(mapping_id).get) or {})

    def create_pci_mapping(self, mapping_id: str, entries: list[str], description: str | None = None) -> None:
        data = {"id": mapping_id, "map": list(entries), **({"description": description} if description else {})}
        try:
            self.api.cluster.mapping.pci.post(**data)
        except Exception as exc:  # noqa: BLE001
            raise self._error(f"create PCI mapping {mapping_id}", exc) from None

    def set_pci_mapping(self, mapping_id: str, entries: list[str], digest: str | None = None) -> None:
        """Replace the mapping's entries (every node's); the digest refuses it if the file changed meanwhile."""
        data = {"map": list(entries), **({"digest": digest} if digest else {})}
        try:
            self.api.cluster.mapping.pci(mapping_id).put(**data)
        except Exception as exc:  # noqa: BLE001
            raise self._error(f"update PCI mapping {mapping_id}", exc) from None

    def task_status(self, upid: str) -> dict:
        return dict(self._retry(f"read task {upid}", self.api.nodes(self.node).tasks(upid).status.get) or {})

    # -------------------------------------------------------------- writes

    def set_config(
        self, kind: str, vmid: int, values: dict, delete: list[str] | None = None, digest: str | None = None
    ) -> None:
        """PUT the config (synchronous for both kinds). After a network error the config is read again: if the
        change is there, done; if not, the PUT is repeated (the digest still guards against other writers)."""
        data = dict(values)
        if delete:
            data["delete"] = ",".join(delete)
        if digest:
            data["digest"] = digest
        what = f"update the config of {label(kind, vmid)}"
        for attempt in range(self.attempts):
            try:
                self._guest(kind, vmid).config.put(**data)
                return
            except self._network as exc:
                tls = self._tls_error(what, exc)
                if tls:
                    raise tls from None
                now = self.config(kind, vmid)
                applied = all(str(now.get(k)) == str(v) for k, v in values.items())
                if applied and not any(k in now for k in delete or []):
                    return
                if attempt + 1 == self.attempts:
                    raise self._unreachable(what, exc, "Proxmox API unreachable") from None
                self.sleep(min(0.5 * 2**attempt, 5.0))
            except Exception as exc:  # noqa: BLE001
                raise self._error(what, exc) from None

    def post(self, kind: str, vmid: int, action: str, **params) -> str:
        """POST status/<action>; returns the task's UPID. Network errors propagate as they are."""
        what = f"{action} {label(kind, vmid)}"
        try:
            upid = getattr(self._guest(kind, vmid).status, action).post(**params)
        except self._network:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error(what, exc) from None
        if not isinstance(upid, str) or not upid.startswith("UPID:"):
            raise self._failure(f"{what}: Proxmox answered {upid!r} instead of a task id")
        return upid

    def wait(self, upid: str, timeout: float, what: str) -> dict:
        """Wait for the task to stop; task_failed if it does not within timeout or ends other than OK."""
        deadline = self.clock() + timeout
        delay = min(self.poll, 0.2)
        while True:
            status = self.task_status(upid)
            if status.get("status") == "stopped":
                exitstatus = status.get("exitstatus")
                if exitstatus != "OK":
                    raise self.task_failed(f"{what}: task failed: {exitstatus or 'no exit status'}", upid, exitstatus)
                return status
            if self.clock() >= deadline:
                self.cancel(upid)
                raise self.task_failed(
                    f"{what}: task still running after {timeout:g} s (asked Proxmox to stop it)", upid, None
                )
            self.sleep(delay)
            delay = min(delay * 2, self.poll)

    def cancel(self, upid: str) -> None:
        """Best effort: stop a task we no longer wait for (DELETE /nodes/{node}/tasks/{upid})."""
        with contextlib.suppress(Exception):
            self.api.nodes(self.node).tasks(upid).delete()

    def act(self, kind: str, vmid: int, action: str, want: str, wait_timeout: float, **params) -> None:
        """Run a power action and wait for it; after a network error, look before trying again."""
        what = f"{action} {label(kind, vmid)}"
        for attempt in range(self.attempts):
            try:
                upid = self.post(kind, vmid, action, **params)
            except self._network as exc:
                tls = self._tls_error(what, exc)
                if tls:
                    raise tls from None
                if self.status(kind, vmid) == want:
                    return
                if attempt + 1 == self.attempts:
                    raise self._unreachable(what, exc, "Proxmox API unreachable") from None
                self.sleep(min(0.5 * 2**attempt, 5.0))
                continue
            self.wait(upid, wait_timeout, what)
            return
