"""The benchmark client against the stand-in server, and the report with the ceiling next to it."""

import importlib.util
import json
import subprocess
import sys

import pytest
import yaml
from inference_refdata import MODELS, REFERENCE, ROOT
from localhost import free_port, wait_listening

from inferhost.sim import ENGINE_DIR

STANDIN = ENGINE_DIR / "openai_standin.py"
CLIENT = ROOT / "scripts/inference-bench.py"
REPORT = ROOT / "scripts/inference-bench-report.py"


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def server(tmp_path):
    port = free_port()
    # A key with a quote, escaped as in a systemd environment file: the client reads it as the modules do.
    key_file = tmp_path / "secret.env"
    key_file.write_text('INFERHOST_API_KEY="k\\"3y"\n')
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "serve", "/m/Bench", "--port", str(port), "--api-key", 'k"3y'],
        stdout=subprocess.DEVNULL,
        env={"STANDIN_TOKEN_LATENCY": "0.001", "STANDIN_TTFT": "0.01", "PATH": "/usr/bin:/bin"},
    )
    wait_listening(port)
    yield f"http://127.0.0.1:{port}", key_file
    proc.kill()
    proc.wait()


def sweep(url, key_file, out, levels="1,2,4"):
    argv = [sys.executable, str(CLIENT), "--url", url, "--model", "Bench", "--key-file", str(key_file)]
    argv += ["--concurrency", levels, "--rounds", "2", "--input-tokens", "8", "--output-tokens", "12"]
    argv += ["--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    return done, json.loads(out.read_text()) if out.exists() else None


def test_sweep_measures_every_level(server, tmp_path):
    url, key_file = server
    done, result = sweep(url, key_file, tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 2, 4]
    for level in result["levels"]:
        assert level["requests"] == level["ok"] == 2 * level["concurrency"]
        assert level["errors"] == 0
        assert level["output_tokens"] == 12 * level["requests"]
        assert level["output_tok_s"] > 0
        assert level["ttft_ms"]["p50"] > 0 and level["tpot_ms"]["p50"] > 0
        assert level["ttft_ms"]["p50"] <= level["ttft_ms"]["p99"]
    assert "c=4:" in done.stderr


def test_run_by_hand_the_client_sweeps_as_the_playbook_does():
    play = yaml.safe_load((ROOT / "playbooks/benchmark.yml").read_text())[0]["vars"]
    assert play["benchmark_concurrency"] == [2**n for n in range(11)], "the reference deployment's 1 to 1024"
    assert play["benchmark_input_tokens"] == play["benchmark_output_tokens"] == 1000
    defaults = load(CLIENT, "inference_bench").arguments().parse_args(["--url", "u", "--model", "m"])
    assert defaults.concurrency == ",".join(str(c) for c in play["benchmark_concurrency"])
    assert (defaults.rounds, defaults.input_tokens, defaults.output_tokens, defaults.timeout) == (
        play["benchmark_rounds"],
        play["benchmark_input_tokens"],
        play["benchmark_output_tokens"],
        play["benchmark_request_timeout"],
    )


def test_wrong_key_is_counted_as_errors(server, tmp_path):
    url, _ = server
    bad = tmp_path / "bad.env"
    bad.write_text("INFERHOST_API_KEY=nope\n")
    argv = [sys.executable, str(CLIENT), "--url", url, "--model", "Bench", "--key-file", str(bad), "--warmup", "0"]
    argv += ["--concurrency", "2", "--rounds", "1", "--output-tokens", "4", "--out", str(tmp_path / "r.json")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    result = json.loads((tmp_path / "r.json").read_text())
    assert done.returncode == 1
    assert result["levels"][0]["errors"] == 2 and "Unauthorized" in result["levels"][0]["error_samples"][0]


def test_report_puts_the_ceiling_next_to_the_measurement(server, tmp_path, services, hardware):
    url, key_file = server
    _, result = sweep(url, key_file, tmp_path / "r.json", levels="1,2")
    (tmp_path / "service.json").write_text(json.dumps(services["minimax-m25"]))
    (tmp_path / "hardware.json").write_text(json.dumps(hardware))
    config = MODELS / REFERENCE["minimax-m25"] / "config.json"
    argv = [sys.executable, str(REPORT), str(tmp_path / "r.json"), "--out-dir", str(tmp_path / "out")]
    argv += ["--name", "minimax", "--service", str(tmp_path / "service.json")]
    argv += ["--hardware", str(tmp_path / "hardware.json"), "--config", str(config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out/minimax.json").read_text())
    assert report["ceiling"]["tokens_per_s"] == 247.8
    measured = result["levels"][0]["request_tok_s_median"]
    assert report["ratio"] == {
        "measured_tok_s": measured,
        "ceiling_tok_s": 247.8,
        "ratio": round(measured / 247.8, 3),
    }
    table = (tmp_path / "out/minimax.md").read_text()
    assert "| concurrency | requests | errors | output tok/s |" in table
    assert "| **ceiling** | **247.8 tok/s** |" in table
    assert f"| **measured / ceiling** | **{report['ratio']['ratio']}** |" in table
    assert (tmp_path / "out/minimax.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_model_facts_says_why_there_is_no_ceiling(tmp_path):
    report_mod = load(REPORT, "inference_bench_report")
    result = {
        "model": "M",
        "started": "now",
        "input_tokens": 1,
        "output_tokens": 2,
        "rounds": 1,
        "url": "u",
        "levels": [{"concurrency": 1, "requests": 1, "errors": 0, "output_tok_s": 5, "request_tok_s_median": 6}],
    }
    report = report_mod.build(result, {"name": "s", "model": {"path": "/m"}, "gpus": [0]}, {}, {})
    assert report["ceiling"] is None
    assert "No ceiling: no model facts or hardware profile given." in report_mod.markdown(report)
