"""Backend combinations known to fail, as data owned by the inference code: ``rules()`` is the one loader.

Backend combinations known to fail on a compute capability, checked at plan time (before anything is
installed or started). Each rule: id; engine (vllm | sglang | any); compute_capability (list; absent:
every GPU); when (all conditions must hold; a condition names a `flag` (as on the command line, without
dashes; `default` is the value the engine picks when the flag is left out), an `env` variable, or a
`model` property (`quantization`: the checkpoint's weight format, from its config or else the service's
model.quantization; `linear_attention`: true when some layers use linear attention, known only from the
checkpoint's config.json), with one of `in`, `not_in`, `prefix`, `contains`, `present`);
engine_version_below (the rule applies only before this engine version); engine_version_max (the rule applies
only up to and including this version: the last one it is known for, where a later release is reported to
work); reason (what fails, as the reference deployment or the source saw it); fix; source.
Every flag that selects the same backend is named in the condition: `overridden_by` lists flags that replace
`flag` for a part of the work (SGLang's prefill- and decode-attention-backend: `flag`, or its default, counts
for each part left to it); `also` lists flags that select it under another name or for other work (vLLM's
attention-config.backend, a key of the --attention-config mapping; SGLang's speculative draft); the condition
holds when it holds for any value the engine uses.

The role's plan module (on the guest) and the controller's validation play (playbooks/preflight.yml) both read
the rules through ``rules()``, with a site's own rules (``inference_service_known_bad_extra``) added after these;
each rule names its source.
"""

from __future__ import annotations

# The flags that choose an attention backend (a condition adds its values): vLLM's, and SGLang's for every part of
# the work (prefill, decode, the speculative draft).
VLLM_ATTENTION_BACKEND = {"flag": "attention-backend", "also": ["attention-config.backend"]}
SGLANG_ATTENTION_BACKEND = {
    "flag": "attention-backend",
    "overridden_by": ["prefill-attention-backend", "decode-attention-backend"],
    "also": ["speculative-draft-attention-backend"],
}

