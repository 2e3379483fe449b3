"""Plan-time checks: every known-bad case is refused with its message; every reference service passes."""

import copy
import re

import pytest
from inference import known_bad, modelconfig
from inference.plan import (
    check_known_bad,
    flag_value,
    format_refusals,
    parse_version,
    plan_service,
    version_after,
    version_below,
)
from inference_refdata import MODELS, REFERENCE, ROLE

RULES = known_bad.rules()


def plan(service, model=None, cc="12.0", version=None, **kw):
    config, quant = modelconfig.load_checkpoint(MODELS / model) if model else (None, None)
    return plan_service(
        service,
        config=config,
        quant_config=quant,
        known_bad=RULES,
        compute_capability=cc,
        engine_version=version,
        gpu_count=8,
        **kw,
    )


def refused(result):
    return {r["id"]: r for r in result["refusals"]}


def variant(services, service_name, **changes):
    service = copy.deepcopy(services[service_name])
    for key, value in changes.items():
        if key in ("args", "env"):
            service.setdefault(key, {}).update(value)
        else:
            service[key] = value
    return service


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_services_are_accepted(services, name):
    result = plan(services[name], REFERENCE[name])
    assert result["refusals"] == [], format_refusals(name, result["refusals"])


def test_rules_are_complete_data():
    ids = [r["id"] for r in RULES]
    assert len(ids) == len(set(ids))
    for rule in RULES:
        assert {"id", "reason", "fix", "when"} <= set(rule), rule["id"]
        assert rule.get("engine", "any") in ("any", "vllm", "sglang"), rule["id"]


# --- the SM120 matrix: one case per rule, each asserting its message -------------------------------

# One row a case (a line that starts with spaces goes on with the row above): the reference service; what the
# case sets on it (args FLAG=VALUE, a FLAG alone is true; env NAME=VALUE; several joined by ", "); the rule that
# must refuse it; words of its reason; words of its fix.
SM120_TABLE = """
kimi-k25 | args attention-backend=FLASHMLA | sm120-vllm-mla-backend | no kernels for SM120 | TRITON_MLA
kimi-k25 | args attention-backend=FLASHINFER_MLA | sm120-vllm-mla-backend | TRITON_MLA is the only MLA | TRITON_MLA
kimi-k25 | env VLLM_ATTENTION_BACKEND=TRITON_MLA | vllm-attention-backend-env | deprecated and later ignored
    | attention-backend
qwen35 | args attention-backend=fa3 | sm120-sglang-fa3 | sm_90a only | triton
qwen35 | args moe-runner-backend=auto | sm120-sglang-nvfp4-moe-auto | produces NaN
    | moe-runner-backend: flashinfer_cutlass
qwen35 | args attention-backend=flashinfer | sm120-sglang-flashinfer-linear-attention | Gated DeltaNet
    | attention-backend: triton
qwen35 | args enable-flashinfer-allreduce-fusion | sm120-sglang-flashinfer-allreduce-fusion | SM90 and SM100 only
    | remove enable-flashinfer-allreduce-fusion
qwen35 | args enable-piecewise-cuda-graph | sm120-sglang-piecewise-cuda-graph | known to fail on SM120
    | remove enable-piecewise-cuda-graph
qwen35 | args attention-backend=flashmla | sm120-sglang-sm90-sm100-attention | 99 KB | triton
qwen35 | args attention-backend=trtllm_mha | sm120-sglang-sm90-sm100-attention | SM90/SM100 only | triton
qwen35 | args moe-runner-backend=deep_gemm | sm120-sglang-deepgemm-moe | DeepGEMM has no SM120 | flashinfer_cutlass
qwen35 | env SGLANG_ENABLE_JIT_DEEPGEMM=1 | sm120-sglang-jit-deepgemm | defaults to true
    | SGLANG_ENABLE_JIT_DEEPGEMM: "0"
qwen35 | args moe-runner-backend=flashinfer_trtllm | sm120-sglang-sm100-fp4-moe | written for SM100 | flashinfer_cutlass
qwen35 | args moe-runner-backend=flashinfer_cutedsl | sm120-sglang-cutedsl-fp4-moe
    | runs on SM120 but its output is garbage | moe-runner-backend: flashinfer_cutlass
qwen35 | args fp4-gemm-backend=flashinfer_trtllm | sm120-sglang-trtllm-fp4-gemm | SM100 only | flashinfer_cudnn
qwen35 | args enable-pcie-oneshot-allreduce, env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    | sglang-oneshot-allreduce-expandable-segments | conflicts with PYTORCH_CUDA_ALLOC_CONF | expandable_segments
"""


