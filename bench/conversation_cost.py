"""Benchmark 9, what a conversation costs: the latency and CPU of an append
(`POST /v1/conversations/{id}/items`) on the embedded SQLite store and on Redis, at one item and
at twenty, in a fresh conversation and in a long one; the bytes an item takes; and what
`conversation` costs a request over sending the same items in `input`.

    .venv/bin/python bench/conversation_cost.py [--repeats 40] [--length 2000] [--appends 400]
                                                [--concurrency 8] [--history 200]

One proxy process per store (`python -m proxy serve --store-url …`) on core 0, fresh for the
run; the simulator, the load generator and redis-server on core 1. `memory://` (a test-only
store: a dict in the proxy) is the reference: what the proxy itself spends on an append, with no
store I/O. Latency requests go one at a time, round-robin over the stores (drift hits all
alike); each is a new connection, so the figures include the loopback connect (~0.1 ms).

- append p50 / p90: request written → answer read, `items` of N text items (~200 bytes each),
  in a conversation of 0 or `--length` items (an append is one `Push`: it should not depend on
  the length).
- CPU ms / append: the proxy's user+system CPU (from /proc) over `--appends` one-item appends
  sent `--concurrency` at a time, per append; appends/s is that run's rate.
- stored bytes / item: what `store_max_bytes` counts per item appended; disk / memory: the
  SQLite file and WAL, or Redis `used_memory`, grown per item.
- conversation vs input: `POST /v1/responses/input_tokens` (the render, no upstream) with
  `conversation` naming `--history` items, against the same items sent in `input`, back to
  back; the difference is the median of the pairs' differences.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.store_cost import start_redis, stored_size
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator

STORES = ("memory", "embedded", "redis")
TEXT = "The parcel left the warehouse on Tuesday and should arrive by Friday. " * 3


@dataclass
class Samples:
    latency: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    cpu_ms: float = float("nan")
    rate: float = float("nan")
    logical: float = float("nan")
    physical: float = float("nan")
    by_conversation: list[float] = field(default_factory=list)
    by_input: list[float] = field(default_factory=list)
    #: conversation − input, request by request (the pairs ran back to back: drift cancels)
    paired: list[float] = field(default_factory=list)
    errors: int = 0


def items(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"role": "user" if n % 2 else "assistant", "content": f"{n}: {TEXT}"}
        for n in range(start, start + count)
    ]


async def call(port: int, path: str, body: Any, out: Samples) -> tuple[float, Any]:
    """One POST; (seconds to its answer, the parsed answer). A non-200 counts as an error."""
    answer = await harness.stream(port, harness.request_bytes(path, orjson.dumps(body)))
    if answer.status != 200 or answer.error or not answer.reads:
        out.errors += 1
        return float("nan"), None
    return answer.reads[-1][0] - answer.sent_at, orjson.loads(answer.body)


async def conversation(port: int, length: int, out: Samples) -> str:
    """A new conversation of `length` items (appended 20 at a time)."""
    _, made = await call(port, "/v1/conversations", {}, out)
    key = str(made["id"])
    for start in range(0, length, 20):
        body = {"items": items(min(20, length - start), start)}
        await call(port, f"/v1/conversations/{key}/items", body, out)
    return key


async def cpu_run(proxy: harness.Process, key: str, args: argparse.Namespace, out: Samples) -> None:
    semaphore = asyncio.Semaphore(args.concurrency)
    path = f"/v1/conversations/{key}/items"

    async def append() -> None:
        async with semaphore:
            await call(proxy.port, path, {"items": items(1)}, out)

    loop = asyncio.get_running_loop()
    cpu0, started = proxy.cpu_seconds(), loop.time()
    await asyncio.gather(*(append() for _ in range(args.appends)))
    elapsed = loop.time() - started
    out.cpu_ms = (proxy.cpu_seconds() - cpu0) / args.appends * 1000
    out.rate = args.appends / elapsed


async def run(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    pinned = harness.pin_self(harness.BENCH_CORE)
    harness.raise_fd_limit()
    config = SimulatorConfig(token_seconds=0.002, first_token_seconds=0.02)
    sim = await start_simulator(config, encoding, app=create_simulator_app(config, encoding))
    redis_port = harness.free_port()
    redis_server = start_redis(redis_port)
    folder = Path(tempfile.mkdtemp(prefix="conversation-bench-"))
    proxies = {
        "memory": await harness.start_proxy(sim.url, store_url="memory://"),
        "embedded": await harness.start_proxy(sim.url, data_dir=str(folder)),
        "redis": await harness.start_proxy(sim.url, store_url=f"redis://127.0.0.1:{redis_port}/0"),
    }
    samples = {store: Samples() for store in STORES}
    cases = [(count, length) for length in (0, args.length) for count in args.counts]
    try:
        keys: dict[tuple[str, int], str] = {}
        for store in STORES:  # warm up, and the conversations of each length
            for length in (0, args.length):
                keys[store, length] = await conversation(
                    proxies[store].port, length, samples[store]
                )
            for _ in range(3):
                await conversation(proxies[store].port, 20, samples[store])
        for repeat in range(args.repeats):
            shift = repeat % len(STORES)
            turn = repeat % len(cases)  # no case always first after a switch of store
            for store in STORES[shift:] + STORES[:shift]:
                for count, length in cases[turn:] + cases[:turn]:
                    path = f"/v1/conversations/{keys[store, length]}/items"
                    seconds, _ = await call(
                        proxies[store].port, path, {"items": items(count)}, samples[store]
                    )
                    samples[store].latency.setdefault((count, length), []).append(seconds)
        for store in STORES:
            await measure_cost(store, proxies[store], folder, redis_port, args, samples[store])
        await compare_with_input(proxies, args, samples)
    finally:
        for proxy in proxies.values():
            proxy.stop()
        redis_server.terminate()
        redis_server.wait(timeout=10)
        await sim.stop()
        shutil.rmtree(folder, ignore_errors=True)
    report(samples, cases, args, pinned)


async def measure_cost(
    store: str,
    proxy: harness.Process,
    folder: Path,
    redis_port: int,
    args: argparse.Namespace,
    out: Samples,
) -> None:
    key = await conversation(proxy.port, 0, out)
    await asyncio.sleep(0.3)
    before = stored_size(store, folder, redis_port) if store != "memory" else (0, 0, 0)
    await cpu_run(proxy, key, args, out)
    if store != "memory":
        await asyncio.sleep(0.3)
        _, logical, physical = stored_size(store, folder, redis_port)
        out.logical = (logical - before[1]) / args.appends
        out.physical = (physical - before[2]) / args.appends


async def compare_with_input(
    proxies: dict[str, harness.Process], args: argparse.Namespace, samples: dict[str, Samples]
) -> None:
    """input_tokens with `conversation` vs the same items in `input` (module docstring)."""
    keys = {
        store: await conversation(p.port, args.history, samples[store])
        for store, p in proxies.items()
    }
    history: dict[str, list[Any]] = {}
    for store, proxy in proxies.items():
        path = f"/v1/conversations/{keys[store]}/items?order=asc&limit=100"
        listed: list[Any] = []
        after = ""
        while True:
            answer = await harness.stream(proxy.port, _get(path + after))
            page = orjson.loads(answer.body)
            listed += page["data"]
            if not page["has_more"]:
                break
            after = f"&after={page['last_id']}"
        history[store] = listed
    for repeat in range(args.repeats):
        shift = repeat % len(STORES)
        for store in STORES[shift:] + STORES[:shift]:
            port, out = proxies[store].port, samples[store]
            by_conv = {"model": harness.MODEL, "input": "And?", "conversation": keys[store]}
            conversation_seconds, _ = await call(port, "/v1/responses/input_tokens", by_conv, out)
            out.by_conversation.append(conversation_seconds)
            by_input = {
                "model": harness.MODEL,
                "input": [*history[store], {"role": "user", "content": "And?"}],
            }
            seconds, _ = await call(port, "/v1/responses/input_tokens", by_input, out)
            out.by_input.append(seconds)
            out.paired.append(conversation_seconds - seconds)


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n".encode()


def report(
    samples: dict[str, Samples],
    cases: list[tuple[int, int]],
    args: argparse.Namespace,
    pinned: bool,
) -> None:
    print(f"# bench/conversation_cost.py — {harness.machine()}")
    print(
        "# proxy on core 0; simulator + generator + redis-server on core 1"
        f"{'' if pinned else ' (not pinned)'}; items of ~{len(TEXT) + 5} characters"
    )
    print()
    print(f"## append latency, ms ({args.repeats} sequential appends per row)")
    rows = []
    for store in STORES:
        for count, length in cases:
            values = samples[store].latency.get((count, length), [])
            rows.append(
                [
                    f"{store} {count} item{'s' if count > 1 else ''} @ {length}",
                    f"{harness.median(values) * 1000:.2f}",
                    f"{harness.pct(values, 0.9) * 1000:.2f}",
                ]
            )
    print(harness.table(["store, items @ conversation length", "p50", "p90"], rows))
    print()
    print(
        f"## append cost ({args.appends} one-item appends, {args.concurrency} at a time) and "
        "size per item"
    )
    rows = []
    for store in STORES:
        s = samples[store]
        rows.append(
            [
                store,
                f"{s.cpu_ms:.2f}",
                f"{s.rate:.0f}",
                "-" if store == "memory" else f"{s.logical:.0f}",
                "-" if store == "memory" else f"{s.physical:.0f}",
                s.errors,
            ]
        )
    headers = [
        "store",
        "CPU ms / append",
        "appends/s",
        "stored B / item",
        "disk or memory B / item",
        "errors",
    ]
    print(harness.table(headers, rows))
    print()
    print(
        f"## a request with `conversation` ({args.history} items) vs the same items in `input`: "
        "input_tokens p50 ms"
    )
    rows = []
    for store in STORES:
        s = samples[store]
        conv, given = harness.median(s.by_conversation), harness.median(s.by_input)
        rows.append(
            [
                f"{store}, {args.history} items",
                f"{conv * 1000:.2f}",
                f"{given * 1000:.2f}",
                f"{harness.median(s.paired) * 1000:+.2f}",
            ]
        )
    print(harness.table(["store, history", "conversation", "input", "paired difference"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--length", type=int, default=2000)
    parser.add_argument("--appends", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--history", type=int, default=200)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
