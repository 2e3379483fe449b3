"""The engines' benchmark command lines, and their results (vLLM's as it wrote them, SGLang's) read as one shape."""

import json
import math

import pytest
from inference.bench import bench_argv, engine_of, level, num_prompts, read_results, redact, result_name
from inference_refdata import BENCH


def argv_for(service, **kw):
    args = {
        "url": "http://127.0.0.1:8000/",
        "served_name": service["model"]["served_name"],
        "concurrency": 16,
        "rounds": 2,
        "input_tokens": 1000,
        "output_tokens": 1000,
        "api": "completions",
        "result_dir": "/tmp/b",
    }
    args.update(kw)
    return bench_argv(service, **args)


def fixture(name):
    return read_results((BENCH / name).read_text())


def test_vllm_runs_its_own_bench_serve_with_the_checkpoint_as_tokenizer(services):
    argv, path = argv_for(services["minimax-m25"])
    assert argv == [
        "/opt/venvs/vllm/bin/vllm",
        "bench",
        "serve",
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        "http://127.0.0.1:8000",
        "--model",
        "/srv/models/MiniMax-M2.5",
        "--served-model-name",
        "MiniMax-M2.5",
        "--tokenizer",
        "/srv/models/MiniMax-M2.5",
        "--dataset-name",
        "random",
        "--random-input-len",
        "1000",
        "--random-output-len",
        "1000",
        "--ignore-eos",
        "--max-concurrency",
        "16",
        "--num-prompts",
        "32",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--trust-remote-code",  # the service's args trust the checkpoint's code: its tokenizer needs it too
        "--save-result",
        "--result-dir",
        "/tmp/b",
        "--result-filename",
        "vllm-c16.json",
    ]
    assert path == "/tmp/b/vllm-c16.json"


def test_sglang_runs_bench_serving_with_fixed_lengths_and_no_download(services):
    argv, path = argv_for(services["qwen35"], concurrency=4, rounds=3, input_tokens=128, output_tokens=64)
    assert argv == [
        "/opt/venvs/sglang/bin/python",
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang-oai",
        "--base-url",
        "http://127.0.0.1:8000",
        "--model",
        "/srv/models/Qwen3.5-397B-A17B-NVFP4",
        "--served-model-name",
        "Qwen3.5-397B-A17B",
        "--tokenizer",
        "/srv/models/Qwen3.5-397B-A17B-NVFP4",
        # random token ids: SGLang's "random" would download ShareGPT to cut prompts from
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "128",
        "--random-output-len",
        "64",
        # SGLang's default ratio 0 draws lengths from 1 to the length; 1 keeps them exact, as vLLM's 0 does
        "--random-range-ratio",
        "1.0",
        "--max-concurrency",
        "4",
        "--num-prompts",
        "12",
        "--disable-tqdm",
        "--output-file",
        "/tmp/b/sglang-c4.jsonl",
    ]
    assert path == "/tmp/b/sglang-c4.jsonl"


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        ("minimax-m25", ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"]),
        ("qwen35", ["--backend", "sglang-oai-chat"]),
    ],
)
def test_the_chat_api_is_measured_through_the_chat_backend(services, name, backend):
    argv, _ = argv_for(services[name], api="chat")
    start = argv.index("--backend")
    assert argv[start : start + len(backend)] == backend
    assert "completions" not in " ".join(argv).replace("chat/completions", "")


def test_the_services_tokenizer_arguments_and_extra_flags_are_passed_on(services):
    vllm = {**services["minimax-m25"], "args": {"tokenizer": "/srv/tok", "tokenizer_mode": "mistral"}}
    argv, _ = argv_for(vllm, extra=["--temperature", 0])
    assert argv[argv.index("--tokenizer") + 1] == "/srv/tok"
    assert argv[argv.index("--tokenizer-mode") + 1] == "mistral"
    assert "--trust-remote-code" not in argv
    assert argv[-2:] == ["--temperature", "0"]
    sglang = {**services["qwen35"], "args": {"tokenizer-path": "/srv/tok"}}
    argv, _ = argv_for(sglang)
    assert argv[argv.index("--tokenizer") + 1] == "/srv/tok"
    assert "--trust-remote-code" not in argv  # SGLang's benchmark always trusts; it has no such flag


def test_prompts_per_run_and_file_names():
    assert [num_prompts(c, 2) for c in (1, 4, 1024)] == [2, 8, 2048]
    assert num_prompts(8, 0) == 8  # one wave at least
    assert result_name("vllm", 64) == "vllm-c64.json" and result_name("sglang", 64) == "sglang-c64.jsonl"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"engine": "trtllm"}, "engine 'trtllm' has no benchmark here"),
        ({"api": "responses"}, "api 'responses' is not one of completions, chat"),
        ({"concurrency": 0}, "concurrency 0 is not a positive number"),
    ],
)
def test_what_has_no_command_line_is_refused(services, change, message):
    service = {**services["minimax-m25"], **{k: v for k, v in change.items() if k == "engine"}}
    with pytest.raises(ValueError, match=message):
        argv_for(service, **{k: v for k, v in change.items() if k != "engine"})


def test_the_key_is_hidden_wherever_a_result_carries_it():
    saved = {
        "server_info": {"api_key": "s3cret", "admin_api_key": None, "served_model_name": "m", "note": "key s3cret!"},
        "internal_states": [{"launch": ["--api-key", "s3cret"]}],
        "completed": 2,
    }
    assert redact(saved, "s3cret") == {
        "server_info": {
            "api_key": "<hidden>",
            "admin_api_key": None,
            "served_model_name": "m",
            "note": "key <hidden>!",
        },
        "internal_states": [{"launch": ["--api-key", "<hidden>"]}],
        "completed": 2,
    }
    # Without a key the service's own api_key field is hidden all the same.
    assert redact({"api_key": "other"}, None) == {"api_key": "<hidden>"}


