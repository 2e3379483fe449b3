#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import collections
import json
import re
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: inference_smoke
short_description: Ask an OpenAI-compatible service what its users depend on, and judge the answers
description:
  - An engine whose generation is dead still answers C(/health) and C(/v1/models) (vLLM issues 16259 and 53157),
    so this asks for generated tokens and for the API's parsed structures.
  - First a one-token completion (C(/v1/completions), C(max_tokens) 1) must come back with one generated token.
    When it does not, the module fails at once with what came back and asks nothing else.
  - Sends each prompt through C(/v1/chat/completions) and checks that the answer is non-empty, is not
    degenerate (one token or character repeated, as broken kernels produce) and contains what the prompt
    expects.
  - Tolerates reasoning models. One that spends all of C(max_tokens) on reasoning returns C(content) null
    with C(finish_reason) length; the prompt is then asked again with O(reasoning_max_tokens), and the
    result says so, rather than calling the model broken or silently passing it.
  - With O(tool_call_parser), asks "What is the weather in Paris?" offering one tool, C(get_weather(city)), and
    requires the engine to return it parsed, in C(message.tool_calls), with JSON arguments naming Paris and
    C(finish_reason) tool_calls.
  - With O(reasoning_parser), requires at least one prompt's reasoning in C(message.reasoning_content) (SGLang,
    older vLLM) or C(message.reasoning) (newer vLLM), and no C(<think>) or C(</think>) left in any answer. A
    parser that keeps the reasoning in the content on purpose (C(minimax_m2_append_think),
    C(minimax-append-think)) is not checked.
  - With O(metrics), reads C(/metrics) (with the key, as the other requests) and reports one of the engine's own
    metrics (C(vllm:) or C(sglang:)).
  - The API key is read on the target from the unit's secret environment file.
  - Changes nothing.
version_added: "0.1.0"
author: inferhost contributors
options:
  prompts:
    description: Each with C(prompt), optional C(expect) (text, or a list of alternatives, that the answer must
      contain, case-insensitive) and optional C(max_tokens).
    type: list
    elements: dict
    required: true
  max_tokens:
    description: Room for an answer on the first try.
    type: int
    default: 256
  reasoning_max_tokens:
    description: Room on the second try, for a model that spent the first on reasoning.
    type: int
    default: 4096
  request_timeout:
    description: Seconds one request may take.
    type: int
    default: 600
  completion_timeout:
    description:
      - Seconds the first request, the one-token completion, may take. It bounds how long a hung engine (one that
        still answers C(/health)) takes to be called not generating; far above an idle engine's first-token time.
    type: int
    default: 30
  service:
    description: The service's name, for the messages; the model name when not given.
    type: str
  engine:
    description: The service's engine, whose metrics C(/metrics) must have; without it, either engine's count.
    type: str
    choices: [vllm, sglang]
  tool_call_parser:
    description:
      - The tool-call parser the engine runs with (vLLM parses tool calls only with C(--enable-auto-tool-choice)
        as well). Without one the tool call is not asked.
    type: str
  reasoning_parser:
    description: The reasoning parser the engine runs with. Without one the reasoning is not checked.
    type: str
  metrics:
    description:
      - Whether C(/metrics) must have the engine's metrics (SGLang serves them only with C(--enable-metrics)).
    type: bool
    default: true
extends_documentation_fragment:
  - inference_client
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Ask the model a few questions
  inference_smoke:
    url: http://127.0.0.1:8000
    model: Kimi-K2.5
    prompts:
      - {prompt: "What is the capital of France? Answer in one word.", expect: Paris}
      - {prompt: "What is 17 + 25? Answer with the number only.", expect: "42"}

- name: Ask what users depend on, as the service's command line promises it
  inference_smoke:
    url: http://127.0.0.1:8000
    model: Qwen3.5-397B-A17B
    service: qwen35
    engine: sglang
    tool_call_parser: qwen3_coder
    reasoning_parser: qwen3
    prompts:
      - {prompt: "What is the capital of France? Answer in one word.", expect: Paris}
    secret_file: /etc/inferhost/services/qwen35.secret.env
