"""The engine command lines and environments built from service data, and their systemd quoting."""

import shlex

import pytest
from inference.command import (
    SGLANG_LAUNCHER,
    build_argv,
    build_environment,
    drain_args,
    env_file_line,
    secret_names,
    served_api,
    served_name,
    systemd_command,
    systemd_environment,
    systemd_quote,
)


def test_vllm_reference_command(services):
    argv = build_argv(services["kimi-k25"], load_timeout_s=2700)
    assert argv[:3] == ["/opt/venvs/vllm/bin/vllm", "serve", "/srv/models/Kimi-K2.5"]
    joined = " ".join(argv)
    assert "--served-model-name Kimi-K2.5 --host 127.0.0.1 --port 8000 --tensor-parallel-size 8" in joined
    assert "--tensor-parallel-size 8 --kv-cache-dtype bfloat16" in joined  # plain TP, as the reference ran it
    assert "--enable-expert-parallel" not in argv
    with_ep = " ".join(build_argv({**services["kimi-k25"], "expert_parallel": True}))
    assert "--enable-expert-parallel --kv-cache-dtype bfloat16" in with_ep
    assert "--attention-backend TRITON_MLA" in joined
    assert "--trust-remote-code" in argv and "true" not in argv
    assert "--api-key" not in argv  # vLLM reads VLLM_API_KEY from the secret file


def test_sglang_reference_command(services):
    argv = build_argv(services["qwen35"], load_timeout_s=1800)
    # The launcher hands the key from the environment to SGLang in-process: no --api-key on the command line.
    assert argv[:4] == [
        "/opt/venvs/sglang/bin/python",
        SGLANG_LAUNCHER,
        "--model-path",
        "/srv/models/Qwen3.5-397B-A17B-NVFP4",
    ]
    joined = " ".join(argv)
    assert "--tp-size 8 --kv-cache-dtype bf16 --dist-timeout 1800 --enable-metrics" in joined
    # The service's args, sorted by flag whatever the order of the mapping.
    assert joined.endswith(
        "--attention-backend triton --disable-custom-all-reduce --fp4-gemm-backend flashinfer_cudnn "
        "--moe-runner-backend flashinfer_cutlass --reasoning-parser qwen3 --tool-call-parser qwen3_coder "
        "--trust-remote-code"
    )
    assert "--api-key" not in argv and "INFERHOST_API_KEY" not in joined


@pytest.mark.parametrize(
    ("args", "flags", "metrics"),
    [
        ({}, 1, True),
        ({"enable-metrics": True}, 1, True),  # the service's own flag, not a second one
        ({"enable-metrics": False}, 0, False),
        ({"--enable-metrics": None}, 0, False),
    ],
)
def test_sglang_serves_metrics_unless_the_service_says_otherwise(services, args, flags, metrics):
    service = {**services["qwen35"], "args": args}
    argv = build_argv(service)
    assert argv.count("--enable-metrics") == flags
    assert served_api(service)["metrics"] is metrics


def test_vllm_needs_no_flag_for_metrics(services):
    service = services["kimi-k25"]
    assert "--enable-metrics" not in build_argv(service)
    assert served_api(service)["metrics"] is True
    assert served_api({**service, "args": {"disable-log-stats": True}})["metrics"] is False


@pytest.mark.parametrize(
    ("engine", "args", "tool", "reasoning"),
    [
        ("sglang", {"tool-call-parser": "qwen3_coder", "reasoning-parser": "qwen3"}, "qwen3_coder", "qwen3"),
        ("sglang", {}, None, None),
        ("vllm", {"enable-auto-tool-choice": True, "tool-call-parser": "hermes"}, "hermes", None),
        ("vllm", {"tool-call-parser": "hermes", "reasoning-parser": "qwen3"}, None, "qwen3"),  # no auto tool choice
        ("vllm", {"enable_auto_tool_choice": True, "--tool-call-parser": "kimi_k2"}, "kimi_k2", None),
    ],
)
def test_served_api_names_the_parsers_the_engine_runs_with(engine, args, tool, reasoning):
    api = served_api({"engine": engine, "args": args})
    assert (api["tool_call_parser"], api["reasoning_parser"]) == (tool, reasoning)


def test_the_args_mappings_order_does_not_change_the_command_line(services):
    service = services["kimi-k25"]
    reordered = {**service, "args": dict(reversed(list(service["args"].items())))}
    assert list(reordered["args"]) != list(service["args"])
    assert build_argv(reordered) == build_argv(service)


def test_sglang_launcher_path_is_a_parameter(services):
    argv = build_argv(services["qwen35"], sglang_launcher="/opt/x/launch")
    assert argv[:2] == ["/opt/venvs/sglang/bin/python", "/opt/x/launch"]


