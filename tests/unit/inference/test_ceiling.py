"""The single-stream decode ceiling: arithmetic, edge cases and the worked examples of docs/ceiling.md."""

import re

import pytest
from inference import ceiling
from inference.ceiling import (
    ARCHITECTURES,
    BYTES_PER_PARAM,
    CeilingError,
    Hardware,
    Model,
    decode_ceiling,
    expected_max_experts,
)
from inference_refdata import GLM5_CHECKPOINT, GLM5_FACTS, REFERENCE, ROOT, load_config


def reference_model(services, name):
    service = services[name]
    return Model.from_config(load_config(REFERENCE[name]), {"name": name, **service["model"]})


# Round numbers, so that the expected values in the tests can be worked out by hand.
TOY_HARDWARE = {
    "name": "toy",
    "gpu_count": 8,
    "hbm_bandwidth_gbps": 1000,
    "pcie_bandwidth_gbps": 50,
    "allreduce_latency_us": {2: 10.0},
}
TOY_MODEL = {
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


def toy_hardware(**kw):
    return Hardware.from_dict({**TOY_HARDWARE, **kw})


def toy_model(**kw):
    return Model(**{**TOY_MODEL, **kw})


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
    # every linear layer but the output head and the router (kept in high precision, whole on every GPU)
    assert minimax.quantized_params == pytest.approx(10e9 - 2 * 200064 * 3072 - 62 * 3072 * 256)


def test_replicated_weights_are_read_whole_on_every_gpu():
    model = toy_model(replicated_params=1e9)  # 1 B of the 5 B BF16 non-expert weights: 2 GB
    result = decode_ceiling(model, toy_hardware(), tp=4)
    # routed 2.25 GB / 4 + (10 - 2) GB / 4 + 2 GB whole
    assert result["weights_gb_per_gpu"] == pytest.approx(2.25 / 4 + 8 / 4 + 2, abs=1e-3)
    assert result["replicated_gb_per_gpu"] == pytest.approx(2.0)
    plain = decode_ceiling(toy_model(), toy_hardware(), tp=4)
    assert plain["weights_gb_per_gpu"] == pytest.approx(12.25 / 4, abs=1e-3)
    # on one GPU nothing is replicated: the same bytes
    one = decode_ceiling(model, toy_hardware(), tp=1)
    assert one["weights_gb_per_gpu"] == decode_ceiling(toy_model(), toy_hardware(), tp=1)["weights_gb_per_gpu"]


def test_replicated_weights_cannot_exceed_the_non_expert_weights():
    with pytest.raises(CeilingError, match="replicated parameters exceed"):
        toy_model(replicated_params=6e9)


def test_kimi_keeps_mla_down_projections_and_router_whole(services):
    kimi = reference_model(services, "kimi-k25")
    mla_down = 61 * 7168 * (1536 + 512 + 64)  # q_a_proj and kv_a_proj_with_mqa in every layer
    router = 60 * 7168 * 384  # the gate of the 60 MoE layers
    assert kimi.replicated_params == mla_down + router
    assert kimi.replicated_bytes() == pytest.approx(2 * (mla_down + router))  # BF16, about 2.18 GB
    qwen = reference_model(services, "qwen35")
    assert qwen.replicated_params == 60 * (4096 * 512 + 4096)  # router and shared-expert gate, no MLA


def test_stored_bytes_count_every_expert(services):
    kimi = reference_model(services, "kimi-k25")
    experts = 384 * 3 * 7168 * 2048 * 60 * 0.5625
    non_expert = (32e9 - 163840 * 7168 - 8 * 3 * 7168 * 2048 * 60) * 2
    assert kimi.stored_bytes() == pytest.approx(experts + non_expert + 163840 * 7168 * 2)
    assert 590e9 < kimi.stored_bytes() < 595e9


# The worked examples in docs/ceiling.md, for the reference services as the inventory defines them.
WORKED = {
    "qwen35": 185.1,
    "kimi-k25": 140.1,  # 164.7 before the replicated weights were counted
    "minimax-m25": 247.8,  # 319.0 with two collectives per layer and a BF16 router
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


def test_kimi_reference_deployment_runs_without_expert_parallel(services, hardware):
    """As the hand-built service ran it: plain TP 8; expert parallel would lower the single-stream ceiling."""
    kimi = services["kimi-k25"]
    assert not kimi.get("expert_parallel") and kimi["tensor_parallel_size"] == 8
    model, hw = reference_model(services, "kimi-k25"), Hardware.from_dict(hardware)
    assert decode_ceiling(model, hw, 8, expert_parallel=True)["tokens_per_s"] == 118.5


# The reference deployment's single-stream figures (concurrency 1), next to their ceilings in docs/ceiling.md.
MEASURED = {"kimi-k25": (82, 140.1, "59 %"), "qwen35": (172, 185.1, "93 %")}


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_measured_figures_are_shown_with_their_ratio(name, services, hardware):
    measured, ceiling, ratio = MEASURED[name]
    service = services[name]
    result = decode_ceiling(reference_model(services, name), Hardware.from_dict(hardware), 8)
    assert result["tokens_per_s"] == ceiling
    assert f"{round(100 * measured / ceiling)} %" == ratio
    doc = (ROOT / "docs/ceiling.md").read_text()
    row = next(line for line in doc.splitlines() if f"(`{name}`)" in line)
    assert f"| {ceiling} |" in row and f"**{ratio}**" in row and f"| {measured} " in row
    assert service["tensor_parallel_size"] == 8


def glm5(quantization="nvfp4", quantized="routed_experts"):
    facts = {**GLM5_FACTS, "quantization": quantization, "quantized": quantized}
    return Model.from_config(load_config(GLM5_CHECKPOINT), facts)


def weights_per_token_without_embeddings(cfg):
    """What one token of a DeepSeek-V3.2-style model touches, embedding tables left out, counted by hand."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    q, kv, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    attention = h * q + q * heads * (nope + rope) + h * (kv + rope) + kv * heads * (nope + v) + heads * v * h
    indexer = q * cfg["index_n_heads"] * cfg["index_head_dim"] + h * cfg["index_head_dim"] + h * cfg["index_n_heads"]
    dense = cfg["first_k_dense_replace"]
    moe = cfg["num_hidden_layers"] - dense
    expert = 3 * h * cfg["moe_intermediate_size"]
    per_moe_layer = (cfg["num_experts_per_tok"] + cfg["n_shared_experts"]) * expert + h * cfg["n_routed_experts"]
    return (
        cfg["num_hidden_layers"] * (attention + indexer)
        + dense * 3 * h * cfg["intermediate_size"]
        + moe * per_moe_layer
    )


def test_glm5_active_parameters_count_both_embedding_tables():
    """The card's 40 B is what config.json adds up to without the embedding tables; the ceiling counts both."""
    cfg = load_config(GLM5_CHECKPOINT)
    without = weights_per_token_without_embeddings(cfg)
    assert round(without / 1e9) == 40
    table = cfg["vocab_size"] * cfg["hidden_size"]
    assert GLM5_FACTS["active_params_b"] == round((without + 2 * table) / 1e9, 2)
    # the embedding table is not read; the output head is, in BF16
    assert glm5().weight_bytes()[1] == pytest.approx(2 * (without + table - 8 * 3 * 6144 * 2048 * 75), rel=1e-3)


def test_glm5_worked_example(hardware):
    hw = Hardware.from_dict(hardware)
    model = glm5()
    # MLA down-projections, router and the sparse-attention indexer stay whole on every GPU
    assert model.replicated_params == (
        78 * 6144 * (2048 + 512 + 64) + 75 * 6144 * 256 + 78 * (2048 * 32 * 128 + 6144 * 128 + 6144 * 32)
    )
    result = decode_ceiling(model, hw, 8)
    assert result["tokens_per_s"] == 95.7
    assert result["weights_gb_per_gpu"] == pytest.approx(9.824, abs=1e-3)
    assert round(100 * 10.36 / result["tokens_per_s"], 1) == 10.8
    linear = decode_ceiling(glm5(quantized="all_linear"), hw, 8)["tokens_per_s"]
    assert linear == 136.3
    assert round(100 * 10.36 / linear, 1) == 7.6
    # FP8 does not fit: about 95 GB of weights per GPU before any KV cache
    fp8 = glm5("fp8", "all_linear")
    assert (fp8.stored_bytes() - fp8.replicated_bytes()) / 8 + fp8.replicated_bytes() > 95.0e9
    # the deployment's FP4 GEMM at one token reached about 5 % of the bandwidth bound: the NVFP4 experts read
    # at that rate leave 36.6 tok/s, far above the measured 10.36
    routed = model.weight_bytes()[0] / 8
    slow = routed / (0.05 * hw.hbm_bandwidth) + (result["weights_gb_per_gpu"] * 1e9 - routed) / hw.hbm_bandwidth
    assert round(1 / (slow + result["comm_ms"] / 1e3), 1) == 36.6
    doc = (ROOT / "docs/ceiling.md").read_text()
    assert "| GLM-5 | `lukealonso/GLM-5-NVFP4`, SGLang, TP 8 | 10.36 | 95.7 | **10.8 %** |" in doc
    assert "Ceiling **95.7 tok/s** (every linear layer in NVFP4 instead: 136.3 tok/s)" in doc
    assert "36.6 tok/s" in doc


# --- collectives per layer, by architecture ---------------------------------------------------------


def test_collectives_per_layer_come_from_the_architecture(services):
    assert reference_model(services, "minimax-m25").collectives_per_layer == 3
    assert reference_model(services, "kimi-k25").collectives_per_layer == 2
    assert reference_model(services, "qwen35").collectives_per_layer == 2
    assert glm5().collectives_per_layer == 2
    # an architecture the table does not list: one all-reduce after attention, one after the MLP
    config = {**load_config("MiniMax-M2.5"), "architectures": ["SomeNewForCausalLM"]}
    model = Model.from_config(config, {"active_params_b": 10, "quantization": "fp8", "quantized": "all_linear"})
    assert model.collectives_per_layer == 2
    assert model.router_dtype == "bf16"
    assert ceiling.architecture_facts(config) == ("SomeNewForCausalLM", {})
    assert ceiling.architecture_facts({}) == (None, {})


def test_every_architecture_entry_cites_the_engines_model_file():
    """Each entry of ARCHITECTURES has a comment above it naming the engine's model code it was counted from."""
    lines = (ROOT / "plugins/module_utils/inference/ceiling.py").read_text().splitlines()
    for name in ARCHITECTURES:
        index = next(i for i, line in enumerate(lines) if line.strip().startswith(f'"{name}": {{'))
        comment = []
        for line in reversed(lines[:index]):
            if not line.strip().startswith("#"):
                break
            comment.append(line)
        assert re.search(r"(vllm|sglang)\S*/models/\w+\.py", " ".join(comment)), name


def test_minimax_pays_three_collectives_per_layer_and_reads_an_fp32_router(services, hardware):
    """vLLM's and SGLang's MiniMax-M2 all-reduce the q/k norm's variance in every layer, and hold the gate in FP32."""
    model = reference_model(services, "minimax-m25")
    router = 62 * 3072 * 256
    assert model.router_params == router
    assert model.replicated_bytes() == pytest.approx(4 * router)  # FP32, whole on every GPU: 0.195 GB
    result = decode_ceiling(model, Hardware.from_dict(hardware), 4)
    assert result["collectives_per_layer"] == 3
    assert result["collectives"] == 62 * 3
    assert result["replicated_gb_per_gpu"] == 0.195
    assert result["tokens_per_s"] == 247.8
    # each correction on its own: the third collective alone gives 251.2, the FP32 router alone 313.5
    model.router_dtype = "bf16"
    assert decode_ceiling(model, Hardware.from_dict(hardware), 4)["tokens_per_s"] == 251.2
    two = Model.from_config(
        load_config("MiniMax-M2.5"),
        {"name": "minimax-m25", **services["minimax-m25"]["model"], "collectives_per_layer": 2},
    )
    assert two.router_dtype == "fp32"
    assert decode_ceiling(two, Hardware.from_dict(hardware), 4)["tokens_per_s"] == 313.5


def test_a_service_overrides_the_collectives_per_layer(services, hardware):
    facts = {**services["kimi-k25"]["model"], "collectives_per_layer": 3}
    model = Model.from_config(load_config("Kimi-K2.5"), facts)
    result = decode_ceiling(model, Hardware.from_dict(hardware), 8)
    assert result["collectives"] == 61 * 3
    # the memory term is unchanged, the collectives cost half as much again: 122 -> 183 x 31.9 us
    assert result["memory_ms"] == 3.244
    assert result["comm_ms"] == pytest.approx(183 * 31.9e-3, abs=2e-3)
    assert result["tokens_per_s"] < 140.1


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "3", None])
def test_collectives_per_layer_must_be_a_whole_number_of_at_least_one(value):
    with pytest.raises(CeilingError, match="collectives_per_layer .* is not a whole number of at least 1"):
        toy_model(collectives_per_layer=value)


def test_the_router_cannot_exceed_the_unquantized_replicated_weights():
    with pytest.raises(CeilingError, match="the router exceeds"):
        toy_model(replicated_params=1e8, router_params=2e8)


def test_a_wider_router_costs_its_own_bytes():
    # 0.1 B router params of the 5 B BF16 non-expert weights, held in FP32: 0.2 GB more per token
    plain = decode_ceiling(toy_model(replicated_params=1e8, router_params=1e8), toy_hardware(), tp=1)
    wide = decode_ceiling(
        toy_model(replicated_params=1e8, router_params=1e8, router_dtype="fp32"), toy_hardware(), tp=1
    )
    assert plain["weights_gb_per_token"] == pytest.approx(12.25)
    assert wide["weights_gb_per_token"] == pytest.approx(12.45)


def test_minimax_tp8_with_expert_parallel_in_the_documentation(services, hardware):
    result = decode_ceiling(
        reference_model(services, "minimax-m25"), Hardware.from_dict(hardware), 8, expert_parallel=True
    )
    assert result["tokens_per_s"] == 134.0
    doc = " ".join((ROOT / "docs/ceiling.md").read_text().split())
    assert "TP 8 with expert parallel is allowed but its ceiling is lower, **134.0 tok/s**" in doc
