"""Talking to an OpenAI-compatible service from the guest: the API key file and plain JSON requests.

Standard library only. The key is read on the guest from the unit's root-only environment file, so it
never travels through Ansible. scripts/inference-bench.py reads its key file with read_key too: it runs
without Ansible, and playbooks/benchmark.yml copies this file to the guest with it.
"""

from __future__ import annotations

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


def request(url, key=None, body=None, timeout=5):
    """GET (or POST ``body`` as JSON); returns (HTTP status, parsed JSON or None).

    HTTP errors come back as their status; a connection that fails comes back as a text, so a caller can
    tell "still loading, port closed" from "answered 503".
    """
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            raw = response.read()
            try:
                return response.status, json.loads(raw or b"null")
            except ValueError:
                return response.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError) as exc:
        return f"no answer: {getattr(exc, 'reason', exc)}", None