def test_expert_parallel_for_sglang_sets_ep_size(services):
    service = dict(services["qwen35"], expert_parallel=True)
    argv = build_argv(service)
    assert argv[argv.index("--ep-size") + 1] == "8"


def test_served_name_defaults_to_the_model_directory():
    assert served_name({"model": {"path": "/srv/models/Foo-7B/"}}) == "Foo-7B"
    assert served_name({"model": {"path": "/x", "served_name": "bar"}}) == "bar"


def test_args_render_bools_lists_and_mappings():
    service = {
        "engine": "vllm",
        "environment": "/v",
        "gpus": [0],
        "model": {"path": "/m"},
        "args": {
            "enforce-eager": True,
            "disable-log-stats": False,
            "max-num-seqs": 64,
            "speculative-config": {"num_speculative_tokens": 3, "method": "mtp"},
            "allowed-origins": ["a", "b"],
            "skip": None,
        },
    }
    argv = build_argv(service)
    assert "--enforce-eager" in argv
    assert "--disable-log-stats" not in argv and "--skip" not in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "64"
    assert argv[argv.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":3}'
    assert argv[argv.index("--allowed-origins") + 1 : argv.index("--allowed-origins") + 3] == ["a", "b"]


def test_unknown_engine_is_an_error():
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        build_argv({"engine": "tgi", "environment": "/v", "gpus": [0], "model": {"path": "/m"}})


def test_environment_carries_gpus_marker_and_timeouts(services):
    env = build_environment(
        services["kimi-k25"], unit="inference-kimi-k25.service", load_timeout_s=2700, common={"HF_HUB_OFFLINE": 1}
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["INFERHOST_UNIT"] == "inference-kimi-k25.service"
    assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == "2700"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    sglang = build_environment(services["qwen35"], unit="u")
    assert "VLLM_ENGINE_READY_TIMEOUT_S" not in sglang
    assert sglang["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"


def test_service_env_wins_over_common_env(services):
    env = build_environment(services["qwen35"], unit="u", common={"SAFETENSORS_FAST_GPU": "0"})
    assert env["SAFETENSORS_FAST_GPU"] == "1"


def test_secret_names_per_engine(services):
    assert secret_names(services["kimi-k25"]) == ["INFERHOST_API_KEY", "VLLM_API_KEY"]
    assert secret_names(services["qwen35"]) == ["INFERHOST_API_KEY"]


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("plain", "plain"),
        ("with space", '"with space"'),
        ('{"a":1}', '"{\\"a\\":1}"'),
        ("100%", "100%%"),
        ("$HOME", "$$HOME"),
        ("back\\slash", '"back\\\\slash"'),
        ("", '""'),
        ("${KEY}", "$${KEY}"),
    ],
)
def test_systemd_quoting(arg, quoted):
    assert systemd_quote(arg) == quoted


def test_systemd_command_round_trips_through_a_shell_like_split():
    argv = ["/bin/x", "--a", "two words", '{"k":"v"}']
    assert shlex.split(systemd_command(argv)) == argv


def test_environment_lines_are_quoted():
    assert systemd_environment("A", 'x "y" 50%') == '"A=x \\"y\\" 50%%"'
    assert env_file_line("KEY", 'se"cr\\et') == 'KEY="se\\"cr\\\\et"'


@pytest.mark.parametrize(
    ("engine", "version", "args", "flags", "warned"),
    [
        ("vllm", "0.32.0+cpu", {}, ["--shutdown-timeout", "60"], False),
        ("vllm", "0.18.0", {}, ["--shutdown-timeout", "60"], False),
        ("vllm", "0.16.0", {}, [], True),  # the example's pin: no drain, and the plan says so
        ("vllm", None, {}, [], True),
        ("vllm", "0.32.0", {"shutdown-timeout": 5}, [], False),  # the service's own wins
        ("sglang", "0.5.9", {}, [], False),  # SGLang drains on SIGTERM itself
    ],
)
def test_a_stop_drains_where_the_engine_can(engine, version, args, flags, warned):
    service = {"engine": engine, "environment": "/opt/venvs/x", "model": {"path": "/m"}, "gpus": [0], "args": args}
    got, warning = drain_args(service, version, 60)
    assert got == flags and bool(warning) is warned
    if warned:
        assert "aborts the requests in flight" in warning and "0.18.0" in warning
    argv = build_argv(service, drain=got)
    assert (argv.count("--shutdown-timeout") == 1) is bool(flags or args)
    assert drain_args(service, version, 0) == ([], "")
