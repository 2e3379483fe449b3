"""benchmark.yml on this machine (local connection): the engine's benchmark per level, the results fetched, the report.

The service's environment holds a stand-in for the engine's benchmark (``bin/vllm``, ``bin/python -m
sglang.bench_serving``): it refuses to run without the service's key in OPENAI_API_KEY or with the key on its
command line, and writes the engine's result (the fixtures of tests/unit/inference) for the level it was given.
"""

import json
import sys

import pytest
from inference_refdata import BENCH
from playbook_testlib import minimax_site, run_playbook

KEY = "b3nch-key-of-the-service"

FAKE = """#!{python}
import json, os, sys
if sys.argv[1:2] and sys.argv[1].endswith("/allreduce-latency.py"):  # the real program, on this interpreter
    os.execv({python!r}, [{python!r}, *sys.argv[1:]])
argv = sys.argv[1:]
engine = "sglang" if argv[:2] == ["-m", "sglang.bench_serving"] else "vllm"
opt = lambda name: argv[argv.index(name) + 1]
if os.environ.get("OPENAI_API_KEY") != {key!r} or any({key!r} in a for a in sys.argv):
    sys.exit("the key must come in OPENAI_API_KEY, and only there")
with open(os.environ["FAKE_RECORD"], "a") as record:
    record.write(json.dumps(sys.argv) + "\\n")
concurrency, prompts = int(opt("--max-concurrency")), int(opt("--num-prompts"))
failed = 1 if os.environ.get("FAKE_FAIL_AT") == str(concurrency) else 0
print("benchmark of", opt("--served-model-name"), "at", concurrency)
if engine == "vllm":
    result = json.load(open("{bench}/vllm-c4.json"))
    result.update(max_concurrency=concurrency, num_prompts=prompts, completed=prompts - failed, failed=failed)
    json.dump(result, open(os.path.join(opt("--result-dir"), opt("--result-filename")), "w"))
else:
    result = json.loads(open("{bench}/sglang-c4.jsonl").readline())
    result.update(max_concurrency=concurrency, completed=prompts - failed)
    result["server_info"]["api_key"] = os.environ["OPENAI_API_KEY"]
    open(opt("--output-file"), "a").write(json.dumps(result) + "\\n")
"""


@pytest.fixture
def site(tmp_path, hardware):
    """A checkpoint, a service environment with the benchmark stand-ins, the secret file, inventory variables."""
    env = tmp_path / "venv/bin"
    env.mkdir(parents=True)
    for name in ("vllm", "python"):
        (env / name).write_text(FAKE.format(python=sys.executable, key=KEY, bench=BENCH))
        (env / name).chmod(0o755)
    return minimax_site(
        tmp_path,
        hardware,
        KEY,
        tmp_path / "venv",
        18999,
        benchmark_hosts="localhost",
        benchmark_concurrency=[1, 4],
        benchmark_input_tokens=128,
        benchmark_output_tokens=64,
        benchmark_output_dir=str(tmp_path / "results"),
        benchmark_name="mm",
        benchmark_poll=1,
        nccl_tuning_settings=[{"name": "NCCL_PROTO", "value": "LL", "reason": "decode"}],
    )


def playbook(site, *options, fake=None, **extra):
    fake = {"FAKE_RECORD": str(site["tmp"] / "record.jsonl"), **(fake or {})}
    return run_playbook(site, "benchmark.yml", *options, env=fake, **extra)


def ran(site):
    path = site["tmp"] / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_benchmark_runs_vllms_own_benchmark_per_level_and_reports_next_to_the_ceiling(site):
    rc, out = playbook(site)
    assert rc == 0, out[-4000:]
    runs = ran(site)
    assert [r[:3] for r in runs] == [[str(site["tmp"] / "venv/bin/vllm"), "bench", "serve"]] * 2
    assert [r[r.index("--max-concurrency") + 1 :][:3] for r in runs] == [
        ["1", "--num-prompts", "2"],
        ["4", "--num-prompts", "8"],
    ]
    folder = site["tmp"] / "results/mm"
    assert {p.name for p in folder.iterdir()} == {
        *("vllm-c1.json", "vllm-c1.log", "vllm-c4.json", "vllm-c4.log"),
        *("sweep.json", "service.json", "hardware.json", "config.json", "allreduce.json"),
        *("benchmark.json", "benchmark.md", "benchmark.png"),
    }
    # The all-reduce program ran with the service's interpreter in the unit's environment: its GPUs, the NCCL
    # settings; this one has no torch, so nothing was measured and the ceiling says it kept the profile's figure.
    allreduce = json.loads((folder / "allreduce.json").read_text())
    assert (allreduce["cuda_visible_devices"], allreduce["environment"]) == ("0,1,2,3", {"NCCL_PROTO": "LL"})
    assert allreduce["measured"] is False and allreduce["reason"].startswith("no torch in the environment of")
    assert "allreduce-latency: cannot measure an all-reduce: no torch" in out
    assert "benchmark of MiniMax-M2.5 at 4" in (folder / "vllm-c4.log").read_text()
    sweep = json.loads((folder / "sweep.json").read_text())
    assert (sweep["engine"], sweep["api"], sweep["input_tokens"], sweep["output_tokens"]) == (
        "vllm",
        "completions",
        128,
        64,
    )
    assert sweep["runs"][1]["argv"] == runs[1]
    report = json.loads((folder / "benchmark.json").read_text())
    assert [lv["concurrency"] for lv in report["result"]["levels"]] == [1, 4]
    assert report["ceiling"]["tokens_per_s"] == 247.8 and report["ratio"]["ratio"] > 0
    table = (folder / "benchmark.md").read_text()
    assert "| **ceiling** | **247.8 tok/s** |" in table and "| 4 | 8 | 0 | 791.3 |" in table
    assert (
        "| all-reduce latency used | 13.5 us: the hardware profile's (listed for 4 GPUs); not measured: no torch"
        in table
    )
    assert (folder / "benchmark.png").read_bytes().startswith(b"\x89PNG")
    assert "c=4: 8 of 8 completed, 791.3 output tok/s" in out and "measured / ceiling" in out
    assert KEY not in out and not [p.name for p in folder.iterdir() if KEY in p.read_text(errors="replace")]


