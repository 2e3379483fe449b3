"""inference_benchmark: the engine's benchmark run per level, with the key in its environment and hidden in its files.

The service's environment here holds stand-ins for ``bin/vllm`` and ``bin/python -m sglang.bench_serving``: they
record what they were given and write a result shaped as the engine's (the fixtures of tests/unit/inference).
"""

import json
import sys
import time

import pytest
from inference_refdata import BENCH
from module_runner import load_module, run_module

MODULE = load_module("inference_benchmark")
KEY = 'k"3y-of-the-service'

FAKE = """#!{python}
import json, os, subprocess, sys, time
args = sys.argv[1:]
if args[:2] == ["-m", "sglang.bench_serving"]:
    engine, args = "sglang", args[2:]
elif args[:2] == ["bench", "serve"]:
    engine, args = "vllm", args[2:]
else:
    sys.exit("unexpected command line: " + " ".join(sys.argv))
opt = lambda name: args[args.index(name) + 1]
concurrency, prompts = int(opt("--max-concurrency")), int(opt("--num-prompts"))
key = os.environ.get("OPENAI_API_KEY")
seen = {{"argv": sys.argv, "key": key, "pid": os.getpid(), "api_key": "API_KEY" in os.environ}}
with open(os.environ["FAKE_RECORD"], "a") as record:
    record.write(json.dumps(seen) + "\\n")
print("Namespace(model=%r)" % opt("--model"))
print("sending with key", key)  # a careless benchmark: the module must hide it in the log
if os.environ.get("FAKE_EXIT_AT") == str(concurrency):
    sys.exit(3)
if os.environ.get("FAKE_SLEEP_AT") == str(concurrency):  # hangs, as does a helper process it started
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(os.environ["FAKE_RECORD"] + ".helper", "w") as out:
        out.write(str(helper.pid))
    time.sleep(60)
failed = 1 if os.environ.get("FAKE_FAIL_AT") == str(concurrency) else 0
if engine == "vllm":
    result = json.load(open("{bench}/vllm-c4.json"))
    result.update(max_concurrency=concurrency, num_prompts=prompts, completed=prompts - failed, failed=failed)
    with open(os.path.join(opt("--result-dir"), opt("--result-filename")), "w") as out:
        json.dump(result, out)
else:
    result = json.loads(open("{bench}/sglang-c4.jsonl").readline())
    result.update(max_concurrency=concurrency, completed=prompts - failed)
    result["server_info"]["api_key"] = key  # what SGLang's /server_info answers
    with open(opt("--output-file"), "a") as out:
        out.write(json.dumps(result) + "\\n")
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A service environment with both stand-ins, the secret file, and where they record."""
    bin_dir = tmp_path / "venv/bin"
    bin_dir.mkdir(parents=True)
    for name in ("vllm", "python"):
        (bin_dir / name).write_text(FAKE.format(python=sys.executable, bench=BENCH))
        (bin_dir / name).chmod(0o755)
    (tmp_path / "svc.secret.env").write_text('INFERHOST_API_KEY="k\\"3y-of-the-service"\n')
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record.jsonl"))
    return tmp_path


def args(env, engine="vllm", **kw):
    result = {
        "url": "http://127.0.0.1:8000",
        "model": "Served",
        "secret_file": str(env / "svc.secret.env"),
        "service": {"engine": engine, "environment": str(env / "venv"), "model": {"path": "/srv/models/M"}},
        "concurrency": [1, 4],
        "rounds": 2,
        "input_tokens": 128,
        "output_tokens": 64,
        "result_dir": str(env / "results"),
    }
    result.update(kw)
    return result


