"""SIGTERM against a real `serve` process: the drain.

- With a hundred streams open, every stream ends with exactly one terminal event —
  `response.completed` for those that finish within `drain_timeout`, `error`
  (`server_shutting_down`) + `response.failed` for the rest — and nothing unhandled reaches
  the log.
- What Kubernetes relies on: `/healthz` and `/readyz` answer 503 at once while the listener
  stays open; new requests get a JSON 503 with Retry-After; requests still waiting for
  upstream's head get a JSON 503 (never 500) at the drain timeout; the process exits within
  `drain_timeout` + 2 s with nothing logged as an error; an idle proxy exits after
  `drain_linger`.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from proxy.simulator import SimulatorConfig
from tests.harmony import ids_of
from tests.live import LiveServer
from tests.reliability import (
    body,
    log_problems,
    raise_fd_limit,
    scaled,
    sse_events,
    start_proxy_process,
)
from tests.simulator_helpers import SimThread
from tests.upstream_double import UpstreamDouble, script_for
from tests.wellformed import assert_well_formed

STREAMS = scaled(100, 100)
DRAIN = 2.0  # --drain-timeout
GRACE = 2.0  # the exit comes within drain_timeout + 2 s (runner.EXIT_MARGIN)
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


# -- the drain, step by step -----------------------------------------------------------------------

ANSWER = (
    "<|channel|>analysis<|message|>The user greets me. Answer politely and briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help you today?<|return|>"
)


def _answer_script(encoding: HarmonyEncoding, pause: float, repeat: int = 1) -> list[Any]:
    text = ANSWER.replace("briefly.", "briefly. " * repeat)
    return script_for(ids_of(encoding, text), 1, pause=pause)


@pytest.fixture
def double() -> Iterator[tuple[UpstreamDouble, LiveServer]]:
    upstream = UpstreamDouble()
    with LiveServer(upstream) as server:
        yield upstream, server


def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=2)


def test_sigterm_drain_answers_every_request_and_exits_in_time(
    double: tuple[UpstreamDouble, LiveServer], encoding: HarmonyEncoding, tmp_path: Path
) -> None:
    upstream, server = double
    drain = 3.0
    upstream.queue = [
        _answer_script(encoding, 0.02),  # finishes within the drain (~0.5 s)
        _answer_script(encoding, 0.2, repeat=40),  # ~40 s of tokens: ended by the drain
        [("sleep", 60.0)],  # upstream never sends its head: a waiter
        [("sleep", 60.0)],
    ]
    proxy = start_proxy_process(
        server.url, tmp_path / "proxy.log", "--drain-timeout", str(drain), "--drain-linger", "0.5"
    )

    async def post(http: httpx.AsyncClient) -> tuple[httpx.Response, float]:
        answer = await http.post(proxy.url + "/v1/responses", json=body("Hi"))
        return answer, time.monotonic()

    streaming = asyncio.Event()

    async def passthrough_stream(http: httpx.AsyncClient) -> tuple[str, float, int]:
        """A pass-through SSE answer of ~100 s: cut at the drain's end, never completed."""
        received = 0
        try:
            async with http.stream("GET", proxy.url + "/sse?count=1000&pause=0.1") as answer:
                assert answer.status_code == 200
                async for chunk in answer.aiter_bytes():
                    received += len(chunk)
                    streaming.set()
        except httpx.RemoteProtocolError as cut:
            return str(cut), time.monotonic(), received
        return "complete", time.monotonic(), received

    async def passthrough_waiter(http: httpx.AsyncClient) -> tuple[httpx.Response, float]:
        answer = await http.get(proxy.url + "/stall")  # upstream never sends its head
        return answer, time.monotonic()

    async def run() -> tuple[list[tuple[httpx.Response, float]], float, dict[str, Any]]:
        async with httpx.AsyncClient(timeout=30) as http:
            tasks = []
            for number in range(4):  # one at a time, so each gets its script
                tasks.append(asyncio.ensure_future(post(http)))
                async with asyncio.timeout(10):
                    while len(upstream.completions()) <= number:
                        await asyncio.sleep(0.01)
            passing = [
                asyncio.ensure_future(passthrough_stream(http)),
                asyncio.ensure_future(passthrough_waiter(http)),
            ]
            async with asyncio.timeout(10):
                await streaming.wait()
                while not any(seen.path == "/stall" for seen in upstream.seen):
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            proxy.popen.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.3)
            during = {  # new connections: the listener is still open
                "healthz": await asyncio.to_thread(_get, proxy.url + "/healthz"),
                "readyz": await asyncio.to_thread(_get, proxy.url + "/readyz"),
                "new": await http.post(proxy.url + "/v1/responses", json=body("Late")),
            }
            stream_end, stall_end = await asyncio.gather(*passing)
            during["passthrough"] = (stream_end, stall_end)
            return list(await asyncio.gather(*tasks)), signalled, during

    try:
        results, signalled, during = asyncio.run(run())
        proxy.popen.wait(timeout=drain + GRACE + 10)
        took = time.monotonic() - signalled
    finally:
        proxy.stop()
    # at once: probes 503, new requests a JSON 503 with Retry-After
    assert during["healthz"].status_code == 503
    assert during["healthz"].json() == {"status": "draining"}
    assert during["readyz"].status_code == 503
    assert during["readyz"].json()["draining"] is True
    late = during["new"]
    assert late.status_code == 503
    assert late.headers["retry-after"] == "1"
    assert late.json()["error"]["code"] == "server_shutting_down"
    assert len(upstream.completions()) == 4  # the late one never reached upstream
    # the streams: one completed, one ended by the drain with its terminal event
    (short, _), (long, long_ended) = results[0], results[1]
    assert assert_well_formed(sse_events(short.content))["status"] == "completed"
    events = sse_events(long.content)
    assert assert_well_formed(events)["status"] == "failed"
    assert events[-2]["code"] == "server_shutting_down"
    # the waiters on upstream's head: a JSON 503 at the drain timeout, not a 500
    for answer, ended in results[2:]:
        assert answer.status_code == 503, answer.text[:300]
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers["retry-after"] == "1"
        assert answer.json()["error"]["code"] == "server_shutting_down"
        assert drain - 0.3 <= ended - signalled <= drain + 1.0
    assert drain - 0.3 <= long_ended - signalled <= drain + 1.0
    # pass-through at the drain's end: a waiter gets the JSON 503, a stream is cut
    # where its client sees it — never left for uvicorn to cancel ("Cancel N running task(s)")
    (outcome, cut_at, received), (stalled, stall_ended) = during["passthrough"]
    assert outcome != "complete", outcome
    assert received > 0
    assert drain - 0.3 <= cut_at - signalled <= drain + 1.0
    assert stalled.status_code == 503, stalled.text[:300]
    assert stalled.json()["error"]["code"] == "server_shutting_down"
    assert drain - 0.3 <= stall_ended - signalled <= drain + 1.0
    # the process: gone within drain_timeout + 2 s, exit status 0, nothing logged as an error
    print(
        f"\ndrain {drain} s: long stream ended {long_ended - signalled:.2f} s, waiters "
        f"{[round(ended - signalled, 2) for _, ended in results[2:]]} s, process gone "
        f"{took:.2f} s after SIGTERM"
    )
    assert took < drain + GRACE, f"exit took {took:.2f} s"
    assert proxy.popen.returncode == 0
    log = proxy.log_text()
    assert log_problems(log) == []
    assert "Cancel" not in log


def test_an_idle_proxy_exits_after_the_linger(
    double: tuple[UpstreamDouble, LiveServer], tmp_path: Path
) -> None:
    _, server = double
    proxy = start_proxy_process(
        server.url, tmp_path / "proxy.log", "--drain-timeout", "30", "--drain-linger", "1"
    )
    try:
        proxy.popen.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        time.sleep(0.2)
        assert _get(proxy.url + "/healthz").status_code == 503  # still listening
        proxy.popen.wait(timeout=10)
        took = time.monotonic() - signalled
    finally:
        proxy.stop()
    print(f"\nidle proxy gone {took:.2f} s after SIGTERM (drain_linger 1 s)")
    assert 1.0 <= took < 1.0 + GRACE, f"exit took {took:.2f} s"
    assert proxy.popen.returncode == 0
    assert log_problems(proxy.log_text()) == []
