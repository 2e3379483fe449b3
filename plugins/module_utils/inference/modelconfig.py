"""Read the dimensions that matter for serving from a Hugging Face checkpoint's configuration.

Multimodal checkpoints (Qwen3.5, Kimi-K2.5) keep the language model under ``text_config``; the
quantization settings live in ``config.json`` (``quantization_config``) or, for NVIDIA ModelOpt
checkpoints, in ``hf_quant_config.json``. Every accessor here returns ``None`` for a dimension the
architecture does not have, so callers check only what exists.
"""

from __future__ import annotations

import json
import os

CONFIG_FILE = "config.json"
QUANT_CONFIG_FILE = "hf_quant_config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"


def load_checkpoint(path):
    """Return ``(config, quant_config)`` read from a checkpoint directory; ``quant_config`` may be None.

    Raises ``FileNotFoundError`` when ``config.json`` is missing and ``ValueError`` when a file is not JSON.
    """
    config = _read_json(os.path.join(path, CONFIG_FILE))
    quant_path = os.path.join(path, QUANT_CONFIG_FILE)
    quant = _read_json(quant_path) if os.path.exists(quant_path) else None
    return config, quant


def _read_json(path):
    with open(path, encoding="utf-8") as handle:
        try:
            return json.load(handle)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc


def text_config(config):
    """The language model's part of a (possibly multimodal) configuration."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        merged = dict(inner)
        # A top-level quantization_config applies to the language model too.
        if "quantization_config" in config and "quantization_config" not in merged:
            merged["quantization_config"] = config["quantization_config"]
        return merged
    return config


def _first(cfg, *names):
    for name in names:
        value = cfg.get(name)
        if value is not None:
            return value
    return None


def num_experts(cfg):
    return _first(cfg, "n_routed_experts", "num_experts", "num_local_experts")


def experts_per_token(cfg):
    return _first(cfg, "num_experts_per_tok", "moe_topk", "num_experts_per_token")


def expert_intermediate_size(cfg):
    """Intermediate size of one routed expert (MiniMax-M2 calls it ``intermediate_size``)."""
    if not num_experts(cfg):
        return None
    return _first(cfg, "moe_intermediate_size", "intermediate_size")


def dense_intermediate_size(cfg):
    """Intermediate size of dense MLP layers, or None when every layer is MoE with no dense MLP."""
    if not num_experts(cfg):
        return cfg.get("intermediate_size")
    if cfg.get("moe_intermediate_size") is None:
        return None  # intermediate_size is the expert size (MiniMax-M2)
    if cfg.get("first_k_dense_replace") or cfg.get("mlp_only_layers"):
        return cfg.get("intermediate_size")
    return None


def shared_expert_intermediate_size(cfg):
    size = cfg.get("shared_expert_intermediate_size")
    if size:
        return size
    shared = cfg.get("n_shared_experts") or 0
    moe = cfg.get("moe_intermediate_size")
    return shared * moe if shared and moe else None


def moe_layers(cfg):
    """Number of decoder layers that carry routed experts."""
    layers = cfg["num_hidden_layers"]
    if not num_experts(cfg):
        return 0
    dense = cfg.get("first_k_dense_replace") or 0
    only_mlp = len(cfg.get("mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step") or 1
    return (layers - dense - only_mlp) // step


def attention_layers(cfg):
    """Layers with softmax attention (and so a growing KV cache); hybrid models have fewer."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types:
        return sum(1 for kind in types if kind == "full_attention")
    interval = cfg.get("full_attention_interval")
    if interval:
        return layers // interval
    return layers


def has_linear_attention(cfg):
    """Whether some layers use linear attention (Qwen3.5's Gated DeltaNet), not softmax attention."""
    types = cfg.get("layer_types") or []
    return bool(cfg.get("linear_num_key_heads") or any(kind == "linear_attention" for kind in types))


def head_dim(cfg):
    if cfg.get("head_dim"):
        return cfg["head_dim"]
    return cfg["hidden_size"] // cfg["num_attention_heads"]


def is_mla(cfg):
    return bool(cfg.get("kv_lora_rank"))