def sm120_cases(table):
    """(service, changes for variant(), rule, reason words, fix words) for each row of the table."""
    rows = re.sub(r"\n\s+", " ", table.strip()).splitlines()
    for row in rows:
        name, sets, rule, reason, fix = (cell.strip() for cell in row.split("|"))
        changes = {}
        for setting in sets.split(", "):
            kind, assignment = setting.split(" ", 1)
            key, equals, value = assignment.partition("=")
            changes.setdefault(kind, {})[key] = value if equals else True
        yield name, changes, rule, reason, fix


SM120_CASES = list(sm120_cases(SM120_TABLE))


@pytest.mark.parametrize("case", SM120_CASES, ids=[c[2] for c in SM120_CASES])
def test_known_bad_combination_is_refused_with_reason_and_fix(services, case):
    name, changes, rule, reason, fix = case
    result = plan(variant(services, name, **changes), REFERENCE[name])
    hit = refused(result).get(rule)
    assert hit, f"{rule} not refused: {result['refusals']}"
    assert reason in hit["reason"]
    assert fix in hit["fix"]
    assert rule in {r["id"] for r in RULES}


def test_every_rule_has_a_refusal_case():
    assert {r["id"] for r in RULES} - {c[2] for c in SM120_CASES} == {"sm120-vllm-triton-mla-fp8-kv"}


def test_jit_deepgemm_missing_env_is_refused(services):
    service = copy.deepcopy(services["qwen35"])
    del service["env"]["SGLANG_ENABLE_JIT_DEEPGEMM"]
    assert "sm120-sglang-jit-deepgemm" in refused(plan(service, REFERENCE["qwen35"]))


def without_arg(services, name, flag):
    service = copy.deepcopy(services[name])
    del service["args"][flag]
    return service


def test_moe_runner_backend_left_out_with_nvfp4_is_refused(services):
    """SGLang's default MoE runner backend is auto: leaving the flag out is the same NaN."""
    hit = refused(plan(without_arg(services, "qwen35", "moe-runner-backend"), REFERENCE["qwen35"]))
    assert "left out" in hit["sm120-sglang-nvfp4-moe-auto"]["reason"]


def test_moe_runner_backend_auto_is_accepted_without_nvfp4(services):
    # the quantization comes from the checkpoint; without one, from the service's model.quantization
    service = variant(services, "qwen35", args={"moe-runner-backend": "auto"})
    service["model"]["quantization"] = "fp8"
    assert "sm120-sglang-nvfp4-moe-auto" not in refused(plan(service))
    service["model"]["quantization"] = "nvfp4"
    assert "sm120-sglang-nvfp4-moe-auto" in refused(plan(service))


def test_attention_backend_left_out_for_linear_attention_is_refused(services):
    """SGLang picks flashinfer on SM120 when attention-backend is left out."""
    hit = refused(plan(without_arg(services, "qwen35", "attention-backend"), REFERENCE["qwen35"]))
    assert "left out" in hit["sm120-sglang-flashinfer-linear-attention"]["reason"]


def test_flashinfer_attention_is_accepted_for_models_without_linear_attention(services):
    service = variant(services, "minimax-m25", engine="sglang", args={"attention-backend": "flashinfer"})
    service["env"] = {"SGLANG_ENABLE_JIT_DEEPGEMM": "0"}
    assert plan(service, REFERENCE["minimax-m25"])["refusals"] == []
    # without the checkpoint's config nothing tells linear attention: the rule waits for the role's plan
    assert "sm120-sglang-flashinfer-linear-attention" not in refused(plan(services["qwen35"]))