def test_sglang_with_failed_requests_is_reported_then_fails_the_play(site):
    service = {**site["service"], "engine": "sglang"}
    rc, out = playbook(site, fake={"FAKE_FAIL_AT": "4"}, inference_service_services=[service], benchmark_api="chat")
    assert rc != 0
    assert [r[1:5] for r in ran(site)] == [["-m", "sglang.bench_serving", "--backend", "sglang-oai-chat"]] * 2
    folder = site["tmp"] / "results/mm"
    table = (folder / "benchmark.md").read_text()
    assert "| 4 | 8 | 1 | 640.0 |" in table and "Problem: concurrency 4: 1 of 8 requests failed" in table
    assert json.loads((folder / "sglang-c4.jsonl").read_text())["server_info"]["api_key"] == "<hidden>"
    assert "Check that every level ran without failed requests" in out
    assert "concurrency 4: 1 of 8 requests failed" in out
    assert KEY not in out and not [p.name for p in folder.iterdir() if KEY in p.read_text(errors="replace")]


def test_check_mode_runs_nothing_writes_nothing_and_shows_the_command_lines(site):
    rc, out = playbook(site, "--check")
    assert rc == 0, out[-4000:]
    assert ran(site) == [] and not (site["tmp"] / "results").exists()
    assert f"c=1: would run {site['tmp']}/venv/bin/vllm bench serve --backend openai --endpoint /v1/completions" in out
    assert "--max-concurrency 4 --num-prompts 8" in out
    # MiniMax-M2.5's hidden size is 3072: one token's BF16 activations are 6144 B.
    assert (
        "all-reduce: would measure across 4 GPU(s) with: env -i PATH=/usr/bin:/bin HOME=<a temporary directory>" in out
    )
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in out and "NCCL_PROTO=LL" in out and "INFERHOST_UNIT" not in out
    assert "--world 4 --json <a temporary directory>/allreduce.json --sizes 6144 12288 24576 49152" in out
    # The old client's per-request timeout has no counterpart: it is refused, not ignored.
    rc, out = playbook(site, "--check", benchmark_request_timeout=600)
    assert rc != 0 and "benchmark_request_timeout is gone" in out and "set benchmark_run_timeout" in out.lower()


def test_a_service_of_one_gpu_cannot_measure_an_all_reduce_and_keeps_the_profile(site):
    service = {**site["service"], "gpus": [0], "tensor_parallel_size": 1}
    rc, out = playbook(site, inference_service_services=[service], benchmark_concurrency=[1])
    assert rc == 0, out[-4000:]
    folder = site["tmp"] / "results/mm"
    allreduce = json.loads((folder / "allreduce.json").read_text())
    assert allreduce["measured"] is False and allreduce["world_size"] == 1
    assert "cannot measure an all-reduce: --world 1: one GPU has nothing to all-reduce with" in out
    assert "| all-reduce latency used | 0.0 us: one GPU: no all-reduce |" in (folder / "benchmark.md").read_text()


@pytest.mark.parametrize(
    ("variables", "given"),
    [
        ({"benchmark_allreduce": "no"}, 'given "no"'),
        ({"benchmark_allreduce_batches": [1, 0]}, "given [1, 0]"),
        ({"benchmark_allreduce_env": ["NCCL_NVLS_ENABLE=0"]}, 'given ["NCCL_NVLS_ENABLE=0"]'),
    ],
)
def test_bad_all_reduce_variables_are_refused_before_anything_runs(site, variables, given):
    rc, out = playbook(site, "--check", **variables)
    assert rc != 0 and "Check the all-reduce measurement's variables" in out and given in out
    assert ran(site) == [] and not (site["tmp"] / "results").exists()
