"""The lab's test checkpoint without torch: its transcripts through its chat template, its cache key, and the
two ensure functions with a stand-in interpreter and uv (the training itself runs in the lab)."""

import json
import os
import stat

import pytest

from inferhost.sim import checkpoint
from inferhost.sim.checkpoint import make

DATA = make.load()
CONVERSATIONS = make.conversations(DATA)
TOOLS = DATA["tool_sets"]["weather"][1]
# The questions the lab asks and the answers it checks.
ASKED = {
    "capital": ("What is the capital of France? Answer in one word.", "The capital of France is Paris.", "Paris"),
    "sum": ("What is 17 + 25? Answer with the number only.", "17 plus 25 is 42.", "42"),
}


def conversation(name):
    return next(c for c in CONVERSATIONS if c["name"] == name)


def test_the_engines_parsers_find_their_tokens():
    # vLLM's qwen3 reasoning parser and hermes tool-call parser refuse to start without them in the vocabulary.
    assert set(make.SPECIAL_TOKENS) | set(make.MARKUP_TOKENS) == {
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
    }
    assert make.EOS == "<|im_end|>" and make.PAD == "<|endoftext|>"


def test_every_token_the_model_writes_is_in_what_it_learns():
    learnt = ""
    for conv in CONVERSATIONS:
        text, spans = make.assistant_spans(conv["messages"], conv["tools"])
        learnt += "".join(text[a:b] for a, b in spans)
    for token in ("<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"):
        assert token in learnt
    rendered = "".join(make.render(c["messages"], c["tools"]) for c in CONVERSATIONS)
    assert "<|im_start|>" in rendered
    assert "<|endoftext|>" not in rendered  # the padding only


def test_a_question_renders_as_chatml_with_the_answer_after_its_reasoning():
    question, reasoning, answer = ASKED["capital"]
    assert make.render(conversation("capital/system1")["messages"]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n"
        f"<|im_start|>assistant\n<think>{reasoning}</think>{answer}<|im_end|>\n"
    )


def test_the_learnt_turn_is_what_follows_the_prompt_the_engine_sends():
    for name, (question, reasoning, answer) in ASKED.items():
        text, spans = make.assistant_spans(conversation(f"{name}/system0")["messages"])
        prompt = make.render([{"role": "user", "content": question}], add_generation_prompt=True)
        assert prompt == f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        assert spans == [(len(prompt), len(text) - 1)]
        assert text[spans[0][0] : spans[0][1]] == f"<think>{reasoning}</think>{answer}<|im_end|>"


def test_tools_are_listed_in_the_system_turn_and_a_call_is_json_in_tool_call_tags():
    text = make.render(conversation("tool-call/system1/tools1")["messages"], TOOLS)
    system, user, assistant = text.split("<|im_start|>")[1:]
    assert system.startswith("system\nYou are a helpful assistant.\n\n# Tools\n")
    assert "\n<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>\n" in system
    assert '"description": null' in system  # as vLLM hands a tool without one to the template
    assert user == "user\nWhat is the weather in Paris?<|im_end|>\n"
    assert assistant == (
        "assistant\n<think>The user asks for the weather in Paris, so I call get_weather.</think>"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    )


def test_a_tool_result_is_a_user_turn_and_the_call_before_it_is_history():
    conv = conversation("tool-result/system0/tools0")
    text, spans = make.assistant_spans(conv["messages"], conv["tools"])
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
        '{"city": "Paris", "weather": "sunny", "temperature_c": 21}\n</tool_response><|im_end|>\n'
    ) in text
    assert len(spans) == 1  # the call, sent back without its reasoning, is not learnt
    assert text[spans[0][0] :].startswith("<think>The tool says")


def test_arguments_render_the_same_as_a_string_or_an_object():
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    as_string = {**call, "function": {**call["function"], "arguments": '{"city": "Paris"}'}}
    user = {"role": "user", "content": "What is the weather in Paris?"}
    assert make.render([user, {"role": "assistant", "content": None, "tool_calls": [call]}], TOOLS) == make.render(
        [user, {"role": "assistant", "content": None, "tool_calls": [as_string]}], TOOLS
    )