def test_the_fa3_fix_does_not_suggest_a_backend_that_is_refused(services):
    service = variant(services, "qwen35", args={"attention-backend": "fa3"})
    fix = refused(plan(service, REFERENCE["qwen35"]))["sm120-sglang-fa3"]["fix"]
    fixed = variant(services, "qwen35", args={"attention-backend": fix.split(": ")[-1].strip("}")})
    assert plan(fixed, REFERENCE["qwen35"])["refusals"] == []


def test_every_fix_of_a_known_bad_rule_is_accepted(services):
    """Applying a rule's suggested args to the reference service leaves it accepted."""
    for name, changes, rule, _, _ in SM120_CASES:
        hit = refused(plan(variant(services, name, **changes), REFERENCE[name]))[rule]
        if hit["fix"].startswith("args: {") and "(" not in hit["fix"]:
            flag, value = hit["fix"][len("args: {") : -1].split(": ")
            fixed = variant(services, name, **changes)
            fixed["args"][flag] = value
            assert rule not in refused(plan(fixed, REFERENCE[name])), (rule, hit["fix"])


def test_sm120_rules_do_not_apply_to_other_gpus(services):
    service = variant(services, "qwen35", args={"attention-backend": "fa3"})
    assert "sm120-sglang-fa3" not in refused(plan(service, REFERENCE["qwen35"], cc="9.0"))


def test_triton_mla_fp8_kv_is_version_gated(services):
    service = variant(services, "kimi-k25", kv_cache_dtype="fp8_e4m3", allow_fp8_kv_cache=True)
    old = plan(service, REFERENCE["kimi-k25"], version="0.16.0")
    assert "NotImplementedError" in refused(old)["sm120-vllm-triton-mla-fp8-kv"]["reason"]
    assert "sm120-vllm-triton-mla-fp8-kv" not in refused(plan(service, REFERENCE["kimi-k25"], version="0.17.1"))
    unknown = plan(service, REFERENCE["kimi-k25"])
    assert "installed version is unknown" in refused(unknown)["sm120-vllm-triton-mla-fp8-kv"]["reason"]
    assert any("engine_version" in w for w in unknown["warnings"])


# --- every flag that selects the same backend ------------------------------------------------------


@pytest.mark.parametrize("phase", ["prefill-attention-backend", "decode-attention-backend"])
def test_flashinfer_for_one_phase_is_refused_for_linear_attention(services, phase):
    """attention-backend triton with flashinfer for prefill or decode alone still runs flashinfer there."""
    service = variant(services, "qwen35", args={phase: "flashinfer"})
    hit = refused(plan(service, REFERENCE["qwen35"], version="0.5.9"))["sm120-sglang-flashinfer-linear-attention"]
    assert f"({phase}: flashinfer)" in hit["reason"]
    assert hit["fix"] == f"args: {{attention-backend: triton}}; the same for {phase}, or remove it"
    service["args"][phase] = "triton"
    assert plan(service, REFERENCE["qwen35"], version="0.5.9")["refusals"] == []


def test_a_phase_left_to_the_default_attention_backend_is_refused(services):
    """prefill-attention-backend triton alone leaves decode to attention-backend, whose SM120 default is flashinfer."""
    service = without_arg(services, "qwen35", "attention-backend")
    service["args"]["prefill-attention-backend"] = "triton"
    hit = refused(plan(service, REFERENCE["qwen35"], version="0.5.9"))["sm120-sglang-flashinfer-linear-attention"]
    assert "left out" in hit["reason"] and hit["fix"] == "args: {attention-backend: triton}"
    service["args"]["decode-attention-backend"] = "triton"  # both phases chosen: the default is used nowhere
    assert plan(service, REFERENCE["qwen35"], version="0.5.9")["refusals"] == []


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"prefill-attention-backend": "fa3"}, "sm120-sglang-fa3"),
        ({"speculative-draft-attention-backend": "fa3"}, "sm120-sglang-fa3"),
        ({"decode-attention-backend": "trtllm_mha"}, "sm120-sglang-sm90-sm100-attention"),
        ({"speculative-moe-runner-backend": "deep_gemm"}, "sm120-sglang-deepgemm-moe"),
        ({"speculative-moe-runner-backend": "flashinfer_trtllm"}, "sm120-sglang-sm100-fp4-moe"),
    ],
)
def test_other_flags_that_select_a_refused_backend_are_refused(services, changes, rule):
    ((flag, value),) = changes.items()
    hit = refused(plan(variant(services, "qwen35", args=changes), REFERENCE["qwen35"], version="0.5.9"))[rule]
    assert f"({flag}: {value})" in hit["reason"]
    assert hit["fix"].endswith(f"; the same for {flag}, or remove it")


