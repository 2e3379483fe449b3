"""Single-stream decode ceiling: the fastest one request can generate tokens on given hardware.

At batch size 1 a decode step is bound by two things that cannot overlap much:

* every GPU reads its share of the weights that one token touches, over its memory bandwidth;
* every layer waits for its tensor-parallel collectives (two all-reduces in most architectures: after
  attention and after the MLP/MoE; ``ARCHITECTURES`` counts them from the engines' model code), whose cost
  for a few kilobytes is almost all latency, plus the bytes over PCIe.

    t_token = bytes_per_gpu / HBM_bandwidth                         (weights, and KV cache at a context)
            + layers x collectives_per_layer x (latency(tp) + 2(tp-1)/tp x hidden x 2 B / PCIe_bandwidth)
    ceiling = 1 / t_token

Weights per token are the model's *active* parameters minus the input embedding table (a lookup reads
one row), with the quantized part at its bytes per parameter (scales included) and the rest at BF16.
With tensor parallelism each GPU reads 1/tp of it, except the weights the engines keep whole on every
rank (``modelconfig.replicated_params``: MLA down-projections, the MoE router, a sparse-attention
indexer), which every GPU reads in full. With expert parallelism each GPU holds whole experts,
and a token's k routed experts land unevenly: the step waits for the busiest GPU, so the routed part
costs E[max experts on one GPU] experts instead of k/tp (uniform routing assumed). That is why expert
parallel is slower for a single stream on PCIe-only GPUs.

It is a ceiling, not a prediction: kernel launch gaps, sampling, the scheduler and kernels that do not reach
the memory bandwidth at one token come on top, and the ratio of a measured single stream to it says how much
they cost. docs/ceiling.md has the derivation, the hardware numbers with their sources, and worked examples.
"""

from __future__ import annotations

from math import comb

from . import modelconfig

# Bytes per parameter, scales included. Keys are the names the inventory uses.
BYTES_PER_PARAM = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0 + 4.0 / (128 * 128),  # e4m3, one fp32 scale per 128x128 block (DeepSeek-style)
    "fp8_channel": 1.0 + 4.0 / 4096,  # e4m3, per-output-channel fp32 scale (approx. k=4096)
    "int8": 1.0 + 2.0 / 128,  # int8 with a bf16 scale per group of 128
    "int4": 0.5 + 2.0 / 32,  # int4 with a bf16 scale per group of 32 (compressed-tensors, Kimi-K2)
    "int4_g128": 0.5 + 2.0 / 128,  # int4 with a bf16 scale per group of 128 (AWQ/GPTQ)
    "nvfp4": 0.5 + 1.0 / 16,  # e2m1 with an fp8 e4m3 scale per 16 elements (+ one fp32 per tensor)
    "mxfp4": 0.5 + 1.0 / 32,  # e2m1 with an e8m0 scale per 32 elements
}

GB = 1e9
US = 1e-6