"""

RETURN = r"""
msg:
  description: One part per check, in one line.
  returned: always
  type: str
  sample: '3/3 prompts answered well; tool call get_weather {"city": "Paris"}; reasoning split (31 chars);
    one-token completion ok; vllm:num_requests_running 0'
results:
  description: One entry per prompt.
  returned: always
  type: list
  elements: dict
  sample:
    - prompt: What is 17 + 25?
      answer: "42"
      ok: true
      finish_reason: stop
      max_tokens: 256
      reasoning_chars: 0
      reasoning_only: false
      retried_for_reasoning: false
      latency_s: 0.8
      problem: ""
reasoning_retries:
  description: How many prompts needed the larger budget because the model spent max_tokens on reasoning.
  returned: always
  type: int
completion:
  description: The one-token completion.
  returned: always
  type: dict
  sample: {ok: true, text: " Paris", completion_tokens: 1, finish_reason: length, problem: ""}
tool_call:
  description: The tool call the engine returned; C(checked) false without a tool-call parser.
  returned: unless the one-token completion failed
  type: dict
  sample: {checked: true, ok: true, name: get_weather, arguments: {city: Paris}, finish_reason: tool_calls,
           retried_for_reasoning: false, problem: ""}
reasoning:
  description: Whether the reasoning came apart from the content; C(checked) false without a reasoning parser.
  returned: unless the one-token completion failed
  type: dict
  sample: {checked: true, ok: true, chars: 31, problem: ""}
metric:
  description: The engine metric read from C(/metrics) (the sum over its label sets); C(checked) false when not asked.
  returned: unless the one-token completion failed
  type: dict
  sample: {checked: true, ok: true, name: "vllm:num_requests_running", value: 0.0, problem: ""}
"""

COMPLETION_PROMPT = "The capital of France is"
TOOL_PROMPT = "What is the weather in Paris?"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
            "required": ["city"],
        },
    },
}
THINK_TAGS = ("<think>", "</think>")
# Reasoning parsers that leave the reasoning in the content on purpose, "<think>" prepended (vLLM's
# minimax_m2_append_think, SGLang's minimax-append-think): MiniMax-M2 wants its thinking sent back.
APPEND_THINK = re.compile(r"append[-_]think")
# The metric reported when it is there (a gauge of requests in flight, then counters); else the engine's first.
PREFERRED_METRICS = (
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "vllm:request_success_total",
    "sglang:num_requests_total",
    "vllm:generation_tokens_total",
    "sglang:generation_tokens_total",
)
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)")


def came_back(status, text, body):
    """What a failed request got, for a person: the status and the engine's own message."""
    if not isinstance(status, int):
        return str(status)
    detail = ""
    if isinstance(body, dict):
        error = body.get("error")
        detail = (error.get("message") if isinstance(error, dict) else error) or body.get("message") or ""
        detail = detail or body.get("detail") or ""
    detail = str(detail or text or "").strip()
    detail = " ".join(detail.split())
    return f"HTTP {status}: {detail[:300]}" if detail else f"HTTP {status}"