@pytest.mark.parametrize(
    "args",
    [
        {"attention-config": {"backend": "FLASHMLA"}},
        {"attention-config": '{"backend": "cutlass_mla"}'},
        {"attention-config.backend": "FLASHINFER_MLA"},
    ],
)
def test_vllm_attention_config_backend_is_the_attention_backend(services, args):
    service = without_arg(services, "kimi-k25", "attention-backend")
    service["args"].update(args)
    hit = refused(plan(service, REFERENCE["kimi-k25"]))["sm120-vllm-mla-backend"]
    assert "(attention-config.backend: " in hit["reason"]
    assert hit["fix"] == "args: {attention-backend: TRITON_MLA}; the same for attention-config.backend, or remove it"


def test_vllm_attention_config_with_triton_mla_is_accepted(services):
    service = without_arg(services, "kimi-k25", "attention-backend")
    service["args"]["attention-config"] = {"backend": "TRITON_MLA"}
    assert plan(service, REFERENCE["kimi-k25"])["refusals"] == []


def test_flag_values_read_a_key_of_a_mapping_flag():
    assert flag_value({"attention-config": {"backend": "X"}}, "attention-config.backend") == (True, "X")
    assert flag_value({"attention-config": '{"backend": "Y"}'}, "attention_config.backend") == (True, "Y")
    assert flag_value({"attention-config": "not json"}, "attention-config.backend") == (False, None)
    assert flag_value({"attention-config": {"other": 1}}, "attention-config.backend") == (False, None)
    assert flag_value({"x": False}, "x") == (False, None)


# --- engine-version bounds -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "applies"),
    [("0.5.8", True), ("0.5.9", True), ("0.5.9.post1", True), ("0.5.10rc1", False), ("0.5.10", False)],
)
def test_flashinfer_linear_attention_rule_stops_after_sglang_0_5_9(services, version, applies):
    service = variant(services, "qwen35", args={"attention-backend": "flashinfer"})
    found = refused(plan(service, REFERENCE["qwen35"], version=version))
    assert ("sm120-sglang-flashinfer-linear-attention" in found) is applies


def test_upper_bound_with_an_unknown_version_refuses_and_says_so(services):
    service = variant(services, "qwen35", args={"attention-backend": "flashinfer"})
    result = plan(service, REFERENCE["qwen35"])
    hit = refused(result)["sm120-sglang-flashinfer-linear-attention"]
    assert "(known up to sglang 0.5.9; the installed version is unknown)" in hit["reason"]
    assert (
        "sm120-sglang-flashinfer-linear-attention: set engine_version to lift this check if a release after 0.5.9 "
        "is installed"
    ) in result["warnings"]


def test_the_engine_honours_an_upper_bound_of_any_rule():
    rule = {
        "id": "r",
        "engine": "any",
        "engine_version_max": "1.2",
        "when": [{"flag": "x"}],
        "reason": "bad",
        "fix": "f",
    }
    service = {"engine": "vllm", "args": {"x": True}}
    assert [r["id"] for r in check_known_bad(service, [rule], engine_version="1.2.0")[0]] == ["r"]
    assert check_known_bad(service, [rule], engine_version="1.3")[0] == []
    both = {**rule, "engine_version_below": "1.0"}  # a range: from 1.0 on it no longer applies
    assert check_known_bad(service, [both], engine_version="1.1")[0] == []
    assert [r["id"] for r in check_known_bad(service, [both], engine_version="0.9")[0]] == ["r"]


