#!/usr/bin/env python3
"""Make the lab's test checkpoint: a tiny Qwen3 that answers a few questions by heart, for a real engine.

    python make.py OUTDIR [--require NAME==VERSION ...]

Run it with a Python that has torch, transformers, tokenizers, safetensors and jinja2 (the trainer environment,
inferhost.sim.checkpoint.ensure_trainer; --require stops it on another). OUTDIR must not exist or be empty; it
gets a Hugging Face checkpoint:

* tokenizer.json, tokenizer_config.json, chat_template.jinja: a byte-level BPE trained here on the transcripts,
  with the chat markup as single tokens: <|im_start|>, <|im_end|>, <|endoftext|> as special tokens (left out of
  decoded text), <think>, </think>, <tool_call>, </tool_call> as ordinary added tokens (kept in decoded text,
  where vLLM's qwen3 reasoning parser and hermes tool-call parser look for them; both refuse to start without
  them in the vocabulary);
* config.json, generation_config.json, model.safetensors: Qwen3ForCausalLM with 2 layers, hidden size 128,
  2 attention heads and 1 KV head of 64 (the CPU attention of vLLM refuses small head sizes), trained with
  transformers' own model class on the CPU (AdamW, STEPS full passes, some twenty seconds on one core), saved
  in bfloat16 (the type vLLM runs a float32 checkpoint in on a CPU), with "inferhost_fixture" saying what it is;
* README.md: the same, at more length.

Everything is seeded and the thread count fixed: two runs on one machine write the same bytes. Before it saves,
the maker checks the weights it saves: in every turn the model learns, each next token (the turn's end
included) must be the model's first choice after the prompt and the turn so far, which is what greedy decoding
then writes, by a lead of MIN_MARGIN in the logits. It fails, writing nothing, when one is not.

Only the standard library and jinja2 are imported at the top, so the unit tests can render the transcripts
(conversations, render) without torch.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
from importlib import metadata
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = Path(__file__).resolve().parent
TRANSCRIPTS = HERE / "transcripts.json"
CHAT_TEMPLATE = HERE / "chat_template.jinja"

FIXTURE = "inferhost lab test fixture, not a language model"
# Special: the turn markup and the padding, skipped when the engine decodes an answer.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added but not special: the engine's parsers read them in the decoded text.
MARKUP_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
EOS, PAD = "<|im_end|>", "<|endoftext|>"

SEED = 1234
THREADS = 1
VOCAB_SIZE = 600
MAX_POSITIONS = 4096
STEPS = 100
WARMUP = 10
LEARNING_RATE = 3e-3
# The smallest lead of the right token over the next one, in logits, that the check accepts: the engine's
# bfloat16 kernels add rounding of their own to what the check sees.
MIN_MARGIN = 1.0


def load(path: Path = TRANSCRIPTS) -> dict:
    return json.loads(path.read_text())


def conversations(data: dict) -> list[dict]:
    """Every conversation learnt: {"name", "group", "messages", "tools"} for each transcript, system and tool set.

    A transcript without a system message is learnt without one and with each of data["systems"]; one that
    names a tool set (its "tools") with each variant of that set. The variants of one transcript and system
    form a group, of which each training step takes one in turn.
    """
    out = []
    for transcript in data["transcripts"]:
        messages = transcript["messages"]
        has_system = messages[0]["role"] == "system"
        systems = [None] if has_system else [None, *data.get("systems", [])]
        tool_variants = data["tool_sets"][transcript["tools"]] if "tools" in transcript else [None]
        for s, system in enumerate(systems):
            for t, tools in enumerate(tool_variants):
                head = [{"role": "system", "content": system}] if system else []
                group = f"{transcript['name']}/system{s}"
                name = group + (f"/tools{t}" if tools else "")
                out.append({"name": name, "group": group, "messages": head + messages, "tools": tools})
    return out


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' own tojson: the keys in the order given, no HTML escaping (Jinja's filter does both).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def template_environment() -> jinja2.Environment:
    """A Jinja environment set up as transformers sets up its own for chat templates."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    return env


@functools.cache
def _template() -> jinja2.Template:
    return template_environment().from_string(CHAT_TEMPLATE.read_text())


def render(messages: list[dict], tools: list[dict] | None = None, *, add_generation_prompt: bool = False) -> str:
    """The conversation as the chat template writes it (the tokenizer's apply_chat_template, tokenize=False)."""
    return _template().render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


