"""The single-stream decode ceiling: arithmetic, edge cases and the worked examples of docs/ceiling.md."""

import re

import pytest
from inference.ceiling import (
    BYTES_PER_PARAM,
    CeilingError,
    Hardware,
    Model,
    decode_ceiling,
    expected_max_experts,
)
from inference_refdata import REFERENCE, ROOT, load_config


def reference_model(services, name):
    service = services[name]
    return Model.from_config(load_config(REFERENCE[name]), {"name": name, **service["model"]})


def toy_hardware(**kw):
    data = {
        "name": "toy",
        "gpu_count": 8,
        "hbm_bandwidth_gbps": 1000,
        "pcie_bandwidth_gbps": 50,
        "allreduce_latency_us": {2: 10.0},
    }
    data.update(kw)
    return Hardware.from_dict(data)


def toy_model(**kw):
    data = {
        "name": "toy",
        "layers": 10,
        "hidden_size": 1000,
        "active_params": 10e9,
        "embedding_params": 1e9,
        "routed_params": 4e9,
        "quantized_params": 4e9,
        "quantization": "int4",
        "experts_per_token": 4,
        "num_experts": 64,
    }
    data.update(kw)
    return Model(**data)


def test_bytes_per_param_include_scales():
    assert BYTES_PER_PARAM["nvfp4"] == 0.5 + 1 / 16
    assert BYTES_PER_PARAM["int4"] == 0.5625
    assert 1.0 < BYTES_PER_PARAM["fp8"] < 1.001
    assert BYTES_PER_PARAM["bf16"] == 2.0


def test_one_gpu_is_memory_bound_only():
    result = decode_ceiling(toy_model(quantization="bf16", quantized_params=0), toy_hardware(), tp=1)
    # (10 - 1) B params x 2 bytes = 18 GB at 1000 GB/s = 18 ms; no collectives on one GPU.
    assert result["memory_ms"] == pytest.approx(18.0)
    assert result["comm_ms"] == 0
    assert result["tokens_per_s"] == pytest.approx(1000 / 18, rel=1e-3)


def test_quantized_part_is_read_at_its_own_width():
    result = decode_ceiling(toy_model(), toy_hardware(), tp=1)
    # 4 B routed int4 (0.5625 B) + 5 B others BF16 = 2.25 + 10 = 12.25 GB.
    assert result["weights_gb_per_token"] == pytest.approx(12.25)


def test_tensor_parallel_splits_weights_and_pays_two_collectives_per_layer():
    result = decode_ceiling(toy_model(), toy_hardware(), tp=2)
    assert result["weights_gb_per_gpu"] == pytest.approx(12.25 / 2)
    assert result["collectives"] == 20
    # latency 10 us + 2*(1/2) * 2000 B / 50 GB/s = 10.04 us each
    assert result["collective_us"] == pytest.approx(10.04)
    assert result["comm_ms"] == pytest.approx(20 * 10.04e-3, abs=1e-3)


def test_latency_for_an_unmeasured_gpu_count_scales_with_ring_steps():
    hw = toy_hardware()
    assert hw.allreduce_latency(2) == pytest.approx(10e-6)
    assert hw.allreduce_latency(4) == pytest.approx(30e-6)  # 3 steps per direction instead of 1
    assert hw.allreduce_latency(1) == 0


def test_expected_busiest_gpu_exact_small_cases():
    # 4 experts, 2 per GPU, 2 picked: same GPU in 2 of 6 pairs -> (2*2 + 4*1) / 6
    assert expected_max_experts(2, 4, 2) == pytest.approx(8 / 6)
    assert expected_max_experts(1, 8, 8) == 1.0
    assert expected_max_experts(8, 8, 1) == 8.0
    # Kimi-K2.5 over 8 GPUs: 8 of 384 experts land on the busiest GPU ~2.6 at a time, not 1
    assert expected_max_experts(8, 384, 8) == pytest.approx(2.575, abs=1e-3)


def test_expert_parallel_costs_single_stream_speed():
    model = toy_model()
    tp_only = decode_ceiling(model, toy_hardware(), tp=4)
    with_ep = decode_ceiling(model, toy_hardware(), tp=4, expert_parallel=True)
    assert with_ep["weights_gb_per_gpu"] > tp_only["weights_gb_per_gpu"]
    assert with_ep["tokens_per_s"] < tp_only["tokens_per_s"]


def test_context_adds_kv_reads():
    model = toy_model(kv_values_per_token=10 * 2 * 8 * 128, kv_heads=8)
    short = decode_ceiling(model, toy_hardware(), tp=2)
    long = decode_ceiling(model, toy_hardware(), tp=2, context_tokens=100_000)
    # 20480 values x 2 bytes x 4/8 heads per GPU x 1e5 tokens = 2.048 GB
    assert long["kv_gb_per_gpu"] == pytest.approx(2.048)
    assert long["tokens_per_s"] < short["tokens_per_s"]


def test_bad_inputs_are_refused_with_the_reason():
    with pytest.raises(CeilingError, match="outside 1..8"):
        decode_ceiling(toy_model(), toy_hardware(), tp=16)
    with pytest.raises(CeilingError, match="unknown quantization 'int3'"):
        toy_model(quantization="int3")
    with pytest.raises(CeilingError, match="lacks hbm_bandwidth_gbps"):
        Hardware.from_dict({"gpu_count": 8, "pcie_bandwidth_gbps": 1, "allreduce_latency_us": 1})
    with pytest.raises(CeilingError, match="do not split evenly"):
        expected_max_experts(8, 100, 8)
    with pytest.raises(CeilingError, match="active_params_b"):
        Model.from_config(load_config("MiniMax-M2.5"), {"quantization": "fp8"})


def test_reference_models_read_from_their_configs(services):
    kimi = reference_model(services, "kimi-k25")
    assert kimi.layers == 61 and kimi.hidden_size == 7168
    assert kimi.routed_params == 8 * 3 * 7168 * 2048 * 60  # first layer is dense
    assert not kimi.kv_sharded  # MLA latent: every rank reads all of it
    qwen = reference_model(services, "qwen35")
    assert qwen.routed_params == 10 * 3 * 4096 * 1024 * 60
    assert qwen.kv_values_per_token == 15 * 2 * 2 * 256  # only 1 layer in 4 has softmax attention
    minimax = reference_model(services, "minimax-m25")
    assert minimax.routed_params == 8 * 3 * 3072 * 1536 * 62
    assert minimax.quantized_params == pytest.approx(10e9 - 2 * 200064 * 3072)


# The worked examples in docs/ceiling.md, for the reference services as the inventory defines them.
WORKED = {
    "qwen35": 189.4,
    "kimi-k25": 135.5,
    "minimax-m25": 323.9,
}


@pytest.mark.parametrize("name", sorted(WORKED))
def test_worked_examples_match_the_documentation(name, services, hardware):
    service = services[name]
    result = decode_ceiling(
        reference_model(services, name),
        Hardware.from_dict(hardware),
        service["tensor_parallel_size"],
        expert_parallel=service.get("expert_parallel", False),
    )
    assert result["tokens_per_s"] == WORKED[name]
    doc = (ROOT / "docs/ceiling.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith(f"| `{name}`"))
    assert re.search(rf"\| \*\*{WORKED[name]}\*\* \|", row), f"docs/ceiling.md row for {name} is stale: {row}"