def test_cutedsl_refusal_says_what_the_deployment_saw(services):
    service = variant(services, "qwen35", args={"moe-runner-backend": "flashinfer_cutedsl"})
    found = refused(plan(service, REFERENCE["qwen35"]))
    assert "sm120-sglang-sm100-fp4-moe" not in found  # it runs on SM120: not the "written for SM100" rule
    reason = found["sm120-sglang-cutedsl-fp4-moe"]["reason"]
    assert "does not run" not in reason
    assert "the reference deployment's output checks found the service started and answering with garbage" in reason


# --- expert parallel at concurrency 1 --------------------------------------------------------------


def test_expert_parallel_warns_with_the_ceiling_with_and_without_it(services, hardware):
    service = variant(services, "kimi-k25", expert_parallel=True)
    result = plan(service, REFERENCE["kimi-k25"], hardware=hardware)
    assert result["refusals"] == []
    warning = next(w for w in result["warnings"] if w.startswith("expert_parallel:"))
    assert "at TP 8 is 118.5 tok/s with expert parallel and 140.1 tok/s without it (15 % lower)" in warning
    assert "most of its 8 routed experts (2.575 on average, against 1 without it)" in warning


def test_minimax_tp8_expert_parallel_is_compared_with_the_tp_that_fits_without_it(services, hardware):
    """TP 8 without expert parallel is refused for MiniMax-M2.5 (the FP8 block): the comparison is TP 4."""
    service = variant(services, "minimax-m25", gpus=list(range(8)), tensor_parallel_size=8, expert_parallel=True)
    result = plan(service, REFERENCE["minimax-m25"], hardware=hardware)
    assert result["refusals"] == []
    (warning,) = [w for w in result["warnings"] if w.startswith("expert_parallel:")]
    assert (
        "at TP 8 is 134.0 tok/s with expert parallel and 247.8 tok/s without it at TP 4, the largest size that "
        "fits the model without it (46 % lower)"
    ) in warning


def test_expert_parallel_without_a_hardware_profile_says_what_is_missing(services):
    result = plan(variant(services, "kimi-k25", expert_parallel=True), REFERENCE["kimi-k25"])
    (warning,) = [w for w in result["warnings"] if w.startswith("expert_parallel:")]
    assert "lowers the single-stream speed (concurrency 1); no ceiling to say by how much" in warning
    assert "hardware profile lacks" in warning


def test_no_expert_parallel_warning_without_expert_parallel(services, hardware):
    for name in REFERENCE:
        assert not [w for w in plan(services[name], REFERENCE[name], hardware=hardware)["warnings"] if "expert" in w]


# --- collectives per layer in the service data -----------------------------------------------------


@pytest.mark.parametrize("value", [0, -2, 1.5, "3", True])
def test_collectives_per_layer_must_be_a_whole_number(services, value):
    service = copy.deepcopy(services["minimax-m25"])
    service["model"]["collectives_per_layer"] = value
    hit = refused(plan(service, REFERENCE["minimax-m25"]))["model.collectives_per_layer"]
    assert f"model.collectives_per_layer {value!r} is not a whole number of at least 1" in hit["reason"]


def test_collectives_per_layer_set_on_a_service_is_accepted(services):
    service = copy.deepcopy(services["minimax-m25"])
    service["model"]["collectives_per_layer"] = 3
    assert plan(service, REFERENCE["minimax-m25"])["refusals"] == []


# --- tensor parallel against config.json -----------------------------------------------------------


def test_minimax_tp8_refused_for_the_fp8_block(services):
    service = variant(services, "minimax-m25", gpus=list(range(8)), tensor_parallel_size=8)
    hit = refused(plan(service, REFERENCE["minimax-m25"]))["tp.expert_intermediate_size"]
    assert (
        "expert intermediate size 1536/8 = 192 per GPU is not a multiple of the FP8 weight block 128" in hit["reason"]
    )
    assert hit["fix"] == (
        "tensor_parallel_size 4 or tensor_parallel_size 8 with expert_parallel: true (each GPU holds whole experts)"
    )


def test_minimax_tp8_with_expert_parallel_is_accepted(services):
    service = variant(services, "minimax-m25", gpus=list(range(8)), tensor_parallel_size=8, expert_parallel=True)
    assert plan(service, REFERENCE["minimax-m25"])["refusals"] == []


