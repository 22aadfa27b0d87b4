"""SIGTERM with a hundred streams open (issue 7): the proxy process drains within its grace
period and every stream ends with exactly one terminal event — `response.completed` for those
that finish within `drain_timeout`, `error` (`server_shutting_down`) + `response.failed` for the
rest — and nothing unhandled reaches the log.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from proxy.simulator import SimulatorConfig
from tests.reliability import (
    body,
    log_problems,
    raise_fd_limit,
    scaled,
    sse_events,
    start_proxy_process,
)
from tests.simulator_helpers import SimThread
from tests.wellformed import assert_well_formed

STREAMS = scaled(100, 100)
DRAIN = 2.0  # --drain-timeout
GRACE = 5.0  # what `serve` gives uvicorn on top of the drain period (server._DRAIN_GRACE)
#: 10 ms per token: a 60-token answer ends within the drain period, a 3,000-token one does not.
SIM = SimulatorConfig(first_token_seconds=0.05, token_seconds=0.01, record_limit=5000)


@pytest.fixture
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    raise_fd_limit()
    with SimThread(encoding, SIM) as running:
        yield running


@pytest.mark.slow
def test_sigterm_drains_a_hundred_open_streams(sim: SimThread, tmp_path: Path) -> None:
    assert sim.server is not None
    proxy = start_proxy_process(
        sim.server.url, tmp_path / "proxy.log", "--drain-timeout", str(DRAIN)
    )
    started = 0

    async def client(number: int, http: httpx.AsyncClient) -> list[dict[str, object]]:
        nonlocal started
        tokens = "60" if number % 2 else "3000"  # half finish while draining, half cannot
        async with http.stream(
            "POST",
            proxy.url + "/v1/responses",
            json=body(f"Question {number}"),
            headers={"X-Sim-Tokens": tokens},
        ) as answer:
            assert answer.status_code == 200
            chunks = []
            async for chunk in answer.aiter_bytes():
                if not chunks:
                    started += 1
                chunks.append(chunk)
        return sse_events(b"".join(chunks))

    async def run() -> tuple[list[list[dict[str, object]]], float]:
        limits = httpx.Limits(max_connections=STREAMS + 10)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            tasks = [asyncio.ensure_future(client(n, http)) for n in range(STREAMS)]
            async with asyncio.timeout(30):
                while started < STREAMS:
                    await asyncio.sleep(0.01)
            proxy.popen.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            results = await asyncio.gather(*tasks)
            return results, signalled

    try:
        results, signalled = asyncio.run(run())
        proxy.popen.wait(timeout=DRAIN + GRACE + 10)
        took = time.monotonic() - signalled
    finally:
        proxy.stop()
    outcomes = {"completed": 0, "failed": 0}
    for number, events in enumerate(results):
        response = assert_well_formed(events)  # exactly one terminal event, every rule
        outcomes[response["status"]] += 1
        if response["status"] == "failed":
            assert events[-2]["code"] == "server_shutting_down", events[-2]
            assert number % 2 == 0, "a short answer was cut by the drain"
    print(f"\nSIGTERM with {STREAMS} streams open: {outcomes}, process gone after {took:.2f} s")
    assert outcomes == {"completed": STREAMS // 2, "failed": STREAMS - STREAMS // 2}
    assert took < DRAIN + GRACE, f"draining took {took:.1f} s"
    assert proxy.popen.returncode in (0, -signal.SIGTERM)
    assert log_problems(proxy.log_text()) == []
