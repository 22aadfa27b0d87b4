"""Running out of file descriptors never starves a real client, on a real `python -m proxy
serve` process whose open-file limit is 256 (`ulimit -n 256`, set in the child).

The proxy fits `max_connections` and its listen backlog to that limit, and at the cap closes,
oldest first, the connections that have not sent a whole request head, then idle keep-alive
ones — never one with a request in flight (proxy/server/http/closing.py). So 300 connections
that send nothing cannot take every descriptor: streams already running finish, and a new one
is served at once (it used to get a 503 until the silent ones timed out, and past the limit
accept() failed with EMFILE, which resets the connections waiting to be accepted).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.simulator import SimulatorConfig
from tests.rawhttp import port_of
from tests.reliability import (
    MODEL,
    body,
    log_problems,
    raise_fd_limit,
    sse_events,
    start_proxy_process,
)
from tests.simulator_helpers import SimThread
from tests.wellformed import assert_well_formed

OPEN_FILES = 256
SILENT = 300
#: Streams running while the silent connections arrive: 300 tokens, ~9 s each.
RUNNING = 4
LONG = {"x-sim-tokens": "300"}
#: Connections opened all at once.
BURST = 600


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    config = SimulatorConfig(first_token_seconds=0.0, token_seconds=0.03, record_limit=5000)
    with SimThread(encoding, config) as running:
        yield running


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def streamed(
    client: httpx.AsyncClient, text: str, headers: dict[str, str] | None = None
) -> list[dict[str, object]]:
    answer = await client.post("/v1/responses", json=body(text), headers=headers)
    assert answer.status_code == 200, answer.text[:300]
    return sse_events(answer.content)


def test_silent_connections_never_starve_a_stream(sim: SimThread, tmp_path: Path) -> None:
    raise_fd_limit()  # this test process holds 300 sockets and more
    assert sim.server is not None
    process = start_proxy_process(
        sim.server.url, tmp_path / "proxy.log", "--store-url", "memory://", open_files=OPEN_FILES
    )
    silent: list[socket.socket] = []
    try:
        fitted = orjson.loads(
            next(
                line
                for line in process.log_text().splitlines()
                if "max_connections lowered" in line
            )
        )
        cap = fitted["fitted"]
        assert cap < SILENT, fitted  # the silent connections alone fill the cap

        async def scenario() -> None:
            limits = httpx.Limits(max_connections=RUNNING + 5)
            async with httpx.AsyncClient(base_url=process.url, timeout=30, limits=limits) as client:
                running = [
                    asyncio.create_task(streamed(client, f"running {n}", LONG))
                    for n in range(RUNNING)
                ]
                await asyncio.sleep(0.3)  # their heads are in: requests in flight
                port = port_of(process.url)
                for _ in range(SILENT):
                    silent.append(socket.create_connection(("127.0.0.1", port), timeout=10))
                await asyncio.sleep(0.5)
                descriptors = len(os.listdir(f"/proc/{process.pid}/fd"))
                assert descriptors < OPEN_FILES - 16, descriptors
                assert not any(task.done() for task in running)
                started = time.monotonic()
                async with httpx.AsyncClient(base_url=process.url, timeout=30) as newcomer:
                    events = await streamed(newcomer, "a newcomer")  # on a new connection
                assert time.monotonic() - started < 5
                assert assert_well_formed(events)["status"] == "completed"
                for done in await asyncio.gather(*running):  # never shed: in flight
                    assert assert_well_formed(done)["status"] == "completed"

        asyncio.run(scenario())
        # The oldest silent connections were closed without a word, the newest are still open.
        closed = [not_open(sock) for sock in silent]
        assert all(closed[: SILENT - cap]), closed.index(False)
        assert not any(closed[-(cap // 2) :])
        shed = metric(process.url, 'proxy_http_limits_total{kind="headless_shed"}')
        assert shed >= SILENT - cap
        assert metric(process.url, 'proxy_http_limits_total{kind="connection_refused"}') == 0
        assert httpx.get(process.url + "/v1/models", timeout=5).json()["data"][0]["id"] == MODEL
    finally:
        for sock in silent:
            sock.close()
        process.stop()
    text = process.log_text()
    assert not log_problems(text), log_problems(text)[:5]
    assert "accept" not in text.lower()  # uvicorn's and asyncio's EMFILE reports name accept()


@pytest.mark.parametrize("loop", ["auto", "asyncio"])
def test_a_burst_of_connections_stays_within_the_limit(
    sim: SimThread, tmp_path: Path, loop: str
) -> None:
    """`BURST` connections arrive while the proxy's event loop is busy (stopped, here): the
    loop then accepts the queued ones in one go before the guard sees any — asyncio's takes up
    to the listen backlog at once — so a backlog larger than the descriptors left ran into
    EMFILE. With the backlog fitted, the descriptors stay within the limit, every connection
    the proxy closed was closed by the guard (counted, oldest first), and a stream is served."""
    raise_fd_limit()
    assert sim.server is not None
    process = start_proxy_process(
        sim.server.url,
        tmp_path / "proxy.log",
        *("--store-url", "memory://", "--event-loop", loop),
        open_files=OPEN_FILES,
    )
    try:
        port = port_of(process.url)

        async def scenario() -> None:
            async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
                return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)

            os.kill(process.pid, signal.SIGSTOP)
            try:
                connecting = [asyncio.create_task(connect()) for _ in range(BURST)]
                await asyncio.sleep(1.0)  # the kernel queues what the backlog holds
            finally:
                os.kill(process.pid, signal.SIGCONT)
            peak = 0
            for _ in range(100):
                peak = max(peak, len(os.listdir(f"/proc/{process.pid}/fd")))
                await asyncio.sleep(0.01)
            assert peak < OPEN_FILES - 16, peak
            opened = await asyncio.gather(*connecting)
            try:
                async with httpx.AsyncClient(base_url=process.url, timeout=30) as client:
                    events = await streamed(client, "after the burst")
                    assert assert_well_formed(events)["status"] == "completed"
                    # Connections the kernel left half-open are accepted (and shed) later on:
                    # the count of those closed lies between two readings of the counter.
                    before = await shed_count(client)
                    await asyncio.sleep(0.5)  # the closes reach us
                    closed = sum(ended(reader) for reader, _ in opened)
                    after = await shed_count(client)
                assert before - 1 <= closed <= after, (before, closed, after)
            finally:
                for _, writer in opened:
                    writer.close()

        asyncio.run(scenario())
    finally:
        process.stop()
    text = process.log_text()
    assert not log_problems(text), log_problems(text)[:5]
    assert "accept" not in text.lower()


async def shed_count(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    (line,) = (x for x in text.splitlines() if x.startswith(_SHED + " "))
    return float(line.split()[1])


_SHED = 'proxy_http_limits_total{kind="headless_shed"}'


def ended(reader: asyncio.StreamReader) -> bool:
    """Whether the proxy closed the connection (it was sent nothing: it can only end)."""
    return reader.at_eof() or reader.exception() is not None


def not_open(sock: socket.socket) -> bool:
    """Whether the proxy closed `sock` (it was sent nothing, so it reads nothing but the end)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)
