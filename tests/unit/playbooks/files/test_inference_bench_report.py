"""The report of the engines' own benchmark results (vLLM's as it wrote them, SGLang's), with the ceiling next to it."""

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest
from inference_refdata import BENCH, MODELS, REFERENCE, ROOT

REPORT = ROOT / "playbooks/files/inference-bench-report.py"


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sweep_file(folder, engine, runs, problems=(), **about):
    """The sweep.json playbooks/benchmark.yml writes, with the engine's result files beside it."""
    for run in runs:
        shutil.copy(BENCH / run.pop("fixture"), folder / run["file"])
    sweep = {"engine": engine, "tool": {"vllm": "vllm bench serve"}.get(engine, "python -m sglang.bench_serving")}
    sweep.update(api="completions", url="http://127.0.0.1:8000", model="lab", input_tokens=128, output_tokens=64)
    sweep.update(rounds=2, runs=runs, problems=list(problems), **about)
    (folder / "sweep.json").write_text(json.dumps(sweep))
    return folder / "sweep.json"


def report(*argv):
    done = subprocess.run(
        [sys.executable, str(REPORT), *map(str, argv)], capture_output=True, text=True, timeout=120, check=False
    )
    return done


def test_report_of_vllms_sweep_puts_the_ceiling_next_to_its_figures(tmp_path, services, hardware):
    runs = [
        {"concurrency": 4, "requests": 8, "file": "vllm-c4.json", "fixture": "vllm-c4.json"},
        {"concurrency": 1, "requests": 2, "file": "vllm-c1.json", "fixture": "vllm-c1.json"},
    ]
    sweep = sweep_file(tmp_path, "vllm", runs, engine_version="0.16.0")
    (tmp_path / "service.json").write_text(json.dumps(services["minimax-m25"]))
    (tmp_path / "hardware.json").write_text(json.dumps(hardware))
    config = MODELS / REFERENCE["minimax-m25"] / "config.json"
    done = report(sweep, "--out-dir", tmp_path / "out", "--name", "minimax", "--service", tmp_path / "service.json")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out/minimax.json").read_text())["ceiling"] is None  # no hardware, no config
    done = report(
        sweep,
        "--out-dir",
        tmp_path / "out",
        "--name",
        "minimax",
        "--service",
        tmp_path / "service.json",
        "--hardware",
        tmp_path / "hardware.json",
        "--config",
        config,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out/minimax.json").read_text())
    assert [lv["concurrency"] for lv in result["result"]["levels"]] == [1, 4]
    assert result["ceiling"]["tokens_per_s"] == 247.8
    # One stream's decode speed: 1000 / median TPOT (6.97 ms) at concurrency 1, as vLLM measured it.
    assert result["ratio"] == {"measured_tok_s": 143.4, "ceiling_tok_s": 247.8, "ratio": 0.579}
    table = (tmp_path / "out/minimax.md").read_text()
    assert (
        "Measured with vLLM 0.16.0's own benchmark (`vllm bench serve`, completions API): 128 prompt tokens "
        "(random token ids) and 64 output tokens (EOS ignored) per request; concurrency x 2 requests per level."
    ) in table
    assert "| 1 | 2 | 0 | 118.43 | 355.28 | 1.85 | 100.82 (169.62) | 6.97 (7.97) | 7.0 (45.33) | 143.4 |" in table
    assert "| 4 | 8 | 0 | 791.3 | 2383.18 | 12.36 | 237.12 (355.98) | 1.28 (2.68) | 0.0 (7.11) | 783.35 |" in table
    assert "| **ceiling** | **247.8 tok/s** |" in table
    assert "| **measured / ceiling** | **0.579** |" in table
    assert (tmp_path / "out/minimax.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert table in done.stdout


def test_sglang_results_read_alone_or_through_the_sweep_that_knows_what_was_sent(tmp_path):
    shutil.copy(BENCH / "sglang-c1.jsonl", tmp_path)
    shutil.copy(BENCH / "sglang-c4.jsonl", tmp_path)
    done = report(tmp_path / "sglang-c4.jsonl", tmp_path / "sglang-c1.jsonl", "--out-dir", tmp_path / "alone")
    assert done.returncode == 0, done.stderr
    table = (tmp_path / "alone/benchmark.md").read_text()
    assert table.startswith("# Benchmark: lab\n")  # the served name, from the server's arguments SGLang saves
    assert "SGLang's own benchmark (`python -m sglang.bench_serving`): 128 prompt tokens" in table
    # SGLang's result counts the completed only: without the sweep, what was sent and failed is unknown.
    assert "| 4 | - | - | 640.0 | 1920.0 | 10.0 | 208.0 (219.9) | 1.8 (2.3) | 1.6 (4.8) | 555.56 |" in table
    runs = [
        {"concurrency": 1, "requests": 2, "file": "sglang-c1.jsonl", "fixture": "sglang-c1.jsonl"},
        {"concurrency": 4, "requests": 8, "file": "sglang-c4.jsonl", "fixture": "sglang-c4.jsonl"},
    ]
    sweep = sweep_file(tmp_path, "sglang", runs, problems=["concurrency 4: 1 of 8 requests failed"])
    done = report(sweep, "--out-dir", tmp_path / "swept")
    assert done.returncode == 0, done.stderr
    table = (tmp_path / "swept/benchmark.md").read_text()
    assert "| 4 | 8 | 1 | 640.0 |" in table and "| 1 | 2 | 0 | 128.0 |" in table
    assert "Problem: concurrency 4: 1 of 8 requests failed" in table


def test_a_level_where_every_request_failed_shows_no_latencies(tmp_path):
    runs = [{"concurrency": 1, "requests": 2, "file": "vllm-c1.json", "fixture": "vllm-c1-unauthorized.json"}]
    problem = "concurrency 1: 2 of 2 requests failed"
    done = report(sweep_file(tmp_path, "vllm", runs, problems=[problem]), "--out-dir", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    table = (tmp_path / "out/benchmark.md").read_text()
    assert "| 1 | 2 | 2 | 0.0 | 0.0 | 0.0 | - (-) | - (-) | - (-) | - |" in table
    assert f"Problem: {problem}" in table


def test_a_level_whose_tokens_came_in_one_piece_is_said_to_be_so(tmp_path, services, hardware):
    runs = [{"concurrency": 1, "requests": 2, "file": "vllm-c1.json", "fixture": "vllm-c1-one-piece.json"}]
    (tmp_path / "service.json").write_text(json.dumps(services["minimax-m25"]))
    (tmp_path / "hardware.json").write_text(json.dumps(hardware))
    config = MODELS / REFERENCE["minimax-m25"] / "config.json"
    argv = ["--service", tmp_path / "service.json", "--hardware", tmp_path / "hardware.json", "--config", config]
    done = report(sweep_file(tmp_path, "vllm", runs), "--out-dir", tmp_path / "out", *argv)
    assert done.returncode == 0, done.stderr
    table = (tmp_path / "out/benchmark.md").read_text()
    assert "| 1 | 2 | 0 | 231.29 | 693.86 | 3.61 | 276.25 (314.14) | 0.0 (0.0) | 0.0 (0.01) | - |" in table
    assert (
        "At concurrency 1 the median TPOT is under 0.1 ms: the server sent each request's tokens in one piece" in table
    )
    assert "| **measured / ceiling** | **-** |" in table


def test_a_sweep_whose_runs_wrote_nothing_is_refused(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({"engine": "vllm", "runs": [{"concurrency": 1, "file": "x.json"}]}))
    done = report(tmp_path / "sweep.json", "--out-dir", tmp_path / "out")
    assert done.returncode == 2
    assert "no result of vllm bench serve or sglang.bench_serving in" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("missing", ["active_params_b", "hardware"])
def test_report_without_model_facts_says_why_there_is_no_ceiling(missing, services, hardware):
    module = load(REPORT, "inference_bench_report")
    levels = [module.level(json.loads((BENCH / "vllm-c1.json").read_text()))]
    service = services["minimax-m25"]
    if missing == "active_params_b":
        service = {**service, "model": {k: v for k, v in service["model"].items() if k != missing}}
    config = json.loads((MODELS / REFERENCE["minimax-m25"] / "config.json").read_text())
    built = module.build({"model": "M", "levels": levels}, service, {} if missing == "hardware" else hardware, config)
    assert built["ceiling"] is None and built["ratio"] is None
    assert "No ceiling: no model facts or hardware profile given." in module.markdown(built)


def measurement(**fields):
    """allreduce-latency.py's result across 4 GPUs, as benchmark.yml fetches it."""
    result = {"measured": True, "correct": True, "world_size": 4, "method": "graph", "nccl_version": "2.28.9"}
    result.update(latency_us=6.5, latency_bytes=6144, environment={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"})
    return {**result, **fields}


@pytest.mark.parametrize(
    ("allreduce", "source", "detail"),
    [
        (None, "hardware profile", "the hardware profile's (listed for 4 GPUs); not measured"),
        (
            measurement(),
            "measured",
            "measured by benchmark.yml on 4 GPUs (6144 B, a CUDA graph's replays, NCCL 2.28.9; NCCL settings: "
            "NCCL_ALGO=Ring, NCCL_PROTO=LL)",
        ),
        (
            measurement(measured=False, reason="one GPU is visible"),
            "hardware profile",
            "the hardware profile's (listed for 4 GPUs); not measured: one GPU is visible",
        ),
        (
            measurement(world_size=8),
            "hardware profile",
            "the hardware profile's (listed for 4 GPUs); measured on 8 GPU(s), the service uses 4",
        ),
        (
            measurement(correct=False, latency_us=None),
            "hardware profile",
            "the hardware profile's (listed for 4 GPUs); the measurement's all-reduce gave a wrong sum",
        ),
    ],
)
def test_the_ceiling_uses_the_measured_all_reduce_latency_only_where_it_fits(
    services, hardware, allreduce, source, detail
):
    bench = load(REPORT, "inference_bench_report")
    config = json.loads((MODELS / REFERENCE["minimax-m25"] / "config.json").read_text())
    report = bench.build({"levels": []}, services["minimax-m25"], hardware, config, allreduce=allreduce)
    ceiling = report["ceiling"]
    assert (ceiling["allreduce"]["source"], ceiling["allreduce"]["detail"]) == (source, detail)
    profile = bench.build({"levels": []}, services["minimax-m25"], hardware, config)["ceiling"]
    if source == "measured":
        # 186 collectives at 6.5 us (plus the same bandwidth term) instead of the profile's 13.5 us: a higher ceiling.
        assert ceiling["allreduce"]["latency_us"] == 6.5
        assert ceiling["collective_us"] == pytest.approx(profile["collective_us"] - 7.0, abs=0.01)
        assert ceiling["tokens_per_s"] > profile["tokens_per_s"]
        table = bench.markdown({**report, "ratio": {"measured_tok_s": None, "ratio": None}})
        assert f"| all-reduce latency used | 6.5 us: {detail} |" in table
    else:
        assert ceiling["allreduce"]["latency_us"] == hardware["allreduce_latency_us"][4] == 13.5
        assert ceiling["tokens_per_s"] == profile["tokens_per_s"] == 247.8


def test_an_eight_gpu_profile_figure_derived_from_four_says_so(services, hardware):
    bench = load(REPORT, "inference_bench_report")
    config = json.loads((MODELS / REFERENCE["qwen35"] / "config.json").read_text())
    ceiling = bench.build({"levels": []}, services["qwen35"], hardware, config)["ceiling"]
    assert ceiling["allreduce"]["detail"] == (
        "the hardware profile's (derived: the 4-GPU figure (13.5 us) scaled by ring steps to 8 GPUs); not measured"
    )
    assert ceiling["allreduce"]["latency_us"] == 31.5
