"""What compaction costs and saves: a `store: false` tool loop that resends its whole history
each turn, as stateless agents do, without compaction and with `context_management`'s
`compact_threshold`, side by side; and the core's share (seal + open, the render).

    .venv/bin/python bench/compaction_cost.py [--turns 20] [--threshold 1000] [--repeats 200]

One proxy process (`python -m proxy serve`, `memory://` store) on core 0; the simulator (its
scripted model writes the checkpoint summaries) and the client on core 1. Each turn is two
requests: the user's question (the model calls the tool), then the tool's output (the model
answers); the loop keeps every output item, compaction items included, in its history.

- prompt tokens: `usage.input_tokens` of each request, the first turn's, the median and the
  last; bytes sent: the request body of the last turn (the loop drops the items before its
  latest compaction item, which the proxy drops anyway).
- latency, ms: request written → JSON answer read, for requests that compacted (the pass and
  the answer) and for those that did not, p50.
- core: µs per compaction item sealed and opened (AES-256-GCM) and per reasoning blob, and the
  render of the last turn's body (`prepare_request`), full history against compacted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.tool_loop import TOOLS
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request import compaction
from proxy.harmony.request.prepare import prepare_request
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator

MODEL = "openai/gpt-oss-120b"
KEY = "k1:" + "MTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTE="  # 32 bytes of '1'
OUTPUT = "Sunny, 21 °C, light wind from the west; humidity 40 %. " * 6


async def loop(
    client: httpx.AsyncClient, turns: int, threshold: int | None
) -> tuple[list[int], int, list[float], list[float], list[Any]]:
    """One tool loop: prompt tokens per request, last body bytes, latencies (compacting,
    plain), and the last turn's body items."""
    history: list[Any] = []
    tokens: list[int] = []
    compacting: list[float] = []
    plain: list[float] = []
    size = 0
    for turn in range(turns):
        history.append({"role": "user", "content": f"Weather in city {turn}?"})
        for _ in range(2):
            body: dict[str, Any] = {
                "model": MODEL,
                "input": history,
                "tools": TOOLS,
                "store": False,
            }
            if threshold is not None:
                body["context_management"] = [
                    {"type": "compaction", "compact_threshold": threshold}
                ]
            started = time.perf_counter()
            answer = await client.post("/v1/responses", json=body)
            seconds = time.perf_counter() - started
            size = len(answer.request.content)
            response = answer.json()
            assert answer.status_code == 200, response
            tokens.append(int(response["usage"]["input_tokens"]))
            output = response["output"]
            compacted = any(item["type"] == "compaction" for item in output)
            (compacting if compacted else plain).append(seconds * 1000)
            history += [_as_input(item) for item in output]
            # What the items before the latest compaction item are worth to the proxy: nothing
            # (dropped at render), so the loop drops them too.
            history = history[max(compaction.latest(history), 0) :]
            call = next((item for item in output if item["type"] == "function_call"), None)
            if call is None:
                break
            history.append(
                {"type": "function_call_output", "call_id": call["call_id"], "output": OUTPUT}
            )
    return tokens, size, compacting, plain, history


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] == "compaction":
        return {key: item[key] for key in ("type", "id", "encrypted_content")}
    return {key: value for key, value in item.items() if value is not None}


def core(everything: list[Any], history: list[Any], repeats: int) -> dict[str, float]:
    """The core's share; `everything`: the uncompacted loop's last body items, `history`: the
    compacting loop's."""
    keys = ReasoningKeys((("k1", b"1" * 32),))
    encoding = harness.encoding()
    summary = "Checkpoint summary. " * 40
    users = [[f"Weather in city {n}?"] for n in range(20)]
    compaction.open_sealed(keys, compaction.seal(keys, summary, users), "x")  # warm
    keys.open(keys.seal([summary]))
    started = time.perf_counter()
    for _ in range(repeats):
        compaction.open_sealed(keys, compaction.seal(keys, summary, users), "x")
    sealed_us = (time.perf_counter() - started) / repeats * 1e6
    started = time.perf_counter()
    for _ in range(repeats):
        keys.open(keys.seal([summary]))
    reasoning_us = (time.perf_counter() - started) / repeats * 1e6
    full = {"model": MODEL, "input": [i for i in everything if i.get("type") != "compaction"]}
    compacted = {"model": MODEL, "input": history}
    timings = {}
    for name, body in (("full", full), ("compacted", compacted)):
        prepare_request(body, encoding, reasoning_keys=keys)  # warm
        started = time.perf_counter()
        for _ in range(max(1, repeats // 20)):
            prepare_request(body, encoding, reasoning_keys=keys)
        timings[name] = (time.perf_counter() - started) / max(1, repeats // 20) * 1000
    return {"seal+open": sealed_us, "reasoning": reasoning_us, **timings}


async def run(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    pinned = harness.pin_self(harness.BENCH_CORE)
    config = SimulatorConfig(token_seconds=0.0005, first_token_seconds=0.005)
    sim = await start_simulator(config, encoding, app=create_simulator_app(config, encoding))
    proxy = await harness.start_proxy(sim.url, store_url="memory://", reasoning_keys=KEY)
    results = {}
    try:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=60) as client:
            await loop(client, 2, None)  # warm up
            for name, threshold in (("no compaction", None), ("threshold", args.threshold)):
                results[name] = await loop(client, args.turns, threshold)
    finally:
        proxy.stop()
        await sim.stop()
    figures = core(results["no compaction"][4], results["threshold"][4], args.repeats)
    print(f"# bench/compaction_cost.py — {harness.machine()}")
    print(f"# {args.turns} turns of a store: false tool loop; pinned: {pinned}")
    print()
    print("## prompt tokens per request, bytes of the last request, latency p50 ms")
    rows = []
    for name, (tokens, size, compacting, plain, _) in results.items():
        rows.append(
            [
                name,
                tokens[0],
                round(harness.median(tokens)),
                tokens[-1],
                size,
                len(compacting),
                f"{harness.median(compacting):.1f}",
                f"{harness.median(plain):.1f}",
            ]
        )
    headers = ["loop", "first", "median", "last", "last body B", "compactions"]
    print(harness.table([*headers, "compacting p50", "plain p50"], rows))
    print()
    print("## the core: µs per blob sealed and opened; ms per render of the last turn's body")
    print(
        harness.table(
            ["compaction seal+open µs", "reasoning seal+open µs", "render full ms", "compacted ms"],
            [
                [
                    f"{figures['seal+open']:.1f}",
                    f"{figures['reasoning']:.1f}",
                    f"{figures['full']:.2f}",
                    f"{figures['compacted']:.2f}",
                ]
            ],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--threshold", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=200)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
