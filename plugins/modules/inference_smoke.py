#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import collections
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: inference_smoke
short_description: Ask an OpenAI-compatible service a few real questions and judge the answers
description:
  - Sends each prompt through C(/v1/chat/completions) and checks that the answer is non-empty, is not
    degenerate (one token or character repeated, as broken kernels produce) and contains what the prompt
    expects.
  - Tolerates reasoning models. One that spends all of C(max_tokens) on reasoning returns C(content) null
    with C(finish_reason) length; the prompt is then asked again with O(reasoning_max_tokens), and the
    result says so, rather than calling the model broken or silently passing it.
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
"""

RETURN = r"""
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
      reasoning_only: false
      retried_for_reasoning: false
      latency_s: 0.8
      problem: ""
reasoning_retries:
  description: How many prompts needed the larger budget because the model spent max_tokens on reasoning.
  returned: always
  type: int
"""


def ask(request, url, key, *, model, prompt, max_tokens, timeout):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    start = time.monotonic()
    status, reply = request(url.rstrip("/") + "/v1/chat/completions", key, body, timeout=timeout)
    if status != 200 or not isinstance(reply, dict):
        raise RuntimeError(f"HTTP {status}" if isinstance(status, int) else str(status))
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    return {
        "answer": message.get("content"),
        "reasoning_chars": len(reasoning),
        "finish_reason": choice.get("finish_reason"),
        "latency_s": round(time.monotonic() - start, 2),
    }


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
        },
        supports_check_mode=True,
    )
    # Imported after argument parsing, so ansible-lint's args rule can validate tasks without our module_utils.
    from ansible.module_utils.inference.client import read_key, request  # noqa: PLC0415

    p = module.params
    key = read_key(p["secret_file"])
    results, retries = [], 0
    for item in p["prompts"]:
        prompt = str(item.get("prompt", ""))
        budget = int(item.get("max_tokens") or p["max_tokens"])
        entry = {"prompt": prompt, "max_tokens": budget, "retried_for_reasoning": False}
        try:
            asking = {"model": p["model"], "prompt": prompt, "timeout": p["request_timeout"]}
            result = ask(request, p["url"], key, max_tokens=budget, **asking)
            entry["reasoning_only"] = result["answer"] is None and result["reasoning_chars"] > 0
            if entry["reasoning_only"] and result["finish_reason"] == "length" and budget < p["reasoning_max_tokens"]:
                retries += 1
                entry.update(retried_for_reasoning=True, max_tokens=p["reasoning_max_tokens"])
                result = ask(request, p["url"], key, max_tokens=p["reasoning_max_tokens"], **asking)
            entry.update(result)
            entry["problem"] = judge(result, item.get("expect"))
        except RuntimeError as exc:
            entry.update(answer=None, problem=f"request failed: {exc}")
        entry["ok"] = not entry["problem"]
        results.append(entry)
    failed = [r for r in results if not r["ok"]]
    summary = f"{len(results) - len(failed)}/{len(results)} prompts answered well"
    if retries:
        summary += (
            f"; {retries} answered only after the model had spent max_tokens on reasoning (content null), "
            f"given {p['reasoning_max_tokens']} tokens the second time"
        )
    if failed:
        problems = "; ".join(f"{r['prompt'][:40]!r}: {r['problem']}" for r in failed)
        module.fail_json(msg=f"{summary}. Problems: {problems}", results=results, reasoning_retries=retries)
    module.exit_json(changed=False, msg=summary, results=results, reasoning_retries=retries)


if __name__ == "__main__":
    main()