def chat(call, model, messages, max_tokens, **extra):
    """One chat completion; the parts the checks judge. RuntimeError with what came back unless it answered."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    start = time.monotonic()
    status, text, reply = call("/v1/chat/completions", body)
    if status != 200 or not isinstance(reply, dict):
        raise RuntimeError(came_back(status, text, reply))
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    return {
        "answer": message.get("content"),
        "reasoning_chars": len(reasoning),
        "finish_reason": choice.get("finish_reason"),
        "tool_calls": message.get("tool_calls") or [],
        "latency_s": round(time.monotonic() - start, 2),
    }


def one_token(call, model):
    """A real completion of exactly one token: what /health and /v1/models never prove."""
    body = {"model": model, "prompt": COMPLETION_PROMPT, "max_tokens": 1, "temperature": 0}
    status, text, reply = call("/v1/completions", body)
    asked = "the one-token completion (POST /v1/completions, max_tokens 1)"
    if status != 200 or not isinstance(reply, dict):
        return {"ok": False, "problem": f"{asked} answered {came_back(status, text, reply)}"}
    choice = (reply.get("choices") or [{}])[0]
    generated = (reply.get("usage") or {}).get("completion_tokens")
    result = {"text": choice.get("text"), "completion_tokens": generated, "finish_reason": choice.get("finish_reason")}
    problem = ""
    if generated != 1 or not isinstance(result["text"], str):
        problem = (
            f"{asked} came back with {generated} generated tokens (usage.completion_tokens), "
            f"text {result['text']!r}, finish_reason {result['finish_reason']!r}"
        )
    return {**result, "ok": not problem, "problem": problem}


def degenerate(text):
    """A broken kernel's output: one token over and over, or one character repeated."""
    words = text.split()
    if len(words) >= 8 and collections.Counter(words).most_common(1)[0][1] / len(words) > 0.5:
        return "one token repeated in most of the answer"
    stripped = text.replace(" ", "")
    if len(stripped) >= 16 and collections.Counter(stripped).most_common(1)[0][1] / len(stripped) > 0.8:
        return "one character repeated in most of the answer"
    return ""


def judge(result, expect):
    answer = result["answer"]
    if answer is None or not str(answer).strip():
        if result["reasoning_chars"]:
            return "content empty: the model spent max_tokens on reasoning"
        return "empty answer"
    problem = degenerate(str(answer))
    if problem:
        return problem
    options = [expect] if isinstance(expect, str) else list(expect or [])
    options = [o for o in options if str(o)]
    if options and not any(str(o).lower() in str(answer).lower() for o in options):
        return f"the answer does not contain {' or '.join(map(repr, options))}"
    return ""


def short(text, limit=80):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_arguments(arguments):
    """(the tool call's arguments as a dict, or None; the problem): engines send them as a JSON text."""
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return None, f"the arguments are not JSON: {short(arguments)!r}"
    if not isinstance(parsed, dict):
        return None, f"the arguments are not a JSON object: {short(json.dumps(parsed))!r}"
    return parsed, ""


def judge_tool_call(result):
    """(problem, name, arguments) of the answer to TOOL_PROMPT; problem is "" when get_weather(Paris) came parsed."""
    calls = result["tool_calls"]
    if not calls or not isinstance(calls, list) or not isinstance(calls[0], dict):
        content = result["answer"]
        said = f", content {short(content)!r}" if content else ", no content"
        return f"no tool call in message.tool_calls (finish_reason {result['finish_reason']!r}{said})", None, None
    function = calls[0].get("function") or {}
    name = function.get("name")
    if name != TOOL["function"]["name"]:
        return f"the tool called is {name!r}, not get_weather", name, None
    parsed, problem = parse_arguments(function.get("arguments"))
    if not problem and str(parsed.get("city", "")).strip().lower() != "paris":
        problem = f"the arguments {short(json.dumps(parsed, ensure_ascii=False))} do not name the city Paris"
    if not problem and result["finish_reason"] != "tool_calls":
        problem = f"finish_reason is {result['finish_reason']!r}, not 'tool_calls'"
    return problem, name, parsed


def check_tool_call(call, model, parser, max_tokens, reasoning_max_tokens):
    messages = [{"role": "user", "content": TOOL_PROMPT}]
    entry = {"checked": True, "parser": parser, "retried_for_reasoning": False}
    try:
        result = chat(call, model, messages, max_tokens, tools=[TOOL], tool_choice="auto")
        thought_only = not result["tool_calls"] and not result["answer"] and result["reasoning_chars"]
        if thought_only and result["finish_reason"] == "length" and max_tokens < reasoning_max_tokens:
            entry["retried_for_reasoning"] = True
            result = chat(call, model, messages, reasoning_max_tokens, tools=[TOOL], tool_choice="auto")
    except RuntimeError as exc:
        return {**entry, "ok": False, "problem": f"tool call (parser {parser}): the request answered {exc}"}
    problem, name, arguments = judge_tool_call(result)
    entry.update(name=name, arguments=arguments, finish_reason=result["finish_reason"])
    entry.update(ok=not problem, problem=f"tool call (parser {parser}): {problem}" if problem else "")
    return entry


