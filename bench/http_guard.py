"""Benchmark: what the HTTP guard (proxy/server/http/guard_protocol.py) costs, against
uvicorn's plain httptools protocol, side by side in one run.

    .venv/bin/python bench/http_guard.py [--rounds 7] [--requests 2000] [--frames 5000]
        [--baseline DIR]

Two server processes run the same tiny ASGI app on core 0, one at a time in use: under uvicorn's
`HttpToolsProtocol` ("plain") and under `GuardedProtocol` at the default limits ("guarded"), both
on uvloop. `--baseline DIR` adds a third, the guard of another checkout of the project (its own
bench/http_guard.py serves it: "guarded (base)"), for a before/after in one run. The load
generator (core 1) alternates them every round and measures:

- requests: keep-alive `GET` round trips on one connection (per request: the head's parsing,
  the guard's head timer and bookkeeping);
- stream: one SSE answer of `--frames` small frames, time per frame as the client reads them
  (the response direction, which the guard leaves to uvicorn: it must not move);
- upload: a 16 MiB body written in 64 KiB pieces (per received chunk: the body accounting).

Wall times are medians over the rounds; the server's CPU per request, frame and MiB comes
from /proc over all rounds (steadier than wall times on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from proxy.config.settings import Settings
from proxy.server.http.guard import Guard, Limits
from proxy.server.processes.runner import loop_factory

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("plain", "guarded")
BASE = "guarded (base)"
UPLOAD = 16 * 1024 * 1024
PIECE = 64 * 1024


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/stream":
        count = int(scope["query_string"] or b"1")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        frame = b"data: " + b"x" * 60 + b"\n\n"
        for _ in range(count):
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    payload = str(size).encode() if path == "/upload" else b"ok"
    headers = [(b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def serve(port: int, kind: str) -> None:
    protocol = Guard(Limits.of(Settings())).protocol() if kind == "guarded" else HttpToolsProtocol
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=protocol, lifespan="off", log_level="warning"
    )
    with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
        runner.run(uvicorn.Server(config).serve())


async def _head(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return -1


async def requests(port: int, count: int) -> float:
    """Median round trip of `count` keep-alive GETs, in µs."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        writer.write(b"GET /ping HTTP/1.1\r\nhost: x\r\n\r\n")
        await reader.readexactly(await _head(reader))
        times.append(time.perf_counter() - started)
    writer.close()
    return statistics.median(times) * 1e6


async def stream(port: int, frames: int) -> float:
    """µs per frame of one SSE answer, request written to last byte read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.perf_counter()
    writer.write(b"GET /stream?%d HTTP/1.1\r\nhost: x\r\n\r\n" % frames)
    await _head(reader)
    tail = b""
    while not tail.endswith(b"\r\n0\r\n\r\n"):
        tail = (tail + await reader.read(65536))[-16:]
    elapsed = time.perf_counter() - started
    writer.close()
    return elapsed / frames * 1e6


async def upload(port: int) -> float:
    """MB/s of one 16 MiB upload."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    piece = b"u" * PIECE
    started = time.perf_counter()
    writer.write(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % UPLOAD)
    for _ in range(UPLOAD // PIECE):
        writer.write(piece)
        await writer.drain()
    answer = await reader.readexactly(await _head(reader))
    elapsed = time.perf_counter() - started
    assert int(answer) == UPLOAD
    writer.close()
    return UPLOAD / elapsed / 1e6


async def run(args: argparse.Namespace) -> None:
    pinned = harness.pin_self(harness.BENCH_CORE)
    kinds = [*KINDS, BASE] if args.baseline else list(KINDS)
    servers = {}
    for kind in kinds:
        port = harness.free_port()
        root, served = (Path(args.baseline).resolve(), "guarded") if kind == BASE else (ROOT, kind)
        argv = [str(root / "bench" / "http_guard.py"), "--serve", str(port), "--kind", served]
        servers[kind] = await harness.start_process(
            kind, argv, port, core=harness.PROXY_CORE, ready_path="/ping", cwd=root
        )
    results: dict[str, dict[str, list[float]]] = {
        kind: {"requests": [], "stream": [], "upload": []} for kind in kinds
    }
    #: The server's own CPU seconds per phase, summed over the rounds (10 ms /proc ticks).
    cpu: dict[str, dict[str, float]] = {
        kind: {"requests": 0.0, "stream": 0.0, "upload": 0.0} for kind in kinds
    }
    try:
        for kind in kinds:  # warm up
            await requests(servers[kind].port, 50)
        for number in range(args.rounds):
            order = kinds if number % 2 == 0 else kinds[::-1]
            for kind in order:
                server = servers[kind]
                for phase, measure in (
                    ("requests", requests(server.port, args.requests)),
                    ("stream", stream(server.port, args.frames)),
                    ("upload", upload(server.port)),
                ):
                    before = server.cpu_seconds()
                    results[kind][phase].append(await measure)
                    cpu[kind][phase] += server.cpu_seconds() - before
    finally:
        for process in servers.values():
            process.stop()
    print(f"# bench/http_guard.py — {harness.machine()}")
    print(
        f"# {args.rounds} rounds; {args.requests} keep-alive GETs, {args.frames} SSE frames, "
        f"one 16 MiB upload per round and server"
    )
    rows = []
    for kind in kinds:
        measured, used = results[kind], cpu[kind]
        rows.append(
            [
                kind,
                f"{statistics.median(measured['requests']):.1f}",
                f"{used['requests'] / (args.requests * args.rounds) * 1e6:.1f}",
                f"{statistics.median(measured['stream']):.2f}",
                f"{used['stream'] / (args.frames * args.rounds) * 1e6:.2f}",
                f"{statistics.median(measured['upload']):.0f}",
                f"{used['upload'] / (UPLOAD / 2**20 * args.rounds) * 1e3:.2f}",
            ]
        )
    header = [
        "protocol",
        "GET round trip p50 µs",
        "server CPU µs/GET",
        "SSE µs/frame",
        "server CPU µs/frame",
        "upload MB/s",
        "server CPU ms/MiB",
    ]
    print(harness.table(header, rows))
    if not pinned:
        print("note: fewer than 2 cores: processes were not pinned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=5000)
    parser.add_argument("--baseline", help="a checkout of another revision, served as a third")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.kind)
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
