"""Request preparation: `prepare_request` per call, without and with the prefix cache.

    taskset -c 1 .venv/bin/python bench/prepare.py [--repeats 400]

Three bodies: one line of input; three function tools and instructions; an agent's 20-item
history (messages, reasoning, tool calls and their outputs) with those tools. `uncached` is
`prepare_request(body, encoding)`, the path before request/prefix.py; `hit` passes a warm
`PrefixCache` (an agent's second and later requests); `miss` passes a one-entry cache that another
body's prefix has just filled, so the call misses and evicts. The columns alternate call by call,
so drift hits them alike; before timing, the script checks that cached and uncached prompt ids
are equal. Prints the median and p90 per call in µs, on one core.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from openai_harmony import HarmonyEncoding

from proxy import vocab
from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.request.prepare import prepare_request

MODEL = "openai/gpt-oss-120b"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "array", "items": {"type": "string"}},
                "workdir": {"type": "string", "description": "Working directory."},
                "timeout_ms": {"type": "number", "description": "Timeout in milliseconds."},
            },
            "required": ["command"],
        },
    },
    {
        "type": "function",
        "name": "read_file",
        "description": "Reads a file of the workspace.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "offset": {"type": "integer", "description": "First line, 1-based."},
                "limit": {"type": "integer", "description": "Lines to read."},
            },
            "required": ["path"],
        },
    },
    {
        "type": "function",
        "name": "apply_patch",
        "description": "Applies a unified diff to the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"patch": {"type": "string", "description": "The diff."}},
            "required": ["patch"],
        },
    },
]

INSTRUCTIONS = (
    "You are a coding agent working in the user's repository. Read before you edit, keep changes "
    "small, run the tests you touch, and report what you changed and why."
)


def history(n_items: int) -> list[dict[str, Any]]:
    """A user request, then reasoning / call / output rounds, then the assistant's answer."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test in tests/."}]
    for number in itertools.count():
        if len(items) + 4 > n_items:
            break
        summary = [{"type": "summary_text", "text": f"Step {number}: look at the next file."}]
        items.append({"type": "reasoning", "id": f"rs_{number}", "summary": summary})
        call = {"type": "function_call", "call_id": f"call_{number}", "name": "read_file"}
        items.append({**call, "arguments": f'{{"path": "src/module_{number}.py"}}'})
        output = f"def f_{number}(x):\n    return x * {number}\n"
        items.append(
            {"type": "function_call_output", "call_id": f"call_{number}", "output": output}
        )
    while len(items) < n_items:
        items.append({"role": "assistant", "content": "The test passes now."})
    return items


CASES: dict[str, dict[str, Any]] = {
    "one-line input": {"model": MODEL, "input": "What is the capital of France?"},
    "3 tools + instructions": {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "tools": TOOLS,
        "input": "List the files in src/.",
    },
    "20-item agent history": {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "tools": TOOLS,
        "reasoning": {"effort": "medium"},
        "input": history(20),
    },
}


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(
    encoding: HarmonyEncoding, body: dict[str, Any], repeats: int
) -> dict[str, list[float]]:
    warm = PrefixCache(encoding)
    cold = PrefixCache(encoding, capacity=1)
    other = {**body, "instructions": "Another agent."}
    cached = prepare_request(body, encoding, prefixes=warm).prompt_token_ids
    assert cached == prepare_request(body, encoding).prompt_token_ids, "ids differ"
    times: dict[str, list[float]] = {"uncached": [], "hit": [], "miss": []}
    for _ in range(repeats):
        times["uncached"].append(timed(lambda: prepare_request(body, encoding)))
        times["hit"].append(timed(lambda: prepare_request(body, encoding, prefixes=warm)))
        prepare_request(other, encoding, prefixes=cold)  # the next call misses and evicts it
        times["miss"].append(timed(lambda: prepare_request(body, encoding, prefixes=cold)))
    assert warm.stats().misses == 1
    assert cold.stats().hits == 0
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=400)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    encoding = vocab.load_encoding(vocab.ensure_vocab(os.environ))
    print(
        f"{'body':<24} {'prompt ids':>10} {'uncached µs':>11} {'hit µs':>7} {'miss µs':>8} "
        f"{'p90 uncached':>12} {'p90 hit':>8} {'hit speed-up':>12}"
    )
    for name, body in CASES.items():
        n_ids = len(prepare_request(body, encoding).prompt_token_ids)
        times = measure(encoding, body, args.repeats)
        median = {column: statistics.median(values) * 1e6 for column, values in times.items()}
        p90 = {
            column: statistics.quantiles(values, n=10)[-1] * 1e6 for column, values in times.items()
        }
        print(
            f"{name:<24} {n_ids:>10} {median['uncached']:>11.0f} {median['hit']:>7.0f} "
            f"{median['miss']:>8.0f} {p90['uncached']:>12.0f} {p90['hit']:>8.0f} "
            f"{median['uncached'] / median['hit']:>11.2f}x"
        )


if __name__ == "__main__":
    main()