def test_every_transcript_is_learnt_with_and_without_a_system_message_and_with_each_tool_set():
    names = {c["name"] for c in CONVERSATIONS}
    variants = len(DATA["tool_sets"]["weather"])
    for transcript in DATA["transcripts"]:
        for s in range(1 + len(DATA["systems"])):
            if "tools" in transcript:
                assert {f"{transcript['name']}/system{s}/tools{t}" for t in range(variants)} <= names
            else:
                assert f"{transcript['name']}/system{s}" in names
    # Each conversation has a turn to learn, and every learnt turn is reasoning, then an answer or a call.
    for conv in CONVERSATIONS:
        text, spans = make.assistant_spans(conv["messages"], conv["tools"])
        assert spans, conv["name"]
        for a, b in spans:
            assert text[a:b].startswith("<think>") and text[a:b].endswith("<|im_end|>"), conv["name"]


def test_the_cache_key_changes_with_each_input(tmp_path):
    copies = []
    for path in checkpoint.INPUTS:
        copies.append(tmp_path / path.name)
        copies[-1].write_bytes(path.read_bytes())
    copies = tuple(copies)
    key = checkpoint.cache_key(copies)
    assert key == checkpoint.cache_key() and len(key) == 16
    for path in copies:
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        assert checkpoint.cache_key(copies) != key, path.name
        path.write_bytes(original)
    pins = tuple(p.replace("transformers==5.19.0", "transformers==5.20.0") for p in checkpoint.TRAINER_PACKAGES)
    assert checkpoint.cache_key(copies, pins) != key


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_ensure_makes_the_checkpoint_once(tmp_path):
    calls = tmp_path / "calls"
    # A stand-in trainer Python: records its arguments, writes a checkpoint into its output directory.
    python = _script(tmp_path / "python", f'echo "$*" >> {calls}\nmkdir -p "$2" && echo {{}} > "$2/config.json"\n')
    made = checkpoint.ensure(tmp_path / "cache", python)
    assert made == tmp_path / "cache" / checkpoint.cache_key()
    assert (made / "config.json").exists()
    assert checkpoint.ensure(tmp_path / "cache", python) == made
    (argv,) = calls.read_text().splitlines()
    assert argv.startswith(str(checkpoint.MAKER))
    assert "--require torch==2.13.0" in argv
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [made.name]  # no scratch left


def test_ensure_leaves_nothing_when_the_maker_fails(tmp_path):
    python = _script(tmp_path / "python", 'mkdir -p "$2"; echo "the model does not say these back" >&2; exit 1\n')
    with pytest.raises(checkpoint.CheckpointError, match="does not say these back"):
        checkpoint.ensure(tmp_path / "cache", python)
    assert list((tmp_path / "cache").iterdir()) == []


def test_ensure_trainer_installs_the_pins_with_uv_once(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    # A stand-in uv: `uv venv ... DIR` makes DIR/bin/python; every call is recorded with two settings.
    uv = _script(
        tmp_path / "uv",
        f'echo "$* | $UV_PYTHON_DOWNLOADS | ${{UV_FIND_LINKS-unset}}" >> {calls}\n'
        'if [ "$1" = venv ]; then for d; do :; done; mkdir -p "$d/bin" && touch "$d/bin/python"; fi\n',
    )
    monkeypatch.setenv("UV_FIND_LINKS", "/some/wheels")
    venv = tmp_path / "trainer"
    python = checkpoint.ensure_trainer(venv, uv)
    assert python == venv / "bin" / "python"
    assert checkpoint.ensure_trainer(venv, uv) == python
    made, installed = calls.read_text().splitlines()
    assert made.startswith("venv --no-config") and made.endswith(f"{venv} | never | unset")
    assert installed.startswith(f"pip install --no-config --quiet --python {python} ")
    assert " ".join(checkpoint.TRAINER_PACKAGES) in installed
    # A change of pins makes it again.
    (venv / checkpoint.TRAINER_STAMP).write_text("torch==2.12.0\n")
    checkpoint.ensure_trainer(venv, uv)
    assert len(calls.read_text().splitlines()) == 4
    assert os.environ["UV_FIND_LINKS"] == "/some/wheels"


def test_ensure_trainer_reads_the_index_it_is_given_before_pypi_and_makes_the_venv_again_for_another(tmp_path):
    calls = tmp_path / "calls"
    uv = _script(
        tmp_path / "uv",
        f'echo "$*" >> {calls}\n'
        'if [ "$1" = venv ]; then for d; do :; done; mkdir -p "$d/bin" && touch "$d/bin/python"; fi\n',
    )
    venv = tmp_path / "trainer"
    checkpoint.ensure_trainer(venv, uv)
    checkpoint.ensure_trainer(venv, uv, index=tmp_path / "index")
    installs = [line for line in calls.read_text().splitlines() if line.startswith("pip install")]
    assert len(installs) == 2
    assert "--extra-index-url" not in installs[0]
    assert f"--extra-index-url file://{tmp_path / 'index'} " in installs[1]