def records(env):
    path = env / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def running(pid):
    """Alive and not a zombie (a killed orphan waits for whoever reaps it; this machine's init may not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def files_hold(directory, text):
    return [p.name for p in directory.iterdir() if text in p.read_text()]


def test_vllm_runs_once_per_level_with_the_key_in_its_environment_only(env):
    result = run_module(MODULE, args(env))
    assert not result.get("failed"), result.get("msg")
    sweep = result["sweep"]
    assert (sweep["engine"], sweep["tool"], sweep["api"], sweep["rounds"]) == (
        "vllm",
        "vllm bench serve",
        "completions",
        2,
    )
    assert [(r["concurrency"], r["requests"], r["file"], r["log"]) for r in sweep["runs"]] == [
        (1, 2, "vllm-c1.json", "vllm-c1.log"),
        (4, 8, "vllm-c4.json", "vllm-c4.log"),
    ]
    assert all(r["rc"] == 0 and not r["timed_out"] and r["failed"] == 0 for r in sweep["runs"])
    assert sweep["problems"] == []
    assert result["lines"][1].startswith("c=4: 8 of 8 completed, ")
    seen = records(env)
    assert [r["argv"][0] for r in seen] == [str(env / "venv/bin/vllm")] * 2
    assert sweep["runs"][0]["argv"] == seen[0]["argv"]
    assert all(r["key"] == KEY and not r["api_key"] for r in seen)
    assert not any(KEY in arg or "secret" in arg for r in seen for arg in r["argv"])
    # The log keeps what the benchmark printed, the key hidden; the result is the engine's.
    assert files_hold(env / "results", KEY) == []
    assert "sending with key <hidden>" in (env / "results/vllm-c1.log").read_text()
    assert json.loads((env / "results/vllm-c4.json").read_text())["num_prompts"] == 8
    assert KEY not in json.dumps(result)


def test_sglang_saves_the_servers_arguments_with_the_key_hidden_and_counts_failures(env, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL_AT", "4")
    result = run_module(MODULE, args(env, engine="sglang", api="chat"))
    assert not result.get("failed"), result.get("msg")
    sweep = result["sweep"]
    assert [r["file"] for r in sweep["runs"]] == ["sglang-c1.jsonl", "sglang-c4.jsonl"]
    assert records(env)[0]["argv"][1:5] == ["-m", "sglang.bench_serving", "--backend", "sglang-oai-chat"]
    saved = json.loads((env / "results/sglang-c4.jsonl").read_text())
    assert saved["server_info"]["api_key"] == "<hidden>"
    assert files_hold(env / "results", KEY) == [] and KEY not in json.dumps(result)
    # SGLang counts only completed requests: the failed one is the difference to those sent.
    assert (sweep["runs"][1]["completed"], sweep["runs"][1]["failed"]) == (7, 1)
    assert sweep["problems"] == ["concurrency 4: 1 of 8 requests failed"]


def test_a_run_that_fails_ends_the_sweep_and_the_levels_measured_remain(env, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT_AT", "2")
    result = run_module(MODULE, args(env, concurrency=[1, 2, 4, 8]))
    assert not result.get("failed"), result.get("msg")
    sweep = result["sweep"]
    assert [(r["concurrency"], r["rc"]) for r in sweep["runs"]] == [(1, 0), (2, 3)]
    assert "completed" not in sweep["runs"][1]
    problem = sweep["problems"][0]
    assert problem.startswith("concurrency 2: vllm bench serve exited with 3; not run: concurrency 4, 8. Its log ends:")
    assert "sending with key <hidden>" in problem
    assert len(records(env)) == 2


def test_a_run_past_its_timeout_is_stopped_with_its_process_group(env, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP_AT", "4")
    start = time.monotonic()
    result = run_module(MODULE, args(env, run_timeout=2))
    assert time.monotonic() - start < 30
    run = result["sweep"]["runs"][1]
    assert run["timed_out"] and run["rc"] != 0
    assert result["sweep"]["problems"][0].startswith("concurrency 4: stopped after 2 s (run_timeout). Its log ends:")
    helper = int((env / "record.jsonl.helper").read_text())
    # Signalled with its group; on a loaded machine the last of them may take a moment to go.
    deadline = time.monotonic() + 10
    while (running(records(env)[1]["pid"]) or running(helper)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(records(env)[1]["pid"]) and not running(helper)


def test_check_mode_runs_nothing_and_shows_the_command_lines(env):
    result = run_module(MODULE, args(env, concurrency=[8]), check_mode=True)
    assert not result.get("failed") and not result["changed"]
    assert records(env) == [] and not (env / "results").exists()
    assert result["sweep"]["runs"] == [{"concurrency": 8, "requests": 16, "argv": result["sweep"]["runs"][0]["argv"]}]
    assert result["lines"][0].startswith(f"c=8: would run {env}/venv/bin/vllm bench serve --backend openai ")


def test_without_a_key_file_no_key_is_sent_not_even_one_from_outside(env, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "someone-elses")
    monkeypatch.setenv("API_KEY", "sglang-reads-this-too")
    result = run_module(MODULE, args(env, secret_file=str(env / "absent.env"), concurrency=[1]))
    assert not result.get("failed"), result.get("msg")
    assert [(r["key"], r["api_key"]) for r in records(env)] == [(None, False)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"service": {"engine": "vllm", "environment": "/nonexistent", "model": {"path": "/m"}}},
            "/nonexistent/bin/vllm is missing",
        ),
        ({"service": {"engine": "tgi", "environment": "/x", "model": {"path": "/m"}}}, "engine 'tgi' has no benchmark"),
        ({"service": {"engine": "vllm", "environment": "/x"}}, "cannot build the benchmark's command line"),
        ({"concurrency": [1, 0]}, "concurrency must be positive numbers"),
    ],
)
def test_what_cannot_run_fails_the_module(env, change, message):
    result = run_module(MODULE, args(env, **change))
    assert result["failed"] and message in result["msg"]
    assert records(env) == []