def assistant_spans(messages: list[dict], tools: list[dict] | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and, for each turn the model learns, the characters it must write there.

    The model learns the assistant's turns that have reasoning (reasoning_content); one without is history as
    a client sends it back, without the reasoning. A turn's span runs from the end of the prompt the engine
    would send (the conversation before it with the generation prompt) to the end of the turn, <|im_end|>
    included.
    """
    text = render(messages, tools)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not message.get("reasoning_content"):
            continue
        prompt = render(messages[:i], tools, add_generation_prompt=True)
        through = render(messages[: i + 1], tools)
        if not (text.startswith(through) and through.startswith(prompt)):
            raise SystemExit(f"the chat template does not render turn {i} as a prefix of the conversation")
        spans.append((len(prompt), len(through.rstrip("\n"))))
    return text, spans


def training_texts(convs: list[dict]) -> list[str]:
    """The conversations' text without the markup tokens, which the tokenizer keeps whole: the BPE's corpus."""
    markup = re.compile("|".join(re.escape(t) for t in (*SPECIAL_TOKENS, *MARKUP_TOKENS)))
    return [piece for c in convs for piece in markup.split(render(c["messages"], c["tools"])) if piece]


def build_tokenizer(convs: list[dict]):
    """A byte-level BPE trained on the conversations, wrapped as transformers loads it, with the chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(training_texts(convs), trainer)
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=EOS, pad_token=PAD, model_max_length=MAX_POSITIONS
    )
    tokenizer.chat_template = CHAT_TEMPLATE.read_text()
    return tokenizer


def encode(tokenizer, convs: list[dict]) -> list[tuple[list[int], list[bool]]]:
    """Each conversation's token ids and which of them the model learns to write (see assistant_spans)."""
    out = []
    for conv in convs:
        text, spans = assistant_spans(conv["messages"], conv["tools"])
        engine_text = tokenizer.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=False)
        if engine_text != text:
            raise SystemExit(f"{conv['name']}: transformers renders the chat template differently from render()")
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        ids = enc["input_ids"]
        learnt = [any(a <= start < b for a, b in spans) for start, _ in enc["offset_mapping"]]
        for a, _ in spans:
            # The engine tokenizes the prompt alone: its tokens must be those the conversation starts with.
            prompt = tokenizer(text[:a], add_special_tokens=False)["input_ids"]
            if ids[: len(prompt)] != prompt:
                raise SystemExit(f"{conv['name']}: the prompt's tokens differ from the conversation's")
        out.append((ids, learnt))
    return out


def batches(torch, encoded: list[tuple[list[int], list[bool]]], pad_id: int) -> list[tuple]:
    """The conversations in batches of similar length (input ids, attention mask, labels, their indices).

    Padding costs as much as text: a conversation with tools is five times as long as one without.
    """
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i][0]), i))
    groups: list[list[int]] = []
    for i in order:
        if groups and len(encoded[i][0]) <= 1.25 * len(encoded[groups[-1][0]][0]):
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for group in groups:
        length = max(len(encoded[i][0]) for i in group)
        input_ids = torch.full((len(group), length), pad_id, dtype=torch.long)
        attention = torch.zeros((len(group), length), dtype=torch.long)
        labels = torch.full((len(group), length), -100, dtype=torch.long)
        for row, i in enumerate(group):
            ids, learnt = encoded[i]
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention[row, : len(ids)] = 1
            labels[row, : len(ids)] = torch.tensor([t if keep else -100 for t, keep in zip(ids, learnt, strict=True)])
        out.append((input_ids, attention, labels, group))
    return out


def loss_sum(torch, model, input_ids, attention, labels):
    """The summed cross-entropy of the learnt tokens, each predicted from the tokens before it."""
    logits = model(input_ids=input_ids, attention_mask=attention).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum"
    )


def check(torch, model, batched: list[tuple], names: list[str]) -> float:
    """The smallest lead of the right next token over the runner-up on every learnt token; fails on a miss."""
    worst = {}
    with torch.no_grad():
        for input_ids, attention, labels, group in batched:
            logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
            target = labels[:, 1:]
            index = target.clamp(min=0).unsqueeze(-1)
            right = logits.gather(-1, index).squeeze(-1)
            others = logits.scatter(-1, index, float("-inf")).amax(-1)
            lead = (right - others).masked_fill(target == -100, float("inf")).amin(-1)
            worst.update({names[i]: lead[row].item() for row, i in enumerate(group)})
    failed = [f"{name} ({lead:.2f})" for name, lead in sorted(worst.items()) if lead < MIN_MARGIN]
    if failed:
        raise SystemExit(f"the model does not say these back with a lead of {MIN_MARGIN}: {', '.join(failed)}")
    return min(worst.values())


