"""The Proxmox API through proxmoxer: guest status and config, power actions, task waiting.

Every task is waited for with our own timeout and its exit status checked: proxmoxer's blocking wait
returns None on a timeout, which must never pass for success. Reads are retried on network errors;
power actions are not blindly repeated: after a network error the guest's status is read again first.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from .config import ProxmoxConfig
from .errors import ApiError, TaskFailed

try:
    import requests
except ImportError:  # pragma: no cover - proxmoxer depends on it
    requests = None
try:
    from proxmoxer import ProxmoxAPI
except ImportError:  # pragma: no cover - the role installs python3-proxmoxer
    ProxmoxAPI = None

KINDS = {"lxc": "CT", "qemu": "VM"}


def label(kind: str, vmid: int) -> str:
    return f"{KINDS[kind]} {vmid}"


def _network_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    if requests is not None:
        errors.append(requests.exceptions.RequestException)
    return tuple(errors)


class PveApi:
    """A thin, testable client. ``factory`` builds the proxmoxer object (tests may pass their own)."""

    def __init__(
        self,
        proxmox: ProxmoxConfig,
        secret: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        attempts: int = 5,
        factory=None,
        poll: float = 1.0,
    ):
        self.cfg, self._secret = proxmox, secret
        self.clock, self.sleep, self.attempts, self.poll = clock, sleep, attempts, poll
        self._factory = factory
        self._api = None
        self._network = _network_errors()

    # ------------------------------------------------------------ plumbing

    def _connect(self):
        if self._factory is not None:
            return self._factory()
        if ProxmoxAPI is None:  # pragma: no cover
            raise ApiError("the Python proxmoxer module is missing (apt install python3-proxmoxer)")
        if self.cfg.verify_ssl and self.cfg.ca_file and not os.path.isfile(self.cfg.ca_file):
            raise ApiError(
                f"proxmox.ca_file {self.cfg.ca_file} does not exist: point it at the CA of the API certificate "
                "(PVE's own: /etc/pve/pve-root-ca.pem), or leave it empty for the system CAs"
            )
        verify = (self.cfg.ca_file or True) if self.cfg.verify_ssl else False
        auth = (
            {"token_name": self.cfg.token_name, "token_value": self._secret}
            if self.cfg.token_name
            else {"password": self._secret}
        )
        return ProxmoxAPI(
            self.cfg.host, port=self.cfg.port, user=self.cfg.user, verify_ssl=verify, timeout=self.cfg.timeout, **auth
        )

    @property
    def api(self):
        if self._api is None:
            self._api = self._retry("log in", self._connect)
        return self._api

    def _describe(self, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return text[:300]

    def _error(self, what: str, exc: BaseException) -> ApiError:
        status = getattr(exc, "status_code", None)
        content = getattr(exc, "content", None) or getattr(exc, "status_message", None)
        if status is not None:
            reason = f"{what}: {content or self._describe(exc)} (HTTP {status})"
        elif type(exc).__name__ == "AuthenticationError":
            reason = f"{what}: Proxmox refused the login of {self.cfg.identity}"
        else:
            reason = f"{what}: {self._describe(exc)}"
        return ApiError(reason, status)

    def _tls_error(self, what: str, exc: BaseException) -> ApiError | None:
        """A certificate problem is not a flaky network: no retry, and say what to fix."""
        if requests is not None and isinstance(exc, requests.exceptions.SSLError):
            where = f"the CA in {self.cfg.ca_file}" if self.cfg.ca_file else "the system CAs (set proxmox.ca_file)"
            return ApiError(
                f"{what}: TLS verification of {self.cfg.host}:{self.cfg.port} against {where} failed "
                f"({self._describe(exc)})"
            )
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
                    raise ApiError(
                        f"{what}: Proxmox API at {self.cfg.host}:{self.cfg.port} unreachable "
                        f"after {self.attempts} attempts ({self._describe(exc)})"
                    ) from None
                self.sleep(delay)
                delay = min(delay * 2, 5.0)
            except ApiError:
                raise
            except Exception as exc:  # noqa: BLE001 - proxmoxer raises ResourceException and others
                raise self._error(what, exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _guest(self, kind: str, vmid: int):
        return getattr(self.api.nodes(self.cfg.node), kind)(vmid)

    # --------------------------------------------------------------- reads

    def status(self, kind: str, vmid: int) -> str:
        data = self._retry(f"read the status of {label(kind, vmid)}", self._guest(kind, vmid).status.current.get)
        return str((data or {}).get("status", "unknown"))

    def config(self, kind: str, vmid: int) -> dict:
        return dict(self._retry(f"read the config of {label(kind, vmid)}", self._guest(kind, vmid).config.get) or {})

    def storage(self, storage: str) -> dict:
        return dict(self._retry(f"read storage {storage}", self.api.storage(storage).get) or {})

    def set_storage_content(self, storage: str, content: str, digest: str | None = None) -> None:
        data = {"content": content, **({"digest": digest} if digest else {})}
        try:
            self.api.storage(storage).put(**data)
        except Exception as exc:  # noqa: BLE001
            raise self._error(f"allow snippets on storage {storage}", exc) from None

    def task_status(self, upid: str) -> dict:
        return dict(self._retry(f"read task {upid}", self.api.nodes(self.cfg.node).tasks(upid).status.get) or {})

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
                    raise ApiError(f"{what}: Proxmox API unreachable ({self._describe(exc)})") from None
                self.sleep(min(0.5 * 2**attempt, 5.0))
            except Exception as exc:  # noqa: BLE001
                raise self._error(what, exc) from None

    def post(self, kind: str, vmid: int, action: str, **params) -> str:
        """POST status/<action>; returns the task's UPID. Network errors propagate as ConnectionError."""
        what = f"{action} {label(kind, vmid)}"
        try:
            upid = getattr(self._guest(kind, vmid).status, action).post(**params)
        except self._network:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error(what, exc) from None
        if not isinstance(upid, str) or not upid.startswith("UPID:"):
            raise ApiError(f"{what}: Proxmox answered {upid!r} instead of a task id")
        return upid

    def wait(self, upid: str, timeout: float, what: str) -> dict:
        """Wait for the task to stop; TaskFailed if it does not within timeout or ends other than OK."""
        deadline = self.clock() + timeout
        delay = min(self.poll, 0.2)
        while True:
            status = self.task_status(upid)
            if status.get("status") == "stopped":
                exitstatus = status.get("exitstatus")
                if exitstatus != "OK":
                    raise TaskFailed(f"{what}: task failed: {exitstatus or 'no exit status'}", upid, exitstatus)
                return status
            if self.clock() >= deadline:
                self.cancel(upid)
                raise TaskFailed(
                    f"{what}: task still running after {timeout:g} s (asked Proxmox to stop it)", upid, None
                )
            self.sleep(delay)
            delay = min(delay * 2, self.poll)

    def cancel(self, upid: str) -> None:
        """Best effort: stop a task we no longer wait for (DELETE /nodes/{node}/tasks/{upid})."""
        with contextlib.suppress(Exception):
            self.api.nodes(self.cfg.node).tasks(upid).delete()

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
                    raise ApiError(f"{what}: Proxmox API unreachable ({self._describe(exc)})") from None
                self.sleep(min(0.5 * 2**attempt, 5.0))
                continue
            self.wait(upid, wait_timeout, what)
            return