def test_heads_that_do_not_divide_are_refused(services):
    service = variant(services, "minimax-m25", gpus=list(range(5)), tensor_parallel_size=5)
    reasons = " ".join(r["reason"] for r in plan(service, REFERENCE["minimax-m25"])["refusals"])
    assert "attention heads 48 is not divisible by TP 5" in reasons


def test_fewer_kv_heads_than_gpus_must_divide_the_tp_size(services, tmp_path):
    config = modelconfig.load_checkpoint(MODELS / REFERENCE["qwen35"])[0]
    config["text_config"]["num_key_value_heads"] = 3
    service = services["qwen35"]
    result = plan_service(service, config=config, known_bad=RULES, compute_capability="12.0", gpu_count=8)
    assert "TP 8 is not a multiple of the 3 KV heads" in refused(result)["tp.KV_heads"]["reason"]


def test_group_quantization_granule(services):
    config = modelconfig.load_checkpoint(MODELS / REFERENCE["kimi-k25"])[0]
    config["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 512
    service = variant(services, "kimi-k25", expert_parallel=False)
    result = plan_service(service, config=config, known_bad=RULES, compute_capability="12.0", gpu_count=8)
    assert "2048/8 = 256 per GPU is not a multiple of the int4 group 512" in " ".join(
        r["reason"] for r in result["refusals"]
    )


def test_missing_config_is_refused(services):
    hit = refused(plan(services["qwen35"]))["config"]
    assert "no config.json under /srv/models/Qwen3.5-397B-A17B-NVFP4: the model cannot be checked" in hit["reason"]


# --- KV cache --------------------------------------------------------------------------------------


def test_fp8_kv_cache_needs_opt_in(services):
    service = variant(services, "minimax-m25", kv_cache_dtype="fp8_e4m3")
    hit = refused(plan(service, REFERENCE["minimax-m25"]))["kv_cache.quantized"]
    assert "quantizes the KV cache" in hit["reason"]
    assert "allow_fp8_kv_cache: true" in hit["fix"]
    service["allow_fp8_kv_cache"] = True
    assert plan(service, REFERENCE["minimax-m25"])["refusals"] == []


def test_auto_kv_cache_with_a_checkpoint_that_declares_fp8_is_refused(services):
    service = variant(services, "qwen35", kv_cache_dtype="auto")
    hit = refused(plan(service, REFERENCE["qwen35"]))["kv_cache.declared"]
    assert "declares a FP8 KV cache" in hit["reason"]
    assert hit["fix"].startswith("kv_cache_dtype: bf16")


def test_auto_kv_cache_without_declaration_is_accepted(services):
    service = variant(services, "minimax-m25", kv_cache_dtype="auto")
    assert plan(service, REFERENCE["minimax-m25"])["refusals"] == []


# --- service data ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "ident", "text"),
    [
        ({"args": {"kv-cache-dtype": "fp8"}}, "args.kv-cache-dtype", "derives from kv_cache_dtype"),
        ({"args": {"--port": 9000}}, "args.--port", "derives from port"),
        ({"args": {"tp_size": 8}}, "args.tp_size", "derives from tensor_parallel_size"),
        ({"name": "Bad Name"}, "name", "not a valid unit name part"),
        ({"engine": "tgi"}, "engine", "not supported"),
        ({"gpus": [0, 0]}, "gpus", "distinct GPU indices"),
        ({"gpus": [8, 9]}, "gpus", "beyond the 8 of this machine"),
        ({"env": {"BAD-NAME": "1"}}, "env.BAD-NAME", "is invalid"),
        ({"port": 70000}, "port", "not a TCP port"),
        ({"args": {"admin-api-key": "x"}}, "args.admin-api-key", "a secret on the command line"),
        ({"args": {"hf_token": "x"}}, "args.hf_token", "reads in /proc/<pid>/cmdline"),
        ({"env": {"HF_TOKEN": "x"}}, "env.HF_TOKEN", "looks like a secret"),
        ({"env": {"VLLM_API_KEY": "x"}}, "env.VLLM_API_KEY", "every user can read"),
    ],
)
def test_service_data_errors(services, changes, ident, text):
    service = variant(services, "minimax-m25", **changes)
    hit = refused(plan(service, REFERENCE["minimax-m25"])).get(ident)
    assert hit and text in hit["reason"], plan(service, REFERENCE["minimax-m25"])["refusals"]


