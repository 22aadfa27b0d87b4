"""Render cost on and off the event loop: the inline fast path's worst case and
the round trip to a render worker.

    taskset -c 1 .venv/bin/python bench/render_cost.py [--repeats 200]

1. **Inline bound.** The costliest bodies `render.is_cheap` still lets render on the event loop:
   the most JSON objects (input items), the longest run without whitespace, the most bytes, and
   all at once — each rendered with `prepare_request` and no prefix cache (a miss: the worst).
   The bound holds when the max stays around a millisecond or two.
2. **Round trip.** The same bodies just past the bound, and a typical agent request (3 tools,
   20 items), through a `RenderPool` of one worker (`await pool.prepare`) and inline
   (`prepare_request` with a warm prefix cache, as the worker has): the difference is what a
   worker adds to the time to `response.created` (orjson out, a pipe each way, the reply decoded).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.prepare import INSTRUCTIONS, TOOLS, history
from proxy import vocab
from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.request.prepare import prepare_request
from proxy.server.rendering.pool import RenderPool
from proxy.server.rendering.renderer import (
    INLINE_MAX_BYTES,
    INLINE_MAX_OBJECTS,
    INLINE_MAX_RUN,
    is_cheap,
    longest_run,
)

MODEL = harness.MODEL


def _largest(make: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """`make(n)` for the largest n whose body `is_cheap` still lets render inline."""
    n = 1
    while is_cheap(orjson.dumps(make(n * 2))):
        n *= 2
    step = n // 2
    while step:
        if is_cheap(orjson.dumps(make(n + step))):
            n += step
        step //= 2
    return make(n)


def bound_bodies() -> dict[str, dict[str, Any]]:
    """The costliest bodies still under every inline bound (each grown until the next byte
    would send it to a worker)."""
    items = INLINE_MAX_OBJECTS - 1  # the body itself is an object too

    def run(n: int) -> dict[str, Any]:
        return {"model": MODEL, "input": "a" * n}

    def words(n: int) -> dict[str, Any]:
        return {"model": MODEL, "input": "word " * n}

    def objects(n: int) -> dict[str, Any]:
        return {"model": MODEL, "input": [{"role": "user", "content": "a" * n}] * items}

    return {
        "longest run": _largest(run),
        "most bytes (words)": _largest(words),
        f"{items} items, one letter each": objects(1),
        f"{items} items, longest runs": _largest(objects),
    }


def past_bound(body: dict[str, Any]) -> dict[str, Any]:
    """The same body with one more item: a worker renders it."""
    extra = [{"role": "user", "content": "b"}] * (INLINE_MAX_OBJECTS + 1)
    first = (
        body["input"]
        if isinstance(body["input"], list)
        else [{"role": "user", "content": body["input"]}]
    )
    return {**body, "input": [*first, *extra]}


def timed(call: Callable[[], Any], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def ms(value: float) -> str:
    return f"{value * 1000:.3f}"


async def run(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    print(harness.machine())
    print(
        f"inline bound: ≤ {INLINE_MAX_BYTES} bytes, ≤ {INLINE_MAX_OBJECTS} objects, "
        f"runs ≤ {INLINE_MAX_RUN} bytes; {args.repeats} renders each"
    )
    rows = []
    bodies = bound_bodies()
    for name, body in bodies.items():
        payload = orjson.dumps(body)
        assert is_cheap(payload), name
        samples = timed(lambda b=body: prepare_request(b, encoding), args.repeats)
        rows.append(
            [
                name,
                len(payload),
                payload.count(b"{"),
                longest_run(payload),
                ms(statistics.median(samples)),
                ms(harness.pct(samples, 0.99)),
                ms(max(samples)),
            ]
        )
    headers = ["inline, no prefix cache", "bytes", "objects", "run", "p50 ms", "p99 ms", "max ms"]
    print(harness.table(headers, rows))

    agent = {"model": MODEL, "instructions": INSTRUCTIONS, "tools": TOOLS, "input": history(20)}
    targets = {
        f"{name}, +{INLINE_MAX_OBJECTS + 1} items": past_bound(b) for name, b in bodies.items()
    }
    targets["agent: 3 tools, 20 items"] = agent
    pool = RenderPool(encoding, vocab.loaded_dir(os.environ), workers=1, timeout=30, queue=8)
    await pool.start()
    await pool.wait_ready()
    warm = PrefixCache(encoding)
    rows = []
    try:
        for name, body in targets.items():
            assert not is_cheap(orjson.dumps(body)), name
            inline: list[float] = []
            pooled: list[float] = []
            await pool.prepare(body)  # the worker's prefix cache is warm, as `warm` is
            prepare_request(body, encoding, prefixes=warm)
            for _ in range(args.repeats):  # alternate, so drift hits both alike
                started = time.perf_counter()
                prepare_request(body, encoding, prefixes=warm)
                inline.append(time.perf_counter() - started)
                started = time.perf_counter()
                await pool.prepare(body)
                pooled.append(time.perf_counter() - started)
            added = statistics.median(pooled) - statistics.median(inline)
            rows.append(
                [
                    name,
                    ms(statistics.median(inline)),
                    ms(statistics.median(pooled)),
                    ms(harness.pct(pooled, 0.99)),
                    ms(added),
                ]
            )
    finally:
        await pool.aclose()
    headers = ["past the bound", "inline p50 ms", "worker p50 ms", "worker p99 ms", "added ms"]
    print(harness.table(headers, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
