"""The cost of a hosted MCP tool round trip inside the proxy, against the same round trip done by
the client, side by side in one run.

    .venv/bin/python bench/mcp_roundtrip.py [--repeats 40] [--tokens 40]

A real MCP server (the official SDK's `MCPServer`, streamable HTTP, in a thread of this process)
with an `echo` tool; the simulator (0.5 ms per token) on this process's loop; two proxies
(`python -m proxy serve`, pinned to core 0), one reusing the server's tool list
(`mcp_list_cache_seconds` 300) and one listing it on every request (0). Requests go one at a time
(`stream: false`), round-robin over the cases (drift hits all alike):

- plain: no tools, one generation pass — the floor.
- client loop: a function tool `echo`; the model calls it, the client calls the MCP tool itself
  (the proxy's own MCP client code, from this process), then sends the result back in a second
  request — what a client does without hosted tools.
- hosted, list cached: the `mcp` tool; the proxy runs the call and the second pass in one
  response.
- hosted, list each time: the same, listing the server's tools first (one more MCP session).
- mcp call alone: one MCP session (connect, initialize, call) from this process: the part of a
  round trip that is the MCP server's and the SDK's.

Columns: wall ms p50 / p90, ratio of the p50 to plain, and the proxy's CPU ms per request (its
process's user+system time over the case's requests). Quote figures from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from mcp.server.mcpserver import MCPServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from proxy.mcp import Limits, call_tool
from proxy.simulator import SimulatorConfig, start_simulator

PARAMS = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
CASES = ("plain", "client loop", "hosted, list cached", "hosted, list each time")


def start_mcp_server() -> tuple[str, uvicorn.Server]:
    server = MCPServer(name="bench")

    @server.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        return f"echo: {text}"

    port = harness.free_port()
    config = uvicorn.Config(
        server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning"
    )
    running = uvicorn.Server(config)
    threading.Thread(target=lambda: asyncio.run(running.serve()), daemon=True).start()
    deadline = time.monotonic() + 15
    while not running.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the MCP server did not start")
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}/mcp", running


async def run(args: argparse.Namespace) -> None:
    for name in ("mcp", "httpx", "httpx2", "uvicorn"):  # the SDK's per-request info lines
        logging.getLogger(name).setLevel(logging.WARNING)
    encoding = harness.encoding()
    harness.pin_self(harness.BENCH_CORE)
    config = SimulatorConfig(token_seconds=0.0005, first_token_seconds=0.002, stream_interval=20)
    sim = await start_simulator(config, encoding)
    mcp_url, mcp_server = start_mcp_server()
    common = {
        "store_url": "off",
        "mcp_allowed_servers": "127.0.0.1",
        "mcp_allow_private_addresses": "true",
    }
    cached = await harness.start_proxy(sim.url, **common, mcp_list_cache_seconds="300")
    uncached = await harness.start_proxy(sim.url, **common, mcp_list_cache_seconds="0")
    limits = Limits(timeout=10.0, result_cap=65536)
    headers = {"x-sim-tokens": str(args.tokens)}
    mcp_tool = {
        "type": "mcp",
        "server_label": "bench",
        "server_url": mcp_url,
        "require_approval": "never",
    }
    function_tool = {"type": "function", "name": "echo", "parameters": PARAMS}
    wall: dict[str, list[float]] = {case: [] for case in (*CASES, "mcp call alone")}
    cpu: dict[str, float] = dict.fromkeys(CASES, 0.0)
    async with httpx.AsyncClient(timeout=60) as client:

        async def create(proxy: harness.Process, body: dict[str, Any]) -> dict[str, Any]:
            body = {"model": harness.MODEL, "store": False, **body}
            answer = await client.post(proxy.url + "/v1/responses", json=body, headers=headers)
            answer.raise_for_status()
            result: dict[str, Any] = answer.json()
            return result

        async def plain() -> None:
            await create(cached, {"input": "hello"})

        async def client_loop() -> None:
            first = await create(cached, {"input": "hello", "tools": [function_tool]})
            call = next(item for item in first["output"] if item["type"] == "function_call")
            outcome = await call_tool(mcp_url, None, "echo", {"text": "hello"}, limits)
            back = {"type": "function_call_output", "call_id": call["call_id"]}
            back["output"] = outcome.output or ""
            given = [{"role": "user", "content": "hello"}, call, back]
            final = await create(cached, {"input": given, "tools": [function_tool]})
            assert final["output"][-1]["type"] == "message"

        def hosted(proxy: harness.Process) -> Callable[[], Awaitable[None]]:
            async def one() -> None:
                done = await create(proxy, {"input": "hello", "tools": [mcp_tool]})
                calls = [item for item in done["output"] if item["type"] == "mcp_call"]
                assert calls, done["output"]
                assert calls[0]["output"] == "echo: hello", calls

            return one

        runs: dict[str, tuple[harness.Process, Callable[[], Awaitable[None]]]] = {
            "plain": (cached, plain),
            "client loop": (cached, client_loop),
            "hosted, list cached": (cached, hosted(cached)),
            "hosted, list each time": (uncached, hosted(uncached)),
        }
        for _, work in runs.values():  # warm up: imports, connections, the cached list
            for _ in range(3):
                await work()
        for repeat in range(args.repeats):
            shift = repeat % len(CASES)
            for case in CASES[shift:] + CASES[:shift]:
                proxy, work = runs[case]
                cpu0, start = proxy.cpu_seconds(), time.perf_counter()
                await work()
                wall[case].append((time.perf_counter() - start) * 1000)
                cpu[case] += proxy.cpu_seconds() - cpu0
            start = time.perf_counter()
            await call_tool(mcp_url, None, "echo", {"text": "hello"}, limits)
            wall["mcp call alone"].append((time.perf_counter() - start) * 1000)
    for proxy in (cached, uncached):
        proxy.stop()
    mcp_server.should_exit = True
    await sim.stop()
    floor = harness.median(wall["plain"])
    rows = []
    for case, values in wall.items():
        per_request = f"{cpu[case] / args.repeats * 1000:.1f}" if case in cpu else "-"
        p50 = harness.median(values)
        rows.append(
            [
                case,
                f"{p50:.1f}",
                f"{harness.pct(values, 90):.1f}",
                f"{p50 / floor:.2f}",
                per_request,
            ]
        )
    print(f"# bench/mcp_roundtrip.py — {harness.machine()}")
    print(f"# {args.repeats} requests per case, {args.tokens} tokens per generation pass")
    print()
    print(harness.table(["case", "p50 ms", "p90 ms", "p50 / plain", "proxy CPU ms / req"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=40)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