RULES = (
    {
        "id": "sm120-vllm-mla-backend",
        "engine": "vllm",
        "compute_capability": ["12.0"],
        "when": [
            {**VLLM_ATTENTION_BACKEND, "in": ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "CUTLASS_MLA"]},
        ],
        "reason": (
            "this MLA attention backend has no kernels for SM120 and fails at load; TRITON_MLA is the only MLA backend "
            "that runs on compute capability 12.0"
        ),
        "fix": "args: {attention-backend: TRITON_MLA}",
        "source": "vllm platforms/cuda.py backend priorities; vllm#35577",
    },
    {
        "id": "vllm-attention-backend-env",
        "engine": "vllm",
        "when": [
            {
                "env": "VLLM_ATTENTION_BACKEND",
                "present": True,
            },
        ],
        "reason": (
            "VLLM_ATTENTION_BACKEND is deprecated and later ignored, so the engine would silently pick another backend "
            "(on SM120 with MLA a failing one)"
        ),
        "fix": "remove it from env and set args: {attention-backend: <value>}",
        "source": "vllm#26315, vllm#50292",
    },
    {
        "id": "sm120-vllm-triton-mla-fp8-kv",
        "engine": "vllm",
        "compute_capability": ["12.0"],
        "engine_version_below": "0.17.0",
        "when": [
            {**VLLM_ATTENTION_BACKEND, "in": ["TRITON_MLA"]},
            {
                "flag": "kv-cache-dtype",
                "prefix": "fp8",
            },
        ],
        "reason": "TRITON_MLA raises NotImplementedError for an FP8 KV cache before vllm#34597",
        "fix": "kv_cache_dtype: bf16, or install a vLLM that contains vllm#34597 and set engine_version",
        "source": "vllm#34597",
    },
    {
        "id": "sm120-sglang-fa3",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {**SGLANG_ATTENTION_BACKEND, "in": ["fa3"]},
        ],
        "reason": (
            'the FA3 kernels of sgl-kernel are built for sm_90a only: "no kernel image is available" on Blackwell'
        ),
        "fix": "args: {attention-backend: triton}",
        "source": "sglang PR #22280",
    },
    {
        "id": "sm120-sglang-sm90-sm100-attention",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {**SGLANG_ATTENTION_BACKEND, "in": ["flashmla", "cutlass_mla", "trtllm_mla", "trtllm_mha", "fa4"]},
        ],
        "reason": (
            "this attention backend has kernels for SM90/SM100 only (FlashMLA is built for sm_90a/sm_100a; SM100 "
            "kernels assume 227 KB of shared memory per block, SM120 has about 99 KB: "
            '"Failed to set the allowed dynamic shared '
            'memory size")'
        ),
        "fix": "args: {attention-backend: triton}",
        "source": "sgl-kernel cmake/flashmla.cmake; sglang PR #24303",
    },
    {
        "id": "sm120-sglang-deepgemm-moe",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {
                "flag": "moe-runner-backend",
                "also": ["speculative-moe-runner-backend"],
                "in": ["deep_gemm"],
            },
        ],
        "reason": "DeepGEMM has no SM120 kernels",
        "fix": "args: {moe-runner-backend: flashinfer_cutlass}",
        "source": "sglang srt/environ.py (SGLANG_ENABLE_JIT_DEEPGEMM)",
    },
    {
        "id": "sm120-sglang-jit-deepgemm",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {
                "env": "SGLANG_ENABLE_JIT_DEEPGEMM",
                "not_in": ["0", "false"],
            },
        ],
        "reason": "SGLANG_ENABLE_JIT_DEEPGEMM defaults to true and DeepGEMM has no SM120 kernels",
        "fix": 'env: {SGLANG_ENABLE_JIT_DEEPGEMM: "0"}',
        "source": "sglang srt/environ.py",
    },
    {
        "id": "sm120-sglang-sm100-fp4-moe",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {
                "flag": "moe-runner-backend",
                "also": ["speculative-moe-runner-backend"],
                "in": ["flashinfer_trtllm"],
            },
        ],
        "reason": "the TensorRT-LLM FP4 MoE path is written for SM100 and does not run on SM120",
        "fix": "args: {moe-runner-backend: flashinfer_cutlass}",
        "source": (
            "AlexGS74/glm47-nvfp4-sm120 docs/sm120-blackwell-fp4-fixes.md; the reference deployment's SM120 matrix"
        ),
    },
    {
        "id": "sm120-sglang-cutedsl-fp4-moe",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {
                "flag": "moe-runner-backend",
                "in": ["flashinfer_cutedsl"],
            },
        ],
        "reason": (
            "the flashinfer_cutedsl FP4 MoE runs on SM120 but its output is garbage: the reference deployment's output "
            "checks found the service started and answering with garbage, so nothing at start stops it"
        ),
        "fix": "args: {moe-runner-backend: flashinfer_cutlass}",
        "source": "the reference deployment's SM120 backend matrix (found by restarts and output checks)",
    },
    {
        "id": "sm120-sglang-trtllm-fp4-gemm",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {
                "flag": "fp4-gemm-backend",
                "in": ["flashinfer_trtllm"],
            },
        ],
        "reason": "the TensorRT-LLM FP4 GEMM kernels are built for SM100 only",
        "fix": "args: {fp4-gemm-backend: flashinfer_cudnn} (CUDA 13 with cuDNN 9.15+), or flashinfer_cutlass",
        "source": "sglang server_args.py --fp4-gemm-backend",
    },
    {
        "id": "sm120-sglang-nvfp4-moe-auto",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {
                "model": "quantization",
                "in": ["nvfp4"],
            },
            {
                "flag": "moe-runner-backend",
                "default": "auto",
                "in": ["auto"],
            },
        ],
        "reason": (
            'with NVFP4 weights on SM120 the MoE runner backend "auto" (SGLang\'s default when moe-runner-backend is '
            "left "
            "out) produces NaN; flashinfer_cutlass works, triton works but is slower"
        ),
        "fix": "args: {moe-runner-backend: flashinfer_cutlass}",
        "source": "the reference deployment's SM120 backend matrix (found by restarts and output checks)",
    },
    {
        "id": "sm120-sglang-flashinfer-linear-attention",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "engine_version_max": "0.5.9",
        "when": [
            {
                "model": "linear_attention",
                "present": True,
            },
            {
                "flag": "attention-backend",
                "default": "flashinfer",
                "overridden_by": ["prefill-attention-backend", "decode-attention-backend"],
                "in": ["flashinfer"],
            },
        ],
        "reason": (
            "the flashinfer attention backend is incompatible with hybrid linear attention (Qwen3.5's Gated DeltaNet "
            "layers) in SGLang 0.5.9 and earlier: the reference deployment found it so with Qwen3.5 and used triton; "
            "SGLang picks flashinfer on SM120 when attention-backend is left out"
        ),
        "fix": "args: {attention-backend: triton}",
        "source": (
            "the reference deployment's SM120 backend matrix; sglang server_args.py (default attention backend, "
            "and the "
            "prefill and decode backends that replace it); issue 29 (a later SGLang recipe runs flashinfer with "
            "Qwen3.5 "
            "on SM120)"
        ),
    },
    {
        "id": "sm120-sglang-flashinfer-allreduce-fusion",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {
                "flag": "enable-flashinfer-allreduce-fusion",
                "present": True,
            },
        ],
        "reason": (
            "FlashInfer's all-reduce fusion (TensorRT-LLM kernels, all-reduce fused with the residual RMSNorm) "
            "supports "
            "SM90 and SM100 only; SGLang turns it on by itself only there"
        ),
        "fix": "remove enable-flashinfer-allreduce-fusion from args",
        "source": "sglang server_args.py (TRTLLM AllReduce Fusion supports SM90/100); issue 13 review",
    },
    {
        "id": "sm120-sglang-piecewise-cuda-graph",
        "engine": "sglang",
        "compute_capability": ["12.0"],
        "when": [
            {
                "flag": "enable-piecewise-cuda-graph",
                "present": True,
            },
        ],
        "reason": (
            "piecewise CUDA graphs (an experimental SGLang feature that compiles the prefill graph) are known to "
            "fail on "
            "SM120"
        ),
        "fix": "remove enable-piecewise-cuda-graph from args (decode keeps its ordinary CUDA graphs)",
        "source": 'the reference deployment\'s review (issue 13); sglang server_args.py ("Experimental feature")',
    },
    {
        "id": "sglang-oneshot-allreduce-expandable-segments",
        "engine": "sglang",
        "when": [
            {
                "flag": "enable-pcie-oneshot-allreduce",
                "present": True,
            },
            {
                "env": "PYTORCH_CUDA_ALLOC_CONF",
                "contains": "expandable_segments:True",
            },
        ],
        "reason": (
            "the community PCIe one-shot all-reduce patch conflicts with "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        ),
        "fix": "remove expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF, or drop enable-pcie-oneshot-allreduce",
        "source": "rtx6kpro wiki inference-engines/sglang.md",
    },
)
FIELDS = ("id", "reason", "fix", "source")


def rules(extra=()):
    """The built-in rules followed by a site's own, each checked for the fields every rule has."""
    out = [dict(rule) for rule in RULES]
    for index, rule in enumerate(extra or ()):
        if not isinstance(rule, dict) or any(not rule.get(name) for name in FIELDS):
            raise ValueError(
                f"inference_service_known_bad_extra[{index}]: a rule needs {', '.join(FIELDS)} (and a when list); "
                f"got {rule!r}"
            )
        out.append(dict(rule))
    return out
