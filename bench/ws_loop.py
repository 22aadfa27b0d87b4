"""What WebSocket mode saves an agent loop: the same tool loop of `--turns` turns, over one
WebSocket with `previous_response_id` and `store: false` (each turn sends only its new items),
and over HTTP with the whole history in `input` each turn (what a `store: false` client without
WebSocket mode must send).

    .venv/bin/python bench/ws_loop.py [--turns 20] [--repeats 5] [--tokens 40]

One proxy process (`python -m proxy serve --store-url off`) on core 0; the simulator and this
client on core 1. Each repeat runs the loop once per mode, the modes alternating (drift hits
both alike). A turn is a user message or, after a function call, its output; the simulator's
scripted model calls the `get_weather` tool when it has one and no tool output yet.

- client bytes: the JSON the client sent over the loop (WebSocket message payloads; HTTP request
  bodies), the median over the repeats; the HTTP heads (~150 bytes per request) and WebSocket
  framing (6-14 bytes per message) are left out of both.
- proxy CPU ms: the proxy process's user+system CPU (from /proc, 10 ms ticks) over the loop.
- turn p50 / p90 ms: request sent → terminal event read, over every turn of every repeat.
- added ms / turn: the WebSocket turn's p50 minus the HTTP turn's p50 (negative: faster).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.tool_loop import TOOLS
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator
from proxy.sse import SSEDecoder

MODEL = "gpt-oss-120b"
TERMINAL = ("response.completed", "response.failed", "response.incomplete")


def next_input(turn: int, last: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The new items of a turn: the outputs of the last response's calls, else a question."""
    calls = [i for i in (last or {}).get("output", []) if i.get("type") == "function_call"]
    if calls:
        return [
            {"type": "function_call_output", "call_id": c["call_id"], "output": "sunny, 21 C"}
            for c in calls
        ]
    return [{"role": "user", "content": f"Question {turn}: what is the weather in city {turn}?"}]


class Loop:
    """One run of the loop: bytes sent, turn times, errors."""

    def __init__(self) -> None:
        self.sent = 0
        self.turns: list[float] = []
        self.errors = 0


async def websocket_loop(url: str, turns: int, tokens: int) -> Loop:
    loop = Loop()
    headers = {"X-Sim-Tokens": str(tokens)}
    address = url.replace("http://", "ws://") + "/v1/responses"
    async with connect(address, additional_headers=headers) as ws:
        last: dict[str, Any] | None = None
        for turn in range(turns):
            body: dict[str, Any] = {
                "type": "response.create",
                "model": MODEL,
                "input": next_input(turn, last),
                "tools": TOOLS,
                "store": False,
            }
            if last is not None:
                body["previous_response_id"] = last["id"]
            message = orjson.dumps(body)
            started = time.perf_counter()
            await ws.send(message.decode())
            loop.sent += len(message)
            while True:
                event = orjson.loads(await ws.recv())
                if event["type"] == "error":
                    loop.errors += 1
                    return loop
                if event["type"] in TERMINAL:
                    break
            loop.turns.append(time.perf_counter() - started)
            last = event["response"]
            if event["type"] != "response.completed":
                loop.errors += 1
    return loop


async def http_loop(url: str, turns: int, tokens: int) -> Loop:
    loop = Loop()
    history: list[Any] = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        last: dict[str, Any] | None = None
        for turn in range(turns):
            history += next_input(turn, last)
            body = {"model": MODEL, "input": history, "tools": TOOLS, "store": False}
            body["stream"] = True
            payload = orjson.dumps(body)
            started = time.perf_counter()
            terminal: dict[str, Any] | None = None
            headers = {"content-type": "application/json", "X-Sim-Tokens": str(tokens)}
            async with http.stream("POST", "/v1/responses", content=payload, headers=headers) as r:
                decoder = SSEDecoder()
                async for chunk in r.aiter_bytes():
                    for message in decoder.feed(chunk):
                        event = orjson.loads(message.data)
                        if event["type"] in TERMINAL:
                            terminal = event
            loop.sent += len(payload)
            if terminal is None or terminal["type"] != "response.completed":
                loop.errors += 1
                return loop
            loop.turns.append(time.perf_counter() - started)
            last = terminal["response"]
            history += last["output"]  # sent back as input, ids kept, as clients do
    return loop


async def run(args: argparse.Namespace) -> None:
    harness.pin_self(harness.cores()[-1])
    encoding = harness.encoding()
    config = SimulatorConfig(token_seconds=0.0, first_token_seconds=0.0)
    sim = await start_simulator(config, encoding, app=create_simulator_app(config, encoding))
    proxy = await harness.start_proxy(sim.url, store_url="off")
    results: dict[str, list[Loop]] = {"websocket": [], "http": []}
    cpu: dict[str, list[float]] = {"websocket": [], "http": []}
    try:
        for body in (websocket_loop, http_loop):  # warm-up: caches, connections, not counted
            await body(proxy.url, 2, args.tokens)
        for _ in range(args.repeats):
            for mode, body in (("websocket", websocket_loop), ("http", http_loop)):
                before = proxy.cpu_seconds()
                results[mode].append(await body(proxy.url, args.turns, args.tokens))
                cpu[mode].append((proxy.cpu_seconds() - before) * 1000)
    finally:
        proxy.stop()
        await sim.stop()
    rows = []
    p50: dict[str, float] = {}
    sent: dict[str, float] = {}
    cpu_ms: dict[str, float] = {}
    for mode, loops in results.items():
        times = [t * 1000 for loop in loops for t in loop.turns]
        p50[mode] = harness.median(times)
        sent[mode] = harness.median([loop.sent for loop in loops])
        cpu_ms[mode] = harness.median(cpu[mode])
        rows.append(
            [
                mode,
                args.turns,
                f"{sent[mode]:,.0f}",
                f"{cpu_ms[mode]:.0f}",
                f"{p50[mode]:.2f}",
                f"{harness.pct(times, 0.9):.2f}",
                sum(loop.errors for loop in loops),
            ]
        )
    print(harness.machine())
    print(f"{args.turns}-turn tool loop, {args.repeats} repeats, ~{args.tokens} tokens a turn\n")
    headers = ["mode", "turns", "client bytes", "proxy CPU ms", "turn p50 ms", "turn p90 ms"]
    print(harness.table([*headers, "errors"], rows))
    ratio = sent["http"] / sent["websocket"] if sent["websocket"] else float("nan")
    cpu_ratio = cpu_ms["websocket"] / cpu_ms["http"] if cpu_ms["http"] else float("nan")
    print(f"\nclient bytes, http / websocket: {ratio:.1f}x")
    print(f"proxy CPU, websocket / http: {cpu_ratio:.2f}")
    print(f"added ms / turn, websocket - http (p50): {p50['websocket'] - p50['http']:+.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=40, help="X-Sim-Tokens of each turn")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
