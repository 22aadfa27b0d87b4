"""Benchmark 6, what the response store costs: per stored response, the latency to
`response.created` and to the terminal event, the proxy's CPU per 1,000 tokens, and the bytes a
stored response takes — with the store off, on the embedded SQLite store, and on Redis.

    .venv/bin/python bench/store_cost.py [--repeats 30] [--tokens 1000] [--concurrency 32]
                                         [--streams 96] [--rounds 3]

One proxy process per store (`python -m proxy serve --store-url …`) on core 0, fresh for the
run; the simulator (2 ms per token, `stream_interval` 20), the load generator and redis-server on
core 1. Latency requests go one at a time, round-robin over the stores (drift hits all alike);
the cost runs send `--streams` streams `--concurrency` at a time to each store in turn, for
`--rounds` rounds in rotated order; the table gives the median round (the machine is shared:
single runs drift by tens of percent).

- to created: request written → `response.created` read. The store is not on this path (the
  record is created by the writer task after the first events are sent).
- terminal after last frame: the simulator's last frame sent → the terminal event read. With a
  store, the terminal batch is committed before it is sent (read-your-writes): this is where
  the store's latency shows.
- CPU s / 1k tok: the proxy's user+system CPU (from /proc) per 1,000 generated tokens.
- stored bytes / response: what `store_max_bytes` counts (record + events log); on disk: the
  SQLite file and its WAL / responses; Redis: `used_memory` growth / responses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator

STORES = ("off", "embedded", "redis")


@dataclass
class Samples:
    created: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    errors: int = 0
    cpu: float = 0.0
    tokens: int = 0
    per_1k: list[float] = field(default_factory=list)
    responses: int = 0
    logical: float = 0.0
    physical: float = 0.0


def start_redis(port: int) -> subprocess.Popen[bytes]:
    """redis-server on core 1 (with the load generator), no persistence."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is missing: `make tools` (apt-get install redis-server)")
    core = harness.BENCH_CORE if harness.BENCH_CORE in harness.cores() else None
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=(lambda: os.sched_setaffinity(0, {core})) if core is not None else None,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return process
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.02)


def stored_size(store: str, folder: Path, redis_port: int) -> tuple[int, int, int]:
    """(responses, logical bytes, disk or memory bytes) the store holds now."""
    if store == "embedded":
        path = folder / "store.sqlite3"
        db = sqlite3.connect(path, isolation_level=None)
        try:
            (count,) = db.execute("SELECT count(*) FROM entries").fetchone()
            (logical,) = db.execute("SELECT value FROM totals WHERE name = 'bytes'").fetchone()
            # The WAL is folded into the file from time to time (1,000 pages); fold it now so
            # the file is what the responses take, not where the WAL happened to be.
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
        disk = sum(p.stat().st_size for p in folder.glob("store.sqlite3*"))
        return int(count), int(logical), disk
    client = redis.Redis(port=redis_port)
    count = int(client.zcard("rrp:created"))
    logical = int(client.get("rrp:bytes") or 0)
    used = int(client.info("memory")["used_memory"])
    return count, logical, used


async def cost_run(
    proxy: harness.Process, payload: bytes, streams: int, concurrency: int, out: Samples
) -> None:
    semaphore = asyncio.Semaphore(concurrency)

    async def client() -> None:
        async with semaphore:
            answer = await harness.stream(proxy.port, payload, keep_reads=False)
        terminal = answer.terminal() if answer.status == 200 else None
        if terminal is None or terminal["type"] != "response.completed":
            out.errors += 1
            return
        out.tokens += terminal["response"]["usage"]["output_tokens"]
        out.responses += 1

    cpu0, tokens0 = proxy.cpu_seconds(), out.tokens
    await asyncio.gather(*(client() for _ in range(streams)))
    cpu = proxy.cpu_seconds() - cpu0
    out.cpu += cpu
    if out.tokens > tokens0:
        out.per_1k.append(cpu / (out.tokens - tokens0) * 1000)


