"""Slow clients cannot lock real ones out (issue 12, item 2): many connections sending a head a
byte at a time, in-process (below the connection cap: real clients are served throughout) and
against a real `python -m proxy serve` process (over its cap: refusals are immediate 503s, and
the slow connections are gone after `header_timeout`). The process run also checks oversized
heads and pipelining end to end. `PROXY_RELIABILITY_SCALE=full` runs 300 slow connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from openai_harmony import HarmonyEncoding

from tests.rawhttp import Read, exchange, parse, port_of, read_async, request
from tests.reliability import (
    FAST_SIM,
    MODEL,
    body,
    log_problems,
    raise_fd_limit,
    running_proxy,
    scaled,
    sse_events,
    start_proxy_process,
)
from tests.simulator_helpers import SimThread

SLOW = scaled(60, 300)
#: Seconds between two bytes of a slow head: alive, never done.
DRIP = 0.2


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST_SIM) as running:
        yield running


async def slow_client(port: int, opened: asyncio.Event, stop: float) -> tuple[Read, float]:
    """Open a connection and drip a head that never ends, while reading; return what came back
    and after how long the server closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened.set()
    started = time.monotonic()

    async def drip() -> None:
        with contextlib.suppress(ConnectionError):
            for byte in b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 10_000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(DRIP)

    dripping = asyncio.create_task(drip())
    try:
        read = await read_async(reader, stop - time.monotonic())
    finally:
        dripping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripping
        writer.close()
    return read, time.monotonic() - started


Attack = list[asyncio.Task[tuple[Read, float]]]


def under_attack(port: int, during: Callable[[Attack], Awaitable[None]]) -> None:
    """Open `SLOW` dripping connections, run `during` with them, close what is left."""

    async def scenario() -> None:
        slow = await attack(port, SLOW, 30)
        try:
            await during(slow)
        finally:
            for task in slow:
                task.cancel()

    asyncio.run(scenario())


async def attack(port: int, count: int, seconds: float) -> Attack:
    stop = time.monotonic() + seconds
    tasks = []
    for _ in range(count):
        opened = asyncio.Event()
        tasks.append(asyncio.create_task(slow_client(port, opened, stop)))
        await opened.wait()
    return tasks


def test_slow_heads_do_not_lock_out_a_real_client(
    sim: SimThread, encoding: HarmonyEncoding
) -> None:
    raise_fd_limit()
    assert sim.server is not None
    with running_proxy(sim.server.url, encoding, header_timeout=3.0) as proxy:
        port = port_of(proxy.url)

        async def served_during(slow: Attack) -> None:
            for _ in range(200):  # the server accepts a moment after the client connected
                if proxy.metric("proxy_client_connections") >= SLOW:
                    break
                await asyncio.sleep(0.01)
            assert proxy.metric("proxy_client_connections") >= SLOW
            async with httpx.AsyncClient(base_url=proxy.url, timeout=10) as client:
                for _ in range(5):
                    assert (await client.get("/healthz")).status_code == 200
                answer = await client.post("/v1/responses", json=body())
                assert answer.status_code == 200
                assert sse_events(answer.content)[-1]["type"] == "response.completed"
            # ...all while every slow connection was still open.
            assert not any(task.done() for task in slow)
            for read, seconds in await asyncio.gather(*slow):
                (answer,) = parse(read.data, ["GET"])
                assert answer.status == 408, answer
                assert answer.json()["error"]["code"] == "request_timeout"
                assert read.closed
                assert seconds < 3.0 + 3.0

        under_attack(port, served_during)
        assert proxy.metric("proxy_http_limits_total", kind="head_timeout") == SLOW
        assert not proxy.logs.problems()


def test_a_serve_process_under_slowloris(sim: SimThread, tmp_path: Path) -> None:
    """Over the cap: a real client gets an immediate 503 + Retry-After, never a hang, and is
    served once `header_timeout` has cleared the slow connections."""
    raise_fd_limit()
    assert sim.server is not None
    cap = SLOW // 2
    process = start_proxy_process(
        sim.server.url,
        tmp_path / "proxy.log",
        *("--header-timeout", "3", "--max-connections", str(cap)),
    )
    try:
        port = port_of(process.url)

        async def refused_then_served(slow: Attack) -> None:
            # Over the cap: refused at once with a reason and a time to retry.
            started = time.monotonic()
            refused = exchange(port, request("GET", "/healthz"), timeout=5)
            assert time.monotonic() - started < 1.0
            (answer,) = refused.answers
            assert answer.status == 503
            assert answer.headers["retry-after"] == "1"
            assert answer.json()["error"]["code"] == "too_many_connections"
            reads = await asyncio.gather(*slow)
            statuses = sorted(parse(read.data, ["GET"])[0].status for read, _ in reads)
            assert statuses == [408] * cap + [503] * (SLOW - cap)
            assert all(read.closed for read, _ in reads)
            async with httpx.AsyncClient(base_url=process.url, timeout=10) as client:
                assert (await client.get("/healthz")).status_code == 200
                answer = await client.post("/v1/responses", json=body())
                assert sse_events(answer.content)[-1]["type"] == "response.completed"

        under_attack(port, refused_then_served)

        # Oversized heads: 431, on the real process.
        big = request("GET", "/v1/models", headers=[("x-big", "a" * 70_000)])
        (too_big,) = exchange(port, big, timeout=5).answers
        assert too_big.status == 431
        many = request("GET", "/v1/models", headers=[(f"x-{n}", "v") for n in range(101)])
        (too_many,) = exchange(port, many, timeout=5).answers
        assert too_many.status == 431

        # Pipelining: a stream, /healthz, a pass-through, all answered in order.
        stream = request("POST", "/v1/responses", orjson.dumps(body()))
        data = stream + request("GET", "/healthz") + request("GET", "/v1/models")
        answers = exchange(port, data, ["POST", "GET", "GET"], timeout=3).answers
        assert [a.status for a in answers] == [200, 200, 200]
        assert answers[0].events()[-1]["type"] == "response.completed"
        assert answers[1].json() == {"status": "ok"}
        assert answers[2].json()["data"][0]["id"] == MODEL

        metrics = httpx.get(process.url + "/metrics", timeout=5).text
        assert f'proxy_http_limits_total{{kind="connection_refused"}} {SLOW - cap + 1}.0' in metrics
        assert 'proxy_http_limits_total{kind="head_too_large"} 1.0' in metrics
    finally:
        process.stop()
    assert not log_problems(process.log_text())
