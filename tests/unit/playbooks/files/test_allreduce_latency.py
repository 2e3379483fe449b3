"""playbooks/files/allreduce-latency.py without a GPU: two real ranks over gloo on the CPU, a wrong sum injected into
one of them, and the paths that cannot measure (no GPU, no torch).

The ranks need torch, which the project's own environment does not hold: the tests take the interpreter of
INFERHOST_TORCH_PYTHON, else the lab's trainer environment where it is complete, else make a venv of their own
with the trainer's torch pin (.cache/unit/torch, once; uv's cache shares the download with the lab's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferhost.sim import checkpoint

ROOT = Path(__file__).resolve().parents[4]
PROGRAM = ROOT / "playbooks" / "files" / "allreduce-latency.py"
UV_CACHE = ROOT / ".cache" / "lab" / "uv-cache"

# Run as the program's main module, with rank 1 adding 1 to the last element of every all-reduce of the second
# size: the spawned ranks import this script again (spawn), so the wrapper is defined in each of them.
WRONG_ON_RANK_ONE = """
import importlib.util, os, sys
sys.path.insert(0, os.path.dirname({program!r}))  # the program's own folder, as when it is run by path
spec = importlib.util.spec_from_file_location("allreduce_latency", {program!r})
program = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = program
spec.loader.exec_module(program)


def wrong_sum_worker(rank, world, port, opts, results):
    import torch.distributed as dist

    real = dist.all_reduce

    def off_by_one(tensor, *args, **kwargs):
        work = real(tensor, *args, **kwargs)
        if rank == 1 and tensor.numel() * tensor.element_size() == opts["sizes"][1]:
            tensor.view(-1)[-1] += 1
        return work

    dist.all_reduce = off_by_one
    program.worker(rank, world, port, opts, results)


if __name__ == "__main__":
    sys.exit(program.main(sys.argv[1:], target=wrong_sum_worker))
"""


def has_torch(python):
    probe = [str(python), "-c", "import torch.distributed as d; print(d.is_gloo_available())"]
    done = subprocess.run(probe, capture_output=True, text=True, check=False)
    return done.returncode == 0 and done.stdout.strip() == "True"


@pytest.fixture(scope="module")
def torch_python():
    """An interpreter with torch (gloo built in)."""
    given = os.environ.get("INFERHOST_TORCH_PYTHON")
    if given:
        assert has_torch(given), f"INFERHOST_TORCH_PYTHON={given} has no torch with gloo"
        return given
    # The lab's trainer environment has torch with gloo: made once for the lab and these tests alike (whichever
    # comes first makes it, the other waits), from the lab's uv cache.
    return str(checkpoint.ensure_trainer(checkpoint.TRAINER, checkpoint.UV, cache=UV_CACHE))


def run(python, *args, script=PROGRAM, env=None):
    return subprocess.run(
        [python, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_two_ranks_over_gloo_time_each_size_and_a_wrong_sum_fails_the_run(torch_python, tmp_path):
    script = tmp_path / "wrong_on_rank_one.py"
    script.write_text(WRONG_ON_RANK_ONE.format(program=str(PROGRAM)))
    out = tmp_path / "allreduce.json"
    argv = ["--backend", "gloo", "--world", "2", "--iters", "4", "--warmup", "1", "--dtype", "float32"]
    done = run(
        torch_python,
        *argv,
        "--sizes",
        "64",
        "256",
        "--json",
        str(out),
        script=script,
        env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert (result["measured"], result["world_size"], result["method"]) == (True, 2, "eager")
    assert result["environment"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    first, second = result["sizes"]
    assert (first["bytes"], second["bytes"]) == (64, 256)
    # Both ranks timed both sizes; the run's figure is the slowest rank's.
    for row in result["sizes"]:
        assert len(row["per_rank_us"]) == 2 and all(us > 0 for us in row["per_rank_us"])
        assert row["latency_us"] == max(row["per_rank_us"])
    assert first["correct"] and first["error"] == ""
    assert not second["correct"] and not result["correct"]
    # 1 + 2 = 3 on every element, and rank 1's last one is 4.
    assert second["error"] == "rank 1: all-reduce of 256 B (buffer 0) gave 4.0 at element 63, expected 3.0"
    assert result["latency_us"] is None
    assert "WRONG SUM: rank 1" in done.stdout and "no latency is reported for the ceiling" in done.stdout


def test_two_ranks_over_gloo_give_a_latency_when_the_sums_are_right(torch_python, tmp_path):
    out = tmp_path / "allreduce.json"
    done = run(torch_python, "--backend", "gloo", "--world", "2", "--iters", "4", "--sizes", "128", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["correct"] and result["sizes"][0]["correct"] and result["dtype"] == "bfloat16"
    assert result["latency_bytes"] == 128 and result["latency_us"] == result["sizes"][0]["latency_us"] > 0
    assert "128 B" in done.stdout and "sum correct" in done.stdout


def test_no_gpu_visible_cannot_measure_and_says_the_profile_is_kept(torch_python, tmp_path):
    out = tmp_path / "allreduce.json"
    done = run(torch_python, "--world", "8", "--json", str(out), env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert (result["measured"], result["gpus_visible"], result["cuda_visible_devices"]) == (False, 0, "")
    assert "an all-reduce needs two GPUs or more" in result["reason"]
    assert "cannot measure an all-reduce: no GPU is visible" in done.stdout
    assert "the ceiling keeps the hardware profile's figure" in done.stdout


def test_an_environment_without_torch_cannot_measure(tmp_path):
    out = tmp_path / "allreduce.json"
    done = run(sys.executable, "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["measured"] is False and result["reason"] == f"no torch in the environment of {sys.executable}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--iters", "0"], "--iters 0: expected a whole number of at least 1"),
        (["--sizes", "8192", "-1"], "--sizes -1: expected a whole number of at least 1"),
        (["--backend", "gloo"], "--backend gloo needs --world"),
        (["--backend", "gloo", "--world", "2", "--method", "graph"], "--method graph needs GPUs"),
        (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, args, message):
    out = tmp_path / "allreduce.json"
    done = run(sys.executable, *args, "--json", str(out))
    assert done.returncode == 2 and message in done.stderr
    assert not out.exists()