def test_refusal_message_names_service_reason_and_fix(services):
    service = variant(services, "minimax-m25", gpus=list(range(8)), tensor_parallel_size=8)
    message = format_refusals("minimax-m25", plan(service, REFERENCE["minimax-m25"])["refusals"])
    assert message.startswith("service minimax-m25 refused before anything is installed:")
    assert "Fix: tensor_parallel_size 4 or" in message


# --- version-gated checkpoint edits ------------------------------------------------------------------

EDIT = {
    "file": "hf_quant_config.json",
    "key": "quantization.kv_cache_quant_algo",
    "state": "absent",
    "reason": "TRITON_MLA rejected the declared FP8 KV cache",
    "needed_below": "0.17.0",
    "change": "vllm#34597",
}


def test_checkpoint_edit_still_needed_on_old_engine(services):
    service = variant(services, "kimi-k25", checkpoint_edits=[EDIT])
    result = plan(service, REFERENCE["kimi-k25"], version="0.16.0")
    assert result["refusals"] == [] and result["edits"] == [EDIT]


def test_checkpoint_edit_refused_once_the_engine_fixed_it(services):
    service = variant(services, "kimi-k25", checkpoint_edits=[EDIT])
    result = plan(service, REFERENCE["kimi-k25"], version="0.17.0")
    hit = refused(result)["edit.hf_quant_config.json:quantization.kv_cache_quant_algo"]
    assert "not needed with vllm 0.17.0: fixed from 0.17.0 (vllm#34597)" in hit["reason"]
    assert "restore hf_quant_config.json from its backup" in hit["fix"]
    assert result["edits"] == []


def test_checkpoint_edit_with_unknown_engine_version_is_applied_with_a_warning(services):
    result = plan(variant(services, "kimi-k25", checkpoint_edits=[EDIT]), REFERENCE["kimi-k25"])
    assert result["edits"] == [EDIT]
    assert any("engine version unknown" in w for w in result["warnings"])


# VERSION < BOUND: an earlier release, or a pre-release of the bound; VERSION = BOUND: the bound, written shorter or
# as a post-release; VERSION > BOUND: a later release (a dev build of one too).
VERSION_ORDER = [
    "0.5.10 > 0.5.9",
    "0.6 > 0.5.9",
    "0.5.9 = 0.5.9",
    "0.5.9rc1 < 0.5.9",
    "0.5.9.post2 = 0.5.9",
    "0.5.8 < 0.5.9",
    "1.0.0.dev3+gabc > 0.5.9",
    "0.16.0 < 0.17.0",
    "0.17.0 = 0.17.0",
    "0.17.0rc1 < 0.17.0",
    "0.17.1.dev5+g1234abc > 0.17.0",
    "0.17 = 0.17.0",
    "1.0.0 > 0.17.0",
]


@pytest.mark.parametrize("order", VERSION_ORDER)
def test_version_comparison(order):
    version, sign, bound = order.split()
    assert version_below(version, bound) is (sign == "<")
    assert version_after(version, bound) is (sign == ">")


def test_unparsable_version_is_an_error():
    assert parse_version("nightly") is None
    with pytest.raises(ValueError, match="cannot compare"):
        version_below("nightly", "0.17.0")


def test_documentation_lists_every_rule():
    page = (ROLE.parents[1] / "docs/services.md").read_text()
    missing = [r["id"] for r in RULES if f"| `{r['id']}` |" not in page]
    assert not missing, f"docs/services.md does not list {missing}"