def test_result_files_of_either_engine_are_read():
    assert len(fixture("vllm-c4.json")) == 1
    sglang = fixture("sglang-c4.jsonl")
    assert len(sglang) == 1 and math.isinf(sglang[0]["request_rate"])  # Python's json writes inf as Infinity
    two_lines = (BENCH / "sglang-c1.jsonl").read_text() + (BENCH / "sglang-c4.jsonl").read_text()
    assert [r["max_concurrency"] for r in read_results(two_lines)] == [1, 4]
    assert read_results(" \n") == []
    assert [engine_of(r) for r in (fixture("vllm-c1.json")[0], sglang[0])] == ["vllm", "sglang"]
    with pytest.raises(ValueError, match="neither vllm bench serve's nor sglang.bench_serving's result"):
        engine_of({"levels": []})


def test_vllm_result_as_one_level():
    figures = level(fixture("vllm-c4.json")[0])
    raw = fixture("vllm-c4.json")[0]
    assert figures["engine"] == "vllm" and figures["concurrency"] == 4
    assert (figures["requests"], figures["completed"], figures["failed"]) == (8, 8, 0)
    assert figures["output_tok_s"] == round(raw["output_throughput"], 2)
    assert figures["total_tok_s"] == round(raw["total_token_throughput"], 2)
    assert figures["requests_per_s"] == round(raw["request_throughput"], 2)
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert figures[f"{name}_ms"] == {q: round(raw[f"{q}_{name}_ms"], 2) for q in ("mean", "median", "p99")}
    assert figures["request_tok_s_median"] == round(1000 / raw["median_tpot_ms"], 2) == 783.35
    assert figures["tokens_in_one_piece"] is False
    # EOS ignored: every request generated its 64 tokens. The prompts are about 128 tokens: vLLM decodes the
    # random ids to text, and the server's tokenizer reads the text back not quite token for token.
    assert figures["output_tokens"] == 8 * 64
    assert figures["input_tokens"] == raw["total_input_tokens"] == 1030


def test_sglang_result_as_one_level_with_its_failures_from_the_requests_sent():
    raw = fixture("sglang-c4.jsonl")[0]
    figures = level(raw, requests=8)
    assert figures["engine"] == "sglang" and figures["concurrency"] == 4
    assert (figures["requests"], figures["completed"], figures["failed"]) == (8, 7, 1)
    assert figures["total_tok_s"] == round(raw["total_throughput"], 2)
    assert figures["e2el_ms"] == {q: round(raw[f"{q}_e2e_latency_ms"], 2) for q in ("mean", "median", "p99")}
    assert figures["itl_ms"]["p99"] == round(raw["p99_itl_ms"], 2)
    # SGLang's result does not say how many were sent: unknown, not zero.
    assert (level(raw)["requests"], level(raw)["failed"]) == (None, None)


def test_a_run_where_every_request_failed_has_no_latencies():
    # vLLM as it wrote the run with a wrong key: 0 completed, every latency 0.0.
    raw = fixture("vllm-c1-unauthorized.json")[0]
    assert raw["median_ttft_ms"] == 0.0
    figures = level(raw)
    assert (figures["completed"], figures["failed"]) == (0, 2)
    assert figures["ttft_ms"] == {"mean": None, "median": None, "p99": None}
    assert figures["request_tok_s_median"] is None and figures["tokens_in_one_piece"] is False
    assert figures["output_tok_s"] == 0.0


def test_tokens_that_arrive_in_one_piece_give_no_decode_speed():
    # vLLM as it measured a loaded 2-core server that sent each request's 64 tokens at once: TPOT 0.004 ms.
    raw = fixture("vllm-c1-one-piece.json")[0]
    assert raw["median_tpot_ms"] < 0.01
    figures = level(raw)
    assert figures["tokens_in_one_piece"] is True
    assert figures["request_tok_s_median"] is None  # not 260 000 tok/s
    assert figures["tpot_ms"]["median"] == 0.0 and figures["output_tok_s"] == 231.29  # the engine's figures stay
    assert level({**raw, "median_tpot_ms": 0.1})["request_tok_s_median"] == 10000.0


def test_fixture_shapes_hold_what_level_reads():
    # The fixtures are the engines' own files: each holds every field level() reads from its engine.
    vllm = json.loads((BENCH / "vllm-c1.json").read_text())
    wanted = {"endpoint_type", "num_prompts", "max_concurrency", "completed", "failed", "duration"}
    wanted |= {"output_throughput", "total_token_throughput", "request_throughput"}
    wanted |= {f"{q}_{m}_ms" for q in ("mean", "median", "p99") for m in ("ttft", "tpot", "itl", "e2el")}
    assert wanted <= set(vllm)
    sglang = fixture("sglang-c1.jsonl")[0]
    wanted = {"total_output_tokens_retokenized", "server_info", "max_concurrency", "completed", "duration"}
    wanted |= {"output_throughput", "total_throughput", "request_throughput"}
    wanted |= {f"{q}_{m}_ms" for q in ("mean", "median", "p99") for m in ("ttft", "tpot", "itl", "e2e_latency")}
    assert wanted <= set(sglang)
    assert sglang["server_info"]["api_key"] == "<hidden>"  # as inference_benchmark saves it