def judge_reasoning(results, parser):
    """Whether the prompts' reasoning came apart from their content, as the reasoning parser is there for."""
    tagged = [r for r in results if any(tag in str(r.get("answer") or "") for tag in THINK_TAGS)]
    if tagged:
        prompt = tagged[0]["prompt"][:40]
        problem = f"the answer to {prompt!r} has <think>/</think> in its content (reasoning parser {parser})"
        return {"checked": True, "ok": False, "chars": 0, "problem": problem}
    carried = [r["reasoning_chars"] for r in results if r.get("reasoning_chars")]
    if not carried:
        problem = (
            f"no answer carried message.reasoning_content or message.reasoning (reasoning parser {parser}): "
            "the reasoning was not separated, or the model did not reason"
        )
        return {"checked": True, "ok": False, "chars": 0, "problem": problem}
    return {"checked": True, "ok": True, "chars": carried[0], "problem": ""}


def parse_metrics(text):
    """{name: [value of each label set]} of a Prometheus text exposition, in the order it lists them."""
    samples = {}
    for line in str(text).splitlines():
        match = SAMPLE.match(line.strip())
        if not match or line.lstrip().startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        samples.setdefault(match.group(1), []).append(value)
    return samples


def number(value):
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def check_metrics(call, engine):
    prefixes = (f"{engine}:",) if engine else ("vllm:", "sglang:")
    status, text, body = call("/metrics")
    if status != 200:
        hint = " (SGLang serves /metrics only with --enable-metrics)" if engine == "sglang" and status == 404 else ""
        return {"checked": True, "ok": False, "problem": f"GET /metrics answered {came_back(status, text, body)}{hint}"}
    samples = parse_metrics(text)
    names = [n for n in samples if n.startswith(prefixes) and not n.endswith("_created")]
    if not names:
        wanted = " or ".join(p + "*" for p in prefixes)
        problem = f"GET /metrics has no {wanted} metric ({sum(map(len, samples.values()))} samples of others)"
        return {"checked": True, "ok": False, "problem": problem}
    name = next((n for n in PREFERRED_METRICS if n in names), names[0])
    return {"checked": True, "ok": True, "name": name, "value": sum(samples[name]), "problem": ""}


def ask_prompts(call, p):
    results, retries = [], 0
    for item in p["prompts"]:
        prompt = str(item.get("prompt", ""))
        budget = int(item.get("max_tokens") or p["max_tokens"])
        entry = {"prompt": prompt, "max_tokens": budget, "retried_for_reasoning": False}
        messages = [{"role": "user", "content": prompt}]
        try:
            result = chat(call, p["model"], messages, budget)
            entry["reasoning_only"] = result["answer"] is None and result["reasoning_chars"] > 0
            if entry["reasoning_only"] and result["finish_reason"] == "length" and budget < p["reasoning_max_tokens"]:
                retries += 1
                entry.update(retried_for_reasoning=True, max_tokens=p["reasoning_max_tokens"])
                result = chat(call, p["model"], messages, p["reasoning_max_tokens"])
            result.pop("tool_calls")
            entry.update(result)
            entry["problem"] = judge(result, item.get("expect"))
        except RuntimeError as exc:
            entry.update(answer=None, reasoning_chars=0, problem=f"request failed: {exc}")
        entry["ok"] = not entry["problem"]
        results.append(entry)
    return results, retries


def prompts_part(results, retries, reasoning_max_tokens):
    failed = [r for r in results if not r["ok"]]
    part = f"{len(results) - len(failed)}/{len(results)} prompts answered well"
    if retries:
        part += (
            f"; {retries} answered only after the model had spent max_tokens on reasoning (content null), "
            f"given {reasoning_max_tokens} tokens the second time"
        )
    return part, [f"{r['prompt'][:40]!r}: {r['problem']}" for r in failed]


