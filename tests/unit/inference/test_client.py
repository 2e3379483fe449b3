"""The guest-side client of an OpenAI-compatible service: the key file, and readiness (the probe's and the guard's)."""

import subprocess
import sys
import time

import pytest
from inference.client import listed_models, read_key, readiness
from localhost import free_port, wait_listening

from inferhost.sim import ENGINE_DIR


@pytest.fixture
def served():
    port = free_port()
    argv = [sys.executable, str(ENGINE_DIR / "openai_standin.py"), "serve", "/m/Served", "--port", str(port)]
    proc = subprocess.Popen([*argv, "--api-key", "k1", "--load-delay", "1"], stdout=subprocess.DEVNULL)
    wait_listening(port)
    yield f"http://127.0.0.1:{port}/"
    proc.kill()
    proc.wait()


def test_ready_only_once_health_answers_and_the_model_is_listed(served):
    assert readiness(served, "Served", "k1") == {"health": 503, "models_status": 503, "models": [], "ready": False}
    for _ in range(100):
        state = readiness(served, "Served", "k1")
        if state["ready"]:
            break
        time.sleep(0.1)
    assert state == {"health": 200, "models_status": 200, "models": ["Served"], "ready": True}
    assert readiness(served, "Other", "k1")["ready"] is False
    assert readiness(served, "Served") == {"health": 200, "models_status": 401, "models": [], "ready": False}


def test_a_closed_port_is_not_ready():
    state = readiness(f"http://127.0.0.1:{free_port()}", "x", timeout=2)
    assert str(state["health"]).startswith("no answer:") and str(state["models_status"]).startswith("no answer:")
    assert state["ready"] is False


@pytest.mark.parametrize(
    ("body", "models"),
    [
        ({"data": [{"id": "a"}, {"id": "b"}]}, ["a", "b"]),
        ({"data": [{"id": "a"}, "junk"]}, ["a"]),
        ({"data": None}, []),
        ([{"id": "a"}], []),
        (None, []),
    ],
)
def test_listed_models(body, models):
    assert listed_models(body) == models


def test_read_key_unquotes_and_ignores_other_lines(tmp_path):
    secret = tmp_path / "s.secret.env"
    secret.write_text('# managed\nOTHER=1\nINFERHOST_API_KEY="k\\"ey"\n')
    assert read_key(str(secret)) == 'k"ey'
    secret.write_text("INFERHOST_API_KEY=\n")
    assert read_key(str(secret)) is None
    assert read_key(str(tmp_path / "absent")) is None and read_key(None) is None