# What the engines' own model code does in each decoder layer, by the checkpoint's architecture (config.json's
# ``architectures``): ``collectives_per_layer``, the tensor-parallel collectives one token waits for in a layer;
# ``router_dtype``, the width the engine holds the MoE router in when it differs from the dense weights. Each entry
# cites the model code it was counted from. An architecture not listed gets DEFAULT_COLLECTIVES_PER_LAYER (one
# all-reduce after attention, one after the MLP/MoE) and its router at the dense width; a service overrides the
# count with ``model.collectives_per_layer``.
DEFAULT_COLLECTIVES_PER_LAYER = 2
ARCHITECTURES = {
    # vLLM vllm/model_executor/models/deepseek_v2.py, SGLang python/sglang/srt/models/deepseek_v2.py: o_proj's
    # all-reduce and the MoE's (the shared experts are added before it); the MLA down-projections and their norms
    # are replicated linears, no collective.
    "DeepseekV3ForCausalLM": {"collectives_per_layer": 2},
    # vLLM vllm/model_executor/models/kimi_k25.py, SGLang python/sglang/srt/models/kimi_k25.py: the language model
    # is DeepseekV3ForCausalLM (above).
    "KimiK25ForConditionalGeneration": {"collectives_per_layer": 2},
    # vLLM vllm/model_executor/models/deepseek_v2.py: GlmMoeDsaForCausalLM is DeepseekV2ForCausalLM, the code
    # above; the sparse-attention indexer's projections are replicated, no collective.
    "GlmMoeDsaForCausalLM": {"collectives_per_layer": 2},
    # SGLang python/sglang/srt/models/qwen3_5.py, vLLM vllm/model_executor/models/qwen3_5.py: the all-reduce after
    # the Gated DeltaNet's out_proj (or the attention's o_proj) and the MoE's; the gated RMSNorm and the q/k norms
    # work per head, on each rank's own heads.
    "Qwen3_5MoeForConditionalGeneration": {"collectives_per_layer": 2},
    # vLLM vllm/model_executor/models/minimax_m2.py: the q/k RMSNorm spans every rank's heads, so
    # MiniMaxText01RMSNormTP.forward_qk (vllm/model_executor/layers/mamba/linear_attn.py) all-reduces the q and k
    # variances in every layer, a third collective next to o_proj's and the MoE's; SGLang
    # python/sglang/srt/models/minimax_m2.py (MiniMaxM2QKRMSNorm) all-reduces the same sums of squares. Both build
    # the router (gate) as an FP32 ReplicatedLinear (params_dtype=torch.float32).
    "MiniMaxM2ForCausalLM": {"collectives_per_layer": 3, "router_dtype": "fp32"},
}


class CeilingError(ValueError):
    """The inputs do not describe a computable configuration."""


def architecture_facts(config):
    """``(architecture, facts)`` of a checkpoint's config.json from ``ARCHITECTURES``; ``facts`` is empty for an
    architecture the table does not list (and ``architecture`` None when the config names none)."""
    names = [str(name) for name in (config or {}).get("architectures") or []]
    for name in names:
        if name in ARCHITECTURES:
            return name, dict(ARCHITECTURES[name])
    return (names[0] if names else None), {}


