"""Talking to an OpenAI-compatible service from the guest: the API key file, plain JSON requests, readiness.

Standard library only. The key is read on the guest from the unit's root-only environment file, so it
never travels through Ansible; the module inference_benchmark reads it with read_key too and hands it to the
engine's benchmark in its environment. The units' GPU guard
(guard.py, installed in the guest by the inference_service role) waits with ``readiness`` as the module
inference_service_probe looks with it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.error
import urllib.request

KEY_VAR = "INFERHOST_API_KEY"


def read_key(path):
    """The API key from an environment file (``INFERHOST_API_KEY="..."``); None when absent or empty."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                name, sep, value = line.strip().partition("=")
                if sep and name == KEY_VAR:
                    value = value.strip()
                    if len(value) >= 2 and value[0] == value[-1] == '"':
                        value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
                    return value or None
    except FileNotFoundError:
        return None
    return None


def exchange(url, key=None, body=None, timeout=5):
    """GET (or POST ``body`` as JSON); returns (HTTP status, the answer's text, its JSON or None).

    Unlike ``request`` it keeps the body of an error answer (the engine's message) and answers that are not
    JSON (``/metrics``). A connection that fails comes back as a text in place of the status, and no body.
    """
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, b""
        with contextlib.suppress(OSError, http.client.HTTPException):  # an error answer cut short
            raw = exc.read()
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        return f"no answer: {getattr(exc, 'reason', exc)}", "", None
    text = raw.decode("utf-8", errors="replace")
    try:
        return status, text, json.loads(raw or b"null")
    except ValueError:
        return status, text, None


def request(url, key=None, body=None, timeout=5):
    """GET (or POST ``body`` as JSON); returns (HTTP status, parsed JSON or None).

    HTTP errors come back as their status (and no body); a connection that fails comes back as a text, so a
    caller can tell "still loading, port closed" from "answered 503".
    """
    status, _text, parsed = exchange(url, key, body, timeout)
    return status, parsed if isinstance(status, int) and 200 <= status < 300 else None


def listed_models(body):
    """The model ids in a /v1/models answer (``{"data": [{"id": ...}, ...]}``); [] for anything else."""
    data = body.get("data") if isinstance(body, dict) else None
    return [m.get("id") for m in data or [] if isinstance(m, dict)]


def readiness(url, model, key=None, timeout=5):
    """One look at the service at ``url``: ready when /health answers 200 and /v1/models lists ``model``.

    Returns health and models_status (as ``request`` gives them), the listed models and ready.
    """
    base = url.rstrip("/")
    health, _ = request(base + "/health", key, timeout=timeout)
    models_status, body = request(base + "/v1/models", key, timeout=timeout)
    models = listed_models(body)
    return {
        "health": health,
        "models_status": models_status,
        "models": models,
        "ready": health == 200 and models_status == 200 and model in models,
    }


def one_token(url, model, key=None, timeout=60):
    """A real completion of one token through the service: what ``/health`` never proves (a group whose rank
    died answers /health for a while after). Returns ``ok`` and, when not ok, ``problem`` (what came back)."""
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
    status, text, reply = exchange(url.rstrip("/") + "/v1/completions", key, body, timeout)
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if status == 200 and choices and isinstance(choices[0], dict) and isinstance(choices[0].get("text"), str):
        return {"ok": True, "problem": ""}
    return {"ok": False, "problem": f"POST /v1/completions answered {status}: {' '.join(str(text).split())[:200]}"}