def tool_call_part(call, p):
    """(result, the message's part, problem or "") of the tool-call check."""
    if not p["tool_call_parser"]:
        return {"checked": False}, "tool call not checked (no tool-call parser)", ""
    tool = check_tool_call(call, p["model"], p["tool_call_parser"], p["max_tokens"], p["reasoning_max_tokens"])
    if not tool["ok"]:
        return tool, "tool call failed", tool["problem"]
    return tool, f"tool call {tool['name']} {json.dumps(tool['arguments'], ensure_ascii=False)}", ""


def reasoning_part(results, parser):
    """(result, the message's part, problem or "") of the reasoning check, over the prompts' answers."""
    if not parser:
        return {"checked": False}, "reasoning not checked (no reasoning parser)", ""
    if APPEND_THINK.search(parser):
        return {"checked": False}, f"reasoning not checked ({parser} keeps it in the content)", ""
    reasoning = judge_reasoning(results, parser)
    if not reasoning["ok"]:
        return reasoning, "reasoning not split", reasoning["problem"]
    return reasoning, f"reasoning split ({reasoning['chars']} chars)", ""


def metric_part(call, p):
    """(result, the message's part, problem or "") of the /metrics check."""
    if not p["metrics"]:
        return {"checked": False}, "metrics not checked (the engine runs without them)", ""
    metric = check_metrics(call, p["engine"])
    if not metric["ok"]:
        return metric, "no engine metric", metric["problem"]
    return metric, f"{metric['name']} {number(metric['value'])}", ""


def run_checks(call, p):
    """Every check in turn; (ok, message, the module's result values)."""
    service = p["service"] or p["model"]
    completion = one_token(lambda path, body=None: call(path, body, timeout=p["completion_timeout"]), p["model"])
    if not completion["ok"]:
        message = (
            f"{service}: {completion['problem'].rstrip('.')}. Nothing else was asked: an engine whose generation "
            "is dead still answers /health and /v1/models"
        )
        return False, message, {"completion": completion, "results": [], "reasoning_retries": 0}
    results, retries = ask_prompts(call, p)
    part, problems = prompts_part(results, retries, p["reasoning_max_tokens"])
    tool, tool_text, tool_problem = tool_call_part(call, p)
    reasoning, reasoning_text, reasoning_problem = reasoning_part(results, p["reasoning_parser"])
    metric, metric_text, metric_problem = metric_part(call, p)
    message = f"{part}; {tool_text}; {reasoning_text}; one-token completion ok; {metric_text}"
    problems += [problem for problem in (tool_problem, reasoning_problem, metric_problem) if problem]
    values = {
        "results": results,
        "reasoning_retries": retries,
        "completion": completion,
        "tool_call": tool,
        "reasoning": reasoning,
        "metric": metric,
    }
    if problems:
        return False, f"{service}: {message}. Problems: {'; '.join(problems)}", values
    return True, message, values


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "prompts": {"type": "list", "elements": "dict", "required": True},
            "max_tokens": {"type": "int", "default": 256},
            "reasoning_max_tokens": {"type": "int", "default": 4096},
            "secret_file": {"type": "path"},
            "request_timeout": {"type": "int", "default": 600},
            "completion_timeout": {"type": "int", "default": 30},
            "service": {"type": "str"},
            "engine": {"type": "str", "choices": ["vllm", "sglang"]},
            "tool_call_parser": {"type": "str"},
            "reasoning_parser": {"type": "str"},
            "metrics": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    # Imported after argument parsing, so ansible-lint's args rule can validate tasks without our module_utils.
    from ansible.module_utils.inference.client import exchange, read_key  # noqa: PLC0415

    p = module.params
    key = read_key(p["secret_file"])
    base = p["url"].rstrip("/")

    def call(path, body=None, timeout=None):
        return exchange(base + path, key, body, timeout=timeout or p["request_timeout"])

    ok, message, values = run_checks(call, p)
    if not ok:
        module.fail_json(msg=message, **values)
    module.exit_json(changed=False, msg=message, **values)


if __name__ == "__main__":
    main()