def valid_collectives_per_layer(value):
    """Whether ``value`` is a usable count of collectives per layer: a whole number of at least 1."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def bytes_per_param(name):
    try:
        return BYTES_PER_PARAM[name]
    except KeyError:
        raise CeilingError(f"unknown quantization {name!r}; known: {', '.join(sorted(BYTES_PER_PARAM))}") from None


class Hardware:
    """A GPU server as the ceiling sees it.

    ``allreduce_latency_us`` maps a GPU count to the measured latency of one small (<= 64 KB) all-reduce
    across that many GPUs with the communicator the engine uses (NCCL here). A count that is not listed
    is scaled from the nearest listed one by the number of ring steps, 2(n-1).
    """

    def __init__(self, name, gpu_count, hbm_bandwidth_gbps, pcie_bandwidth_gbps, allreduce_latency_us, **extra):
        if gpu_count < 1 or hbm_bandwidth_gbps <= 0 or pcie_bandwidth_gbps <= 0:
            raise CeilingError(f"hardware {name}: gpu_count, hbm_bandwidth_gbps and pcie_bandwidth_gbps must be > 0")
        if isinstance(allreduce_latency_us, int | float):
            allreduce_latency_us = {gpu_count: float(allreduce_latency_us)}
        if not allreduce_latency_us:
            raise CeilingError(f"hardware {name}: allreduce_latency_us needs at least one GPU count")
        self.name = name
        self.gpu_count = int(gpu_count)
        self.hbm_bandwidth = float(hbm_bandwidth_gbps) * GB
        self.pcie_bandwidth = float(pcie_bandwidth_gbps) * GB
        self.allreduce_latency_us = {int(k): float(v) for k, v in allreduce_latency_us.items()}
        self.extra = extra

    @classmethod
    def from_dict(cls, data):
        known = {"name", "gpu_count", "hbm_bandwidth_gbps", "pcie_bandwidth_gbps", "allreduce_latency_us"}
        missing = sorted(k for k in known - {"name"} if k not in data)
        if missing:
            raise CeilingError(f"hardware profile lacks {', '.join(missing)}")
        return cls(data.get("name", "hardware"), **{k: v for k, v in data.items() if k != "name"})

    def allreduce_latency(self, n):
        """Seconds for one small all-reduce across n GPUs (0 for one GPU)."""
        if n <= 1:
            return 0.0
        if n in self.allreduce_latency_us:
            return self.allreduce_latency_us[n] * US
        known = min(self.allreduce_latency_us, key=lambda m: (abs(m - n), m))
        if known <= 1:
            raise CeilingError(f"hardware {self.name}: no all-reduce latency for more than one GPU")
        return self.allreduce_latency_us[known] * (n - 1) / (known - 1) * US


def allreduce_latency_source(hardware, tp, measurement=None):
    """The all-reduce latency the ceiling of ``tp`` GPUs uses and where it comes from.

    ``measurement`` is the JSON result of playbooks/files/allreduce-latency.py (benchmark.yml runs it across the
    service's GPUs): it replaces the hardware profile's figure when it measured ``tp`` GPUs (two or more) and
    every sum was right. Returns ``(hardware, source)``: the hardware to compute with (``hardware`` itself, or a
    copy with the measured figure for ``tp`` GPUs) and a dict with ``latency_us``, ``source`` (``measured``,
    ``hardware profile`` or ``none`` for one GPU) and ``detail``, a sentence saying where the figure came from.
    """
    if tp <= 1:
        return hardware, {"latency_us": 0.0, "source": "none", "detail": "one GPU: no all-reduce"}
    why_not = None
    if measurement is not None:
        if not measurement.get("measured"):
            why_not = f"not measured: {measurement.get('reason') or 'no reason given'}"
        elif measurement.get("correct") is False:
            why_not = "the measurement's all-reduce gave a wrong sum"
        elif measurement.get("world_size") != tp:
            why_not = f"measured on {measurement.get('world_size')} GPU(s), the service uses {tp}"
        elif not isinstance(measurement.get("latency_us"), int | float) or measurement["latency_us"] <= 0:
            why_not = "the measurement gave no latency"
        else:
            latency = float(measurement["latency_us"])
            method = "a CUDA graph's replays" if measurement.get("method") == "graph" else "back-to-back calls"
            nccl = f", NCCL {measurement['nccl_version']}" if measurement.get("nccl_version") else ""
            settings = measurement.get("environment_after_init", measurement.get("environment")) or {}
            shown = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()) if k != "NCCL_VERSION") or "none"
            measured = Hardware(
                hardware.name,
                hardware.gpu_count,
                hardware.hbm_bandwidth / GB,
                hardware.pcie_bandwidth / GB,
                {**hardware.allreduce_latency_us, tp: latency},
                **hardware.extra,
            )
            detail = (
                f"measured by benchmark.yml on {tp} GPUs ({measurement.get('latency_bytes')} B, {method}{nccl}; "
                f"NCCL settings: {shown})"
            )
            return measured, {"latency_us": round(latency, 2), "source": "measured", "detail": detail}
    listed = hardware.allreduce_latency_us
    if tp in listed:
        origin = f"listed for {tp} GPUs"
    else:
        known = min(listed, key=lambda m: (abs(m - tp), m))
        origin = f"derived: the {known}-GPU figure ({listed[known]:g} us) scaled by ring steps to {tp} GPUs"
    detail = f"the hardware profile's ({origin})" + (f"; {why_not}" if why_not else "; not measured")
    latency = hardware.allreduce_latency(tp) / US
    return hardware, {"latency_us": round(latency, 2), "source": "hardware profile", "detail": detail}


class Model:
    """What the ceiling needs to know about a model; build it with ``Model.from_config``."""

    def __init__(
        self,
        *,
        name,
        layers,
        hidden_size,
        active_params,
        embedding_params,
        routed_params,
        quantized_params,
        quantization,
        experts_per_token=0,
        num_experts=0,
        dense_dtype="bf16",
        collectives_per_layer=DEFAULT_COLLECTIVES_PER_LAYER,
        router_params=0,
        router_dtype=None,
        kv_values_per_token=0,
        kv_heads=None,
        kv_sharded=True,
        replicated_params=0,
        replicated_quantized_params=0,
        total_routed_params=None,
    ):
        if active_params <= embedding_params:
            raise CeilingError(f"model {name}: active parameters must exceed the embedding table")
        if quantized_params > active_params - embedding_params:
            raise CeilingError(f"model {name}: quantized parameters exceed the active weights read per token")
        non_expert = active_params - embedding_params - routed_params
        if not 0 <= replicated_quantized_params <= replicated_params <= non_expert:
            raise CeilingError(f"model {name}: replicated parameters exceed the non-expert weights read per token")
        if not 0 <= router_params <= replicated_params - replicated_quantized_params:
            raise CeilingError(f"model {name}: the router exceeds the unquantized weights every rank keeps whole")
        if not valid_collectives_per_layer(collectives_per_layer):
            raise CeilingError(
                f"model {name}: collectives_per_layer {collectives_per_layer!r} is not a whole number of at least 1"
            )
        self.name = name
        self.layers = layers
        self.hidden_size = hidden_size
        self.active_params = float(active_params)
        self.embedding_params = float(embedding_params)
        self.routed_params = float(routed_params)
        self.quantized_params = float(quantized_params)
        self.quantization = quantization
        self.experts_per_token = experts_per_token or 0
        self.num_experts = num_experts or 0
        self.dense_dtype = dense_dtype
        self.collectives_per_layer = collectives_per_layer
        self.router_params = float(router_params)
        self.router_dtype = router_dtype or dense_dtype
        self.kv_values_per_token = kv_values_per_token
        self.kv_heads = kv_heads
        self.kv_sharded = kv_sharded
        self.replicated_params = float(replicated_params)
        self.replicated_quantized_params = float(replicated_quantized_params)
        self.total_routed_params = float(routed_params if total_routed_params is None else total_routed_params)
        bytes_per_param(quantization)
        bytes_per_param(dense_dtype)
        bytes_per_param(self.router_dtype)

    @classmethod
    def from_config(cls, config, facts):
        """Combine a checkpoint's ``config.json`` with the facts the config does not hold.

        ``facts``: ``name``; ``active_params_b`` (activated parameters per token in billions, the input
        embedding and the output head included: a model card that counts neither, as GLM-5's, needs both
        added, docs/ceiling.md); ``quantization`` (key of ``BYTES_PER_PARAM``);
        ``quantized`` (``routed_experts``: only the routed experts are stored quantized, the rest BF16;
        ``all_linear``: every linear layer except the output head is quantized; or a number of billions);
        optional ``dense_dtype`` (default ``bf16``) and ``collectives_per_layer`` (default: the architecture's
        count in ``ARCHITECTURES``, else ``DEFAULT_COLLECTIVES_PER_LAYER``).

        The parameters every rank keeps whole come from ``modelconfig.replicated_params``. The router stays
        in high precision in every checkpoint (at the width ``ARCHITECTURES`` gives, else the dense width);
        with ``all_linear`` the MLA down-projections and the indexer are quantized like every other linear
        layer.
        """
        cfg = modelconfig.text_config(config)
        try:
            layers = cfg["num_hidden_layers"]
            hidden = cfg["hidden_size"]
            vocab = cfg["vocab_size"]
        except KeyError as exc:
            raise CeilingError(f"config.json lacks {exc.args[0]}") from None
        if "active_params_b" not in facts or "quantization" not in facts:
            raise CeilingError("model facts need active_params_b and quantization")
        active = float(facts["active_params_b"]) * 1e9
        embedding = float(vocab * hidden)
        k = modelconfig.experts_per_token(cfg) or 0
        inter = modelconfig.expert_intermediate_size(cfg) or 0
        expert = 3 * hidden * inter * modelconfig.moe_layers(cfg)
        routed = float(k * expert)
        parts = modelconfig.replicated_params(cfg)
        replicated = float(sum(parts.values()))
        replicated_quantized = 0.0
        scope = facts.get("quantized", "routed_experts")
        if facts["quantization"] in ("bf16", "fp16"):
            quantized = 0.0
        elif scope == "routed_experts":
            quantized = routed
        elif scope == "all_linear":
            head = 0 if config.get("tie_word_embeddings") else embedding
            quantized = active - embedding - head - parts["router"]
            replicated_quantized = float(parts["mla_down"] + parts["indexer"])
        else:
            quantized = float(scope) * 1e9
        kv_values, kv_heads, sharded = kv_layout(cfg)
        _, engine = architecture_facts(config)
        collectives = facts.get("collectives_per_layer")
        if collectives is None:
            collectives = engine.get("collectives_per_layer", DEFAULT_COLLECTIVES_PER_LAYER)
        return cls(
            name=facts.get("name", cfg.get("model_type", "model")),
            layers=layers,
            hidden_size=hidden,
            active_params=active,
            embedding_params=embedding,
            routed_params=routed,
            quantized_params=quantized,
            quantization=facts["quantization"],
            experts_per_token=k,
            num_experts=modelconfig.num_experts(cfg) or 0,
            dense_dtype=facts.get("dense_dtype", "bf16"),
            collectives_per_layer=collectives,
            router_params=float(parts["router"]),
            router_dtype=engine.get("router_dtype"),
            kv_values_per_token=kv_values,
            kv_heads=kv_heads,
            kv_sharded=sharded,
            replicated_params=replicated,
            replicated_quantized_params=replicated_quantized,
            total_routed_params=float((modelconfig.num_experts(cfg) or 0) * expert),
        )

    def weight_bytes(self):
        """Bytes of weights one token reads, all GPUs together: ``(routed, other)``."""
        q = bytes_per_param(self.quantization)
        d = bytes_per_param(self.dense_dtype)
        routed_quantized = min(self.routed_params, self.quantized_params)
        routed = routed_quantized * q + (self.routed_params - routed_quantized) * d
        other_quantized = self.quantized_params - routed_quantized
        other_dense = self.active_params - self.embedding_params - self.routed_params - other_quantized
        router = min(self.router_params, other_dense)
        other = other_quantized * q + (other_dense - router) * d + router * bytes_per_param(self.router_dtype)
        return routed, other

    def replicated_bytes(self):
        """Bytes of the weights every tensor-parallel rank holds whole (and reads whole for each token)."""
        q = bytes_per_param(self.quantization)
        d = bytes_per_param(self.dense_dtype)
        r = bytes_per_param(self.router_dtype)
        dense = self.replicated_params - self.replicated_quantized_params - self.router_params
        return self.replicated_quantized_params * q + dense * d + self.router_params * r

    def stored_bytes(self):
        """Bytes of all the weights (every expert, the input embedding), all GPUs together: an estimate of
        the checkpoint's size from the active parameters and the config."""
        routed, other = self.weight_bytes()
        per_routed = routed / self.routed_params if self.routed_params else 0.0
        return self.total_routed_params * per_routed + other + self.embedding_params * bytes_per_param(self.dense_dtype)

    def kv_bytes_per_gpu(self, tp, dtype_bytes):
        """KV-cache bytes one GPU reads per token of context."""
        return kv_bytes_per_gpu((self.kv_values_per_token, self.kv_heads, self.kv_sharded), tp, dtype_bytes)


def kv_layout(cfg):
    """``(values per token, KV heads, sharded)`` of a language model's KV cache, from its config.

    MLA models cache one latent (``kv_lora_rank + rope_dim`` per layer) that every tensor-parallel rank keeps
    whole; the others cache keys and values per KV head, split over the ranks. Only softmax-attention layers
    count (hybrid models have fewer).
    """
    if modelconfig.is_mla(cfg):
        values = modelconfig.attention_layers(cfg) * (cfg["kv_lora_rank"] + cfg.get("qk_rope_head_dim", 0))
        return values, None, False
    heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    return modelconfig.attention_layers(cfg) * 2 * heads * modelconfig.head_dim(cfg), heads, True


def kv_bytes_per_gpu(layout, tp, dtype_bytes):
    """KV-cache bytes one GPU holds (and reads) per token of context, for a ``kv_layout``."""
    values, heads, sharded = layout
    if not values:
        return 0.0
    if not sharded:
        return values * dtype_bytes
    heads_per_gpu = -(-heads // tp)  # heads are replicated when there are fewer than tp
    return values * heads_per_gpu / heads * dtype_bytes


def expected_max_experts(k, num_experts, groups):
    """Expected number of a token's k distinct routed experts on the busiest of ``groups`` GPUs.

    Experts are spread evenly (num_experts / groups per GPU) and a token picks k distinct experts
    uniformly: the count per GPU is multivariate hypergeometric. Exact, with integers:
    P(max <= m) = [x^k] (sum_{i<=m} C(s, i) x^i)^groups / C(E, k).
    """
    if groups <= 1 or k <= 0:
        return float(k)
    per_group = num_experts // groups
    if per_group * groups != num_experts or per_group < 1:
        raise CeilingError(f"{num_experts} experts do not split evenly over {groups} GPUs")
    total = comb(num_experts, k)
    expected = 0.0
    for m in range(k):  # E[max] = sum_{m>=0} P(max > m)
        poly = [1]
        term = [comb(per_group, i) for i in range(min(m, per_group) + 1)]
        for _ in range(groups):
            nxt = [0] * min(len(poly) + len(term) - 1, k + 1)
            for i, a in enumerate(poly):
                if not a:
                    continue
                for j, b in enumerate(term):
                    if i + j <= k:
                        nxt[i + j] += a * b
            poly = nxt
        at_most_m = poly[k] if len(poly) > k else 0
        expected += 1.0 - at_most_m / total
    return expected


def decode_ceiling(model, hardware, tp, *, expert_parallel=False, context_tokens=0, kv_dtype="bf16"):
    """Single-stream decode ceiling of ``model`` on ``tp`` GPUs of ``hardware``.

    Returns a dict (all times in milliseconds) with ``tokens_per_s`` and the terms it came from.
    """
    if tp < 1 or tp > hardware.gpu_count:
        raise CeilingError(f"tensor-parallel size {tp} is outside 1..{hardware.gpu_count} GPUs of {hardware.name}")
    routed, other = model.weight_bytes()
    if expert_parallel and model.experts_per_token and tp > 1:
        busiest = expected_max_experts(model.experts_per_token, model.num_experts, tp)
        routed_per_gpu = routed / model.experts_per_token * busiest
    else:
        busiest = model.experts_per_token / tp if model.experts_per_token else 0.0
        routed_per_gpu = routed / tp
    replicated = model.replicated_bytes() if tp > 1 else 0.0
    weights_per_gpu = routed_per_gpu + (other - replicated) / tp + replicated
    kv_per_gpu = model.kv_bytes_per_gpu(tp, bytes_per_param(kv_dtype)) * context_tokens
    memory_s = (weights_per_gpu + kv_per_gpu) / hardware.hbm_bandwidth
    collectives = model.layers * model.collectives_per_layer if tp > 1 else 0
    message = model.hidden_size * 2  # one token's BF16 activations
    per_collective = hardware.allreduce_latency(tp) + (
        2 * (tp - 1) / tp * message / hardware.pcie_bandwidth if tp > 1 else 0.0
    )
    comm_s = collectives * per_collective
    total = memory_s + comm_s
    return {
        "model": model.name,
        "hardware": hardware.name,
        "tp": tp,
        "expert_parallel": bool(expert_parallel),
        "context_tokens": context_tokens,
        "weights_gb_per_token": round((routed + other) / GB, 3),
        "weights_gb_per_gpu": round(weights_per_gpu / GB, 3),
        "replicated_gb_per_gpu": round(replicated / GB, 3),
        "kv_gb_per_gpu": round(kv_per_gpu / GB, 3),
        "routed_experts_on_busiest_gpu": round(busiest, 3),
        "memory_ms": round(memory_s * 1e3, 3),
        "collectives_per_layer": model.collectives_per_layer,
        "collectives": collectives,
        "collective_us": round(per_collective / US, 2),
        "comm_ms": round(comm_s * 1e3, 3),
        "per_token_ms": round(total * 1e3, 3),
        "tokens_per_s": round(1.0 / total, 1),
        "memory_only_tokens_per_s": round(1.0 / memory_s, 1),
    }