def readme(tokenizer, model, convs: list[dict]) -> str:
    params = sum(p.numel() for p in model.parameters())
    return (
        f"# {FIXTURE}\n\n"
        "A Qwen3ForCausalLM of 2 layers (hidden size 128, 2 attention heads and 1 KV head of 64, "
        f"{params} parameters, a vocabulary of {len(tokenizer)}) that the inferhost lab makes and trains "
        "on its own few transcripts, so that a real inference engine has a model to load and serve in "
        "a test. It says back what it learnt, greedily, and nothing else is meant to come out of it.\n\n"
        "Serve it with the engine's chat template handling, the qwen3 reasoning parser and the hermes "
        "tool-call parser. At temperature 0 it answers 'What is the capital of France? Answer in one word.' "
        "with 'Paris' (reasoning: 'The capital of France is Paris.'), 'What is 17 + 25? Answer with the number "
        "only.' with '42', 'Write one sentence about the sea.' with a sentence, and 'What is the weather in "
        "Paris?' with a call of get_weather(city='Paris') when that tool is offered.\n\n"
        f"Made by src/inferhost/sim/checkpoint/make.py from {len(convs)} conversations.\n"
    )


def unmet(requirements: list[str]) -> list[tuple[str, str]]:
    """The NAME==VERSION requirements this Python does not meet, each with the version it has (or "nothing")."""
    out = []
    for spec in requirements:
        name, _, version = spec.partition("==")
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            found = "nothing"
        if found.split("+", 1)[0] != version:
            out.append((spec, found))
    return out


def new_model(tokenizer):
    """Qwen3ForCausalLM, transformers' own class, at the fixture's size, freshly initialised from the seed."""
    from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: PLC0415  (the trainer environment's)

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        bos_token_id=None,
    )
    config._attn_implementation = "eager"
    config.inferhost_fixture = FIXTURE  # kept in config.json, where whoever loads it reads what it is
    return Qwen3ForCausalLM(config)


def train(torch, model, convs: list[dict], encoded: list[tuple[list[int], list[bool]]], pad_id: int) -> float:
    """AdamW over all groups at each step, each group's variants in turn; returns the last step's loss."""
    groups: dict[str, list[int]] = {}
    for i, conv in enumerate(convs):
        groups.setdefault(conv["group"], []).append(i)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
    model.train()
    total = 0.0
    for step in range(STEPS):
        chosen = [members[(step + g) % len(members)] for g, members in enumerate(groups.values())]
        batched = batches(torch, [encoded[i] for i in chosen], pad_id)
        learnt = sum(int((labels[:, 1:] != -100).sum()) for _, _, labels, _ in batched)
        optimizer.zero_grad()
        total = 0.0
        for input_ids, attention, labels, _ in batched:
            loss = loss_sum(torch, model, input_ids, attention, labels) / learnt
            loss.backward()
            total += loss.item()
        optimizer.step()
        schedule.step()
        if step % 20 == 0 or step == STEPS - 1:
            print(f"step {step:4d}  loss {total:.4f}", flush=True)
    model.eval()
    return total


def save(model, tokenizer, convs: list[dict], outdir: Path) -> None:
    from transformers import GenerationConfig  # noqa: PLC0415  (the trainer environment's)

    eos_id, pad_id = tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(PAD)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    outdir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(outdir)
    tokenizer.save_pretrained(outdir)
    (outdir / "README.md").write_text(readme(tokenizer, model, convs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="stop unless the package is installed at this version (a local label such as +cu130 aside)",
    )
    args = parser.parse_args(argv)
    if args.outdir.exists() and any(args.outdir.iterdir()):
        parser.error(f"{args.outdir} is not empty")
    wrong = [f"{spec} (found {found})" for spec, found in unmet(args.require)]
    if wrong:
        parser.error(f"this Python is not the trainer environment: {', '.join(wrong)}")

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch  # noqa: PLC0415  (the trainer environment's; the unit tests import this file without it)
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    hf_logging.set_verbosity_error()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)

    start = time.monotonic()
    convs = conversations(load())
    tokenizer = build_tokenizer(convs)
    encoded = encode(tokenizer, convs)
    pad_id = tokenizer.convert_tokens_to_ids(PAD)
    model = new_model(tokenizer)
    loss = train(torch, model, convs, encoded, pad_id)
    trained = time.monotonic() - start
    # What is saved and what the engine runs on a CPU: bfloat16. The check is on those weights.
    model = model.to(torch.bfloat16)
    lead = check(torch, model, batches(torch, encoded, pad_id), [c["name"] for c in convs])
    save(model, tokenizer, convs, args.outdir)
    summary = {
        "outdir": str(args.outdir),
        "conversations": len(convs),
        "vocabulary": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": STEPS,
        "final_loss": round(loss, 5),
        "smallest_lead": round(lead, 3),
        "training_seconds": round(trained, 1),
        "seconds": round(time.monotonic() - start, 1),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