async def run(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    pinned = harness.pin_self(harness.BENCH_CORE)
    harness.raise_fd_limit()
    config = SimulatorConfig(
        token_seconds=0.002, first_token_seconds=0.02, stream_interval=20, record_limit=100_000
    )
    recorder = harness.SendRecorder(create_simulator_app(config, encoding))
    sim = await start_simulator(config, encoding, app=recorder)  # type: ignore[arg-type]
    redis_port = harness.free_port()
    redis_server = start_redis(redis_port)
    folder = Path(tempfile.mkdtemp(prefix="store-bench-"))
    proxies = {
        "off": await harness.start_proxy(sim.url, store_url="off"),
        "embedded": await harness.start_proxy(sim.url, data_dir=str(folder)),
        "redis": await harness.start_proxy(sim.url, store_url=f"redis://127.0.0.1:{redis_port}/0"),
    }
    samples = {store: Samples() for store in STORES}
    body = orjson.dumps({"model": harness.MODEL, "input": "Where is my order?", "stream": True})
    short = {"x-sim-tokens": str(args.short_tokens)}
    baseline = dict.fromkeys(STORES, (0, 0, 0))
    try:
        for store in STORES:  # warm up: imports, connections, the store's tables
            for number in range(3):
                headers = {**short, "x-request-id": f"w-{store}-{number}"}
                payload = harness.request_bytes("/v1/responses", body, headers)
                await harness.stream(proxies[store].port, payload)
        for repeat in range(args.repeats):
            shift = repeat % len(STORES)
            for store in STORES[shift:] + STORES[:shift]:
                rid = f"l-{store}-{repeat}"
                payload = harness.request_bytes(
                    "/v1/responses", body, {**short, "x-request-id": rid}
                )
                answer = await harness.stream(proxies[store].port, payload)
                _latency(answer, recorder.sends.get(rid, []), samples[store])
        await asyncio.sleep(0.5)
        for store in ("embedded", "redis"):
            baseline[store] = stored_size(store, folder, redis_port)
        payload = harness.request_bytes("/v1/responses", body, {"x-sim-tokens": str(args.tokens)})
        for number in range(args.rounds):
            shift = number % len(STORES)
            for store in STORES[shift:] + STORES[:shift]:
                proxy = proxies[store]
                await cost_run(proxy, payload, args.streams, args.concurrency, samples[store])
        await asyncio.sleep(0.5)
        for store in ("embedded", "redis"):
            count, logical, physical = stored_size(store, folder, redis_port)
            added = count - baseline[store][0]
            if added > 0:
                samples[store].logical = (logical - baseline[store][1]) / added
                samples[store].physical = (physical - baseline[store][2]) / added
    finally:
        for proxy in proxies.values():
            proxy.stop()
        redis_server.terminate()
        redis_server.wait(timeout=10)
        await sim.stop()
        shutil.rmtree(folder, ignore_errors=True)
    report(samples, args, pinned)


def _latency(answer: harness.Answer, sends: list[tuple[float, bool]], out: Samples) -> None:
    created = next((t for t, data in answer.reads if b"response.created" in data), None)
    ended = next((t for t, data in answer.reads if b"response.completed" in data), None)
    if answer.status != 200 or answer.error or created is None or ended is None or not sends:
        out.errors += 1
        return
    out.created.append(created - answer.sent_at)
    out.end.append(ended - sends[-1][0])


def report(samples: dict[str, Samples], args: argparse.Namespace, pinned: bool) -> None:
    print(f"# bench/store_cost.py — {harness.machine()}")
    print(
        "# simulator: 2 ms/token, first token 20 ms, stream_interval 20; proxy on core 0, "
        f"simulator + generator + redis-server on core 1{'' if pinned else ' (not pinned)'}"
    )
    off = samples["off"]
    off_cpu = harness.median(off.per_1k)
    print()
    print(
        f"## latency, p50 ms ({args.repeats} sequential requests per store, "
        f"~{args.short_tokens} tokens)"
    )
    rows = []
    for store in STORES:
        s = samples[store]
        rows.append(
            [
                store,
                len(s.created),
                f"{harness.median(s.created) * 1000:.2f}",
                f"{harness.median(s.end) * 1000:.2f}",
                f"{(harness.median(s.end) - harness.median(off.end)) * 1000:+.2f}",
                s.errors,
            ]
        )
    headers = ["store", "requests", "to created", "terminal after last frame", "vs off", "errors"]
    print(harness.table(headers, rows))
    print()
    print(
        f"## cost ({args.rounds} rounds of {args.streams} streams, {args.concurrency} at a time, "
        f"~{args.tokens} tokens each; median round) and size per stored response"
    )
    rows = []
    for store in STORES:
        s = samples[store]
        cpu = harness.median(s.per_1k)
        size = "-" if store == "off" else f"{s.logical / 1024:.1f}"
        physical = "-" if store == "off" else f"{s.physical / 1024:.1f}"
        rows.append(
            [
                store,
                s.responses,
                s.tokens,
                f"{cpu:.3f}",
                f"{(cpu / off_cpu - 1) * 100:+.0f} %" if store != "off" else "-",
                size,
                physical,
                s.errors,
            ]
        )
    headers = [
        "store",
        "responses",
        "tokens",
        "CPU s / 1k tok",
        "vs off",
        "stored KB / resp",
        "disk or memory KB / resp",
        "errors",
    ]
    print(harness.table(headers, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--short-tokens", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--streams", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
