"""What the optional request features cost per request: `prepare_request` with and without them.

    taskset -c 1 .venv/bin/python bench/request_fields.py [--repeats 200] [--items 200]

Rows, each `prepare_request` of one body (the prefix cache warm, as for an agent's later turns):

- `plain`: an agent's history of `--items` items with 3 function tools, nothing else set;
- `tool_choice=required`: the same with `tool_choice: "required"` (builds the guided-decoding
  constraint); `+ 60 tools`: with 60 function tools (Codex-sized MCP sets);
- `sealed reasoning`: the history's reasoning items carry `encrypted_content` the proxy sealed,
  and `include: ["reasoning.encrypted_content"]` (every blob opened with AES-GCM);
- `truncation=auto fits`: `max_prompt_tokens` above the prompt (the check alone);
- `truncation=auto cuts`: `max_prompt_tokens` at half the prompt (renders each message once
  more, then the kept half);
- `truncation=auto, no cache`: the same without the prefix cache.

Rows alternate call by call so drift hits them alike. Prints median and p90 µs per call and the
prompt length, on one core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from proxy import vocab
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.request.prepare import prepare_request

MODEL = "openai/gpt-oss-120b"
KEYS = ReasoningKeys((("bench", b"k" * 32),))


def _tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": f"The {name} tool.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }


def history(items: int, sealed: bool) -> list[dict[str, Any]]:
    """User turns, reasoning, a call and its output, repeating, ending with a user message."""
    out: list[dict[str, Any]] = []
    for number in range(items // 4):
        thought = f"Step {number}: look the answer up before replying. " * 3
        reasoning: dict[str, Any] = {"type": "reasoning", "summary": []}
        if sealed:
            reasoning["encrypted_content"] = KEYS.seal([thought])
        else:
            reasoning["content"] = [{"type": "reasoning_text", "text": thought}]
        call_id = f"call_{number}"
        out += [
            {"role": "user", "content": f"Question {number}: what does the log say?"},
            reasoning,
            {
                "type": "function_call",
                "name": "tool_0",
                "arguments": '{"q":"x"}',
                "call_id": call_id,
            },
            {"type": "function_call_output", "call_id": call_id, "output": "log line " * 20},
        ]
    out.append({"role": "user", "content": "Summarise."})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--items", type=int, default=200)
    args = parser.parse_args()
    encoding = vocab.load_encoding(vocab.ensure_vocab(os.environ))
    cache = PrefixCache(encoding)
    tools3 = [_tool(f"tool_{n}") for n in range(3)]
    tools60 = [_tool(f"tool_{n}") for n in range(60)]
    plain = {"model": MODEL, "input": history(args.items, False), "tools": tools3}
    full = len(prepare_request(plain, encoding).prompt_token_ids)
    sealed = {
        **plain,
        "input": history(args.items, True),
        "include": ["reasoning.encrypted_content"],
    }
    auto = {**plain, "truncation": "auto"}

    def call(
        body: dict[str, Any], *, limit: int | None = None, cached: bool = True
    ) -> Callable[[], int]:
        def run() -> int:
            prepared = prepare_request(
                body,
                encoding,
                prefixes=cache if cached else None,
                reasoning_keys=KEYS,
                max_prompt_tokens=limit,
            )
            return len(prepared.prompt_token_ids)

        return run

    rows: dict[str, Callable[[], int]] = {
        "plain": call(plain),
        "tool_choice=required": call({**plain, "tool_choice": "required"}),
        "tool_choice=required + 60 tools": call(
            {**plain, "tools": tools60, "tool_choice": "required"}
        ),
        "sealed reasoning": call(sealed),
        "truncation=auto fits": call(auto, limit=full + 10),
        "truncation=auto cuts": call(auto, limit=full // 2),
        "truncation=auto cuts, no cache": call(auto, limit=full // 2, cached=False),
    }
    lengths = {name: run() for name, run in rows.items()}  # warm the cache, check they run
    assert lengths["sealed reasoning"] == lengths["plain"], "sealed items render as plain ones"
    timings: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeats):
        for name, run in rows.items():
            started = time.perf_counter()
            run()
            timings[name].append((time.perf_counter() - started) * 1e6)
    print(f"prepare_request, {args.items} input items, {args.repeats} calls per row (µs)\n")
    print("| body | median µs | p90 µs | prompt tokens |")
    print("| --- | ---: | ---: | ---: |")
    for name, values in timings.items():
        values.sort()
        p90 = values[int(0.9 * (len(values) - 1))]
        print(f"| {name} | {statistics.median(values):.0f} | {p90:.0f} | {lengths[name]} |")


if __name__ == "__main__":
    main()
