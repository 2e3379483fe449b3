"""The SGLang launcher: the API key goes from the environment to SGLang in-process, never on a command line."""

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from inference_refdata import ROLE
from localhost import free_port

from inferhost.sim import ENGINE_DIR

LAUNCHER = ROLE / "files/inferhost-sglang-launch"
STANDIN = ENGINE_DIR / "openai_standin.py"
KEY = "s3cret-k3y"

# A stand-in "sglang.launch_server" that reports what it was given, and logs its arguments the way SGLang
# logs its ServerArgs (key included).
PROBE = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="log: %(message)s", force=True)
if __name__ == "__main__":
    logging.getLogger("sglang.srt.entrypoints.engine").info(f"server_args=ServerArgs(argv={sys.argv[1:]!r})")
    with open("/proc/self/cmdline", "rb") as handle:
        cmdline = handle.read().split(b"\\0")
    expected = os.environ.get("EXPECTED_KEY", "")
    print(json.dumps({
        "argv0": sys.argv[0],
        "tail_is_key": sys.argv[-2:] == ["--api-key", expected],
        "has_api_key_flag": "--api-key" in sys.argv,
        "model": sys.argv[sys.argv.index("--model-path") + 1],
        "key_in_cmdline": any(expected.encode() in part for part in cmdline) if expected else False,
        "key_in_environment": "INFERHOST_API_KEY" in os.environ,
    }))
"""


def fake_sglang(tmp_path, launch_server):
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(launch_server)
    return tmp_path


def launch(site, *argv, key=None):
    env = {k: v for k, v in os.environ.items() if k != "INFERHOST_API_KEY"}
    env["PYTHONPATH"] = str(site)
    if key is not None:
        env["INFERHOST_API_KEY"] = key
        env["EXPECTED_KEY"] = key  # the probe compares; this one is not what the launcher reads
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *argv], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def report(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_key_reaches_sglang_in_process_and_not_its_command_line(tmp_path):
    proc = launch(fake_sglang(tmp_path, PROBE), "--model-path", "/m/Q", "--tp-size", "8", key=KEY)
    assert proc.returncode == 0, proc.stderr
    seen = report(proc)
    assert seen["tail_is_key"] and seen["model"] == "/m/Q"
    assert seen["argv0"].endswith("sglang/launch_server.py")  # run as `python -m sglang.launch_server` would
    assert not seen["key_in_cmdline"]  # /proc/<pid>/cmdline, what every user reads
    assert not seen["key_in_environment"]  # the engine's own processes do not inherit it


def test_log_records_hide_the_key(tmp_path):
    proc = launch(fake_sglang(tmp_path, PROBE), "--model-path", "/m/Q", key=KEY)
    log = [line for line in proc.stdout.splitlines() if line.startswith("log: ")]
    assert log and "'--api-key', '<hidden>'" in log[0]
    assert KEY not in proc.stdout + proc.stderr


def test_without_a_key_sglang_gets_no_key_flag(tmp_path):
    proc = launch(fake_sglang(tmp_path, PROBE), "--model-path", "/m/Q")
    assert proc.returncode == 0, proc.stderr
    assert not report(proc)["has_api_key_flag"]


@pytest.mark.parametrize("flag", [["--api-key", "x"], ["--api-key=x"]])
def test_a_key_on_the_command_line_is_refused(tmp_path, flag):
    proc = launch(fake_sglang(tmp_path, PROBE), "--model-path", "/m/Q", *flag, key=KEY)
    assert proc.returncode == 2
    assert "refusing --api-key on the command line" in proc.stderr
    assert proc.stdout == ""  # SGLang never ran


def get(url, key=None):
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def wait_healthy(url, proc):
    for _ in range(500):
        assert proc.poll() is None, "the stand-in exited"
        with contextlib.suppress(OSError):
            if get(url) == 200:
                return
        time.sleep(0.02)
    raise AssertionError("the stand-in never became ready")


def test_the_standin_engine_behind_the_launcher_requires_the_key(tmp_path):
    """The launcher in front of the stand-in SGLang, as molecule runs it: the key is enforced, never logged."""
    runner = f"import sys\nsys.path.insert(0, {str(STANDIN.parent)!r})\nimport openai_standin\n"
    runner += "if __name__ == '__main__':\n    sys.exit(openai_standin.main())\n"
    site = fake_sglang(tmp_path, runner)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    env.update(PYTHONPATH=str(site), INFERHOST_API_KEY=KEY)
    argv = [sys.executable, str(LAUNCHER), "--model-path", "/m/S", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        assert get(f"http://127.0.0.1:{port}/v1/models") == 401
        assert get(f"http://127.0.0.1:{port}/v1/models", KEY) == 200
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0]
    assert "server_args=" in output and "<hidden>" in output
    assert KEY not in output