def test_the_suggested_tp_size_passes_the_gpu_list_check(services):
    """3 GPUs, 4 heads: TP 3 is refused; the fix TP 2 comes with a list of 2 GPUs, which the service check accepts."""
    config = {"num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 512, "intermediate_size": 1024}
    service = variant(services, "minimax-m25", gpus=[0, 1, 2], tensor_parallel_size=3)
    hit = refused(plan_service(service, config=config, gpu_count=8))["tp.attention_heads"]
    assert hit["fix"] == "tensor_parallel_size 2 and gpus [0, 1]"
    fixed = variant(services, "minimax-m25", gpus=[0, 1], tensor_parallel_size=2)
    assert plan_service(fixed, config=config, gpu_count=8)["refusals"] == []


def test_environment_names_that_only_contain_a_secret_word_are_accepted(services):
    service = variant(services, "minimax-m25", env={"TOKENIZERS_PARALLELISM": "false", "KEY_CACHE_DIR": "/x"})
    assert plan(service, REFERENCE["minimax-m25"])["refusals"] == []


# --- memory fit -----------------------------------------------------------------------------------


def test_kimi_at_tp4_does_not_fit_96_gb_gpus(services):
    service = variant(services, "kimi-k25", gpus=[0, 1, 2, 3], tensor_parallel_size=4)
    hit = refused(plan(service, REFERENCE["kimi-k25"], memory_gb=96))["memory.fit"]
    assert "149.8 GB of weights per GPU at TP 4 (592 GB in all" in hit["reason"]
    assert "2.18 GB of them whole on every GPU" in hit["reason"]
    assert "more than the 92.8 GB usable of each GPU's 96 GiB" in hit["reason"]
    assert hit["fix"].startswith("tensor_parallel_size 8 and gpus [0, 1, 2, 3, 4, 5, 6, 7]")


def test_the_checkpoint_index_gives_the_size(services, checkpoint):
    path = checkpoint(REFERENCE["kimi-k25"])
    (path / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 547000000000}}')
    config, quant = modelconfig.load_checkpoint(path)
    service = variant(services, "kimi-k25", gpus=[0, 1, 2, 3], tensor_parallel_size=4)
    result = plan_service(
        service,
        config=config,
        quant_config=quant,
        known_bad=RULES,
        compute_capability="12.0",
        gpu_count=8,
        memory_gb=96,
        checkpoint_bytes=modelconfig.checkpoint_bytes(path),
    )
    hit = refused(result)["memory.fit"]
    # replicated weights counted whole on each rank: (547 - 2.18) / 4 + 2.18
    assert "138.4 GB of weights per GPU at TP 4 (547 GB in all, model.safetensors.index.json" in hit["reason"]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_services_fit_their_gpus(services, name):
    assert plan(services[name], REFERENCE[name], memory_gb=96)["refusals"] == []


def test_the_memory_fraction_flag_is_honoured(services):
    # Kimi at TP 8: 76.0 GB of weights and 2.3 GB of KV cache, 78.3 GB; 0.8 x 96 GiB = 82.5 GB still fits
    fits = variant(services, "kimi-k25", args={"gpu-memory-utilization": 0.8})
    assert plan(fits, REFERENCE["kimi-k25"], memory_gb=96)["refusals"] == []
    tight = variant(services, "kimi-k25", args={"gpu-memory-utilization": 0.75})
    hit = refused(plan(tight, REFERENCE["kimi-k25"], memory_gb=96))["memory.fit"]
    assert "(memory fraction 0.75)" in hit["reason"]
    assert hit["fix"].startswith("a checkpoint with fewer bits per weight")


def test_the_minimum_kv_cache_counts(services):
    # MLA: 61 layers x 576 values x 2 B = 70 KB per token on every GPU
    many = plan(services["kimi-k25"], REFERENCE["kimi-k25"], memory_gb=96, min_kv_tokens=300_000)
    assert "21.1 GB of KV cache for 300000 tokens" in refused(many)["memory.fit"]["reason"]


def test_memory_fit_needs_a_size(services):
    service = copy.deepcopy(services["minimax-m25"])
    del service["model"]["active_params_b"]
    result = plan(service, REFERENCE["minimax-m25"], memory_gb=96)
    assert result["refusals"] == []
    assert any(w.startswith("memory fit not checked") for w in result["warnings"])
    assert plan(services["minimax-m25"], REFERENCE["minimax-m25"])["warnings"] == []  # no memory_gb: no check