def replicated_params(cfg):
    """Parameters vLLM and SGLang keep whole on every tensor-parallel rank, by part.

    ``mla_down``: the MLA down-projections (``q_a_proj`` and ``kv_a_proj_with_mqa``, fused in SGLang), which
    are replicated linears; ``router``: the MoE gate (``hidden x experts`` per MoE layer) and Qwen's one-output
    shared-expert gate; ``indexer``: the sparse-attention indexer of DeepSeek-V3.2-style models (GLM-5:
    ``wq_b``, ``wk``, ``weights_proj``). Everything else is split over the ranks.
    """
    hidden = cfg["hidden_size"]
    layers = cfg["num_hidden_layers"]
    out = {"mla_down": 0, "router": 0, "indexer": 0}
    q_lora = cfg.get("q_lora_rank") or 0
    if is_mla(cfg):
        out["mla_down"] = layers * hidden * (q_lora + cfg["kv_lora_rank"] + (cfg.get("qk_rope_head_dim") or 0))
        heads, dim = cfg.get("index_n_heads") or 0, cfg.get("index_head_dim") or 0
        if heads and dim and q_lora:
            out["indexer"] = layers * (q_lora * heads * dim + hidden * dim + hidden * heads)
    experts = num_experts(cfg)
    if experts:
        gate = hidden * experts + (hidden if cfg.get("shared_expert_intermediate_size") else 0)
        out["router"] = moe_layers(cfg) * gate
    return out


def checkpoint_bytes(path):
    """Bytes of the checkpoint's weights from ``model.safetensors.index.json`` (``metadata.total_size``), or None."""
    index = os.path.join(path, SAFETENSORS_INDEX)
    if not os.path.exists(index):
        return None
    total = (_read_json(index).get("metadata") or {}).get("total_size")
    return int(total) if isinstance(total, int | float) and total > 0 else None


def quantization(config, quant_config=None):
    """Normalised description of a checkpoint's weight quantization.

    Returns a dict with ``method`` (``fp8``, ``nvfp4``, ``int4``, ``mxfp4`` or the raw method name),
    ``block`` (FP8 weight block ``[n, k]`` or None), ``group_size`` (or None) and ``kv_cache``
    (the KV-cache quantization the checkpoint declares, or None).
    """
    cfg = text_config(config)
    qc = cfg.get("quantization_config") or {}
    out = {"method": None, "block": None, "group_size": None, "kv_cache": None}
    if quant_config:  # NVIDIA ModelOpt: hf_quant_config.json {"quantization": {...}}
        q = quant_config.get("quantization") or quant_config
        algo = str(q.get("quant_algo") or "").lower()
        out["method"] = {"nvfp4": "nvfp4", "fp8": "fp8", "w4a16_awq": "int4"}.get(algo, algo or None)
        out["group_size"] = q.get("group_size")
        out["kv_cache"] = q.get("kv_cache_quant_algo")
    method = str(qc.get("quant_method") or "").lower()
    if method == "fp8":
        out["method"] = "fp8"
        out["block"] = qc.get("weight_block_size")
    elif method == "modelopt":
        algo = str(qc.get("quant_algo") or "").lower()
        out["method"] = out["method"] or ("nvfp4" if algo == "nvfp4" else algo or None)
        out["group_size"] = out["group_size"] or qc.get("group_size")
        out["kv_cache"] = out["kv_cache"] or qc.get("kv_cache_quant_algo")
    elif method == "compressed-tensors":
        for group in (qc.get("config_groups") or {}).values():
            weights = group.get("weights") or {}
            bits = weights.get("num_bits")
            kind = weights.get("type")
            if bits == 4 and kind == "int":
                out["method"] = "int4"
            elif bits == 4 and kind == "float":
                out["method"] = "nvfp4"
            elif bits == 8 and kind == "float":
                out["method"] = "fp8"
            out["group_size"] = weights.get("group_size") or out["group_size"]
            block = weights.get("block_structure")
            if block:
                out["block"] = block
        scheme = qc.get("kv_cache_scheme")
        if scheme:
            out["kv_cache"] = f"{scheme.get('type', '')}{scheme.get('num_bits', '')}".upper() or "declared"
    elif method and not out["method"]:
        out["method"] = method
        out["group_size"] = qc.get("group_size")
    if out["kv_cache"] is None and qc.get("kv_cache_quant_algo"):
        out["kv_cache"] = qc["kv_cache_quant_algo"]
    return out
