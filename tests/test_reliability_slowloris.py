"""Slow clients cannot lock real ones out: many connections sending a head a
byte at a time, in-process (below the connection cap: real clients are served throughout) and
against a real `python -m proxy serve` process (over its cap: each newcomer is served at once,
the oldest slow connection closed for it with a 503, and the rest are gone after
`header_timeout`). The process run also checks oversized heads and pipelining end to end. Bodies
trickling in at 1 byte/s are cut by the rate rule. `PROXY_RELIABILITY_SCALE=full` runs 300 slow
connections, and the trickling bodies at the default body_timeout.
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

from proxy.config.settings import Settings
from tests.rawhttp import Read, exchange, parse, port_of, read_async, request
from tests.reliability import (
    FAST_SIM,
    MODEL,
    SCALE,
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
    """Over the cap: a real client is served at once, the oldest slow connection (it has not
    sent a whole head) closed for it with a 503 + Retry-After; the slow ones left get their 408
    at `header_timeout`."""
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

        async def served_at_once(slow: Attack) -> None:
            # Over the cap: served at once; a slow connection made room.
            started = time.monotonic()
            served = exchange(port, request("GET", "/healthz"), timeout=5)
            assert time.monotonic() - started < 1.0
            (answer,) = served.answers
            assert answer.status == 200
            reads = await asyncio.gather(*slow)
            answers = [parse(read.data, ["GET"])[0] for read, _ in reads]
            # The oldest ones made room for the newer ones and for our client, then the rest
            # ran out of time.
            shed = SLOW - cap + 1
            assert [a.status for a in answers] == [503] * shed + [408] * (SLOW - shed)
            assert answers[0].headers["retry-after"] == "1"
            assert answers[0].json()["error"]["code"] == "too_many_connections"
            assert all(read.closed for read, _ in reads)
            async with httpx.AsyncClient(base_url=process.url, timeout=10) as client:
                assert (await client.get("/healthz")).status_code == 200
                answer = await client.post("/v1/responses", json=body())
                assert sse_events(answer.content)[-1]["type"] == "response.completed"

        under_attack(port, served_at_once)

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
        assert f'proxy_http_limits_total{{kind="headless_shed"}} {SLOW - cap + 1}.0' in metrics
        assert 'proxy_http_limits_total{kind="connection_refused"} 0.0' in metrics
        assert 'proxy_http_limits_total{kind="head_too_large"} 1.0' in metrics
    finally:
        process.stop()
    assert not log_problems(process.log_text())


# -- bodies trickling in -------------------------------------------------------------------------

#: body_timeout of the trickle test: the default (30 s) in the full form, 3 s in the short one;
#: body_min_rate is its default (1024 B/s) in both.
TRICKLE_TIMEOUT = 30.0 if SCALE == "full" else 3.0
#: How late after body_timeout + bytes / body_min_rate a trickling body may be cut.
TRICKLE_SLACK = 1.0


async def trickle_client(port: int, path: str, stop: float) -> tuple[Read, float]:
    """Send a whole head promising 100 kB, then a body byte per second while reading; return
    what came back and how long after the head the proxy closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = orjson.dumps(body("t" * 100_000))
    writer.write(request("POST", path, payload)[: -len(payload)])
    started = time.monotonic()

    async def drip() -> None:
        with contextlib.suppress(ConnectionError):
            for byte in payload:
                await asyncio.sleep(1.0)
                writer.write(bytes([byte]))
                await writer.drain()

    dripping = asyncio.create_task(drip())
    try:
        read = await read_async(reader, stop - time.monotonic())
    finally:
        dripping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripping
        writer.close()
    return read, time.monotonic() - started


def test_trickling_bodies_are_cut_by_the_rate_rule(
    sim: SimThread, encoding: HarmonyEncoding
) -> None:
    """`SLOW` connections, all established, each trickling a body at 1 byte/s: after
    body_timeout the body must average body_min_rate, so each is cut at body_timeout +
    (bytes received) / body_min_rate with a 408 — on the repaired route and in pass-through —
    while a real client is served."""
    raise_fd_limit()
    assert sim.server is not None
    assert Settings().body_min_rate == 1024
    overrides = {} if SCALE == "full" else {"body_timeout": TRICKLE_TIMEOUT}
    with running_proxy(sim.server.url, encoding, **overrides) as proxy:
        port = port_of(proxy.url)

        async def scenario() -> list[tuple[Read, float]]:
            stop = time.monotonic() + TRICKLE_TIMEOUT + 20
            paths = ["/v1/responses", "/v1/completions"]
            tasks = [
                asyncio.create_task(trickle_client(port, paths[number % 2], stop))
                for number in range(SLOW)
            ]
            for _ in range(500):
                if proxy.metric("proxy_client_connections") >= SLOW:
                    break
                await asyncio.sleep(0.01)
            assert proxy.metric("proxy_client_connections") >= SLOW
            async with httpx.AsyncClient(base_url=proxy.url, timeout=10) as client:
                answer = await client.post("/v1/responses", json=body())
                assert sse_events(answer.content)[-1]["type"] == "response.completed"
            return await asyncio.gather(*tasks)

        reads = asyncio.run(scenario())
        late = []
        for read, seconds in reads:
            (answer,) = parse(read.data, ["POST"])
            assert answer.status == 408, answer
            assert "slower than 1024 bytes/s" in answer.json()["error"]["message"]
            assert read.closed
            if not TRICKLE_TIMEOUT <= seconds < TRICKLE_TIMEOUT + TRICKLE_SLACK:
                late.append(round(seconds, 2))
        assert not late, f"cut outside [{TRICKLE_TIMEOUT}, +{TRICKLE_SLACK}) s: {late}"
        assert proxy.metric("proxy_http_limits_total", kind="body_timeout") == SLOW
        assert not proxy.logs.problems()
