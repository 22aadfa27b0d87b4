"""Clients that go away, at every point of a stream and all at once.

A client that disconnects must release the upstream request within a second (trtllm-serve then
stops generating: the simulator records the moment it saw its connection close), be counted in
`proxy_client_disconnects_total` by phase, leave nothing unhandled in the log, and leave the
proxy serving. The simulator holds each stream open at the point under test with a `stall`.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.tokens import MESSAGE
from proxy.simulator import RequestRecord
from tests.live import LiveServer
from tests.reliability import (
    FAST_SIM,
    TOOLS,
    Proxy,
    body,
    completion,
    running_proxy,
    sse_events,
    wait_until,
)
from tests.simulator_helpers import SimThread
from tests.upstream_double import UpstreamDouble
from tests.wellformed import assert_well_formed

HOLD = 10.0  # seconds the simulator stalls at the point under test (the client leaves first)


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST_SIM) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: SimThread, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    assert sim.server is not None
    with running_proxy(sim.server.url, encoding, keepalive_interval=60.0) as running:
        yield running


def record_of(sim: SimThread, request_id: str) -> RequestRecord:
    found = [r for r in sim.records if r.request_id == request_id]
    assert len(found) == 1, f"{len(found)} simulator records for {request_id}"
    return found[0]


def counted(proxy: Proxy, phase: str) -> float:
    return proxy.metric("proxy_client_disconnects_total", phase=phase)


def completed(proxy: Proxy) -> float:
    return proxy.metric(
        "proxy_requests_total",
        route="responses",
        stream="true",
        model="other",
        outcome="completed",
    )


def assert_still_serving(proxy: Proxy) -> None:
    answer = httpx.post(proxy.url + "/v1/responses", json=body("Still there?"), timeout=30)
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"
    assert wait_until(lambda: proxy.in_flight() == 0, 2)
    assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]


#: Where the client leaves: the request, how many tokens the simulator sends before it stalls,
#: the event type the client waits for before it closes, and the phase the proxy counts.
POINTS: dict[str, tuple[str, str, str | None]] = {
    "after_created": ("plain", "response.in_progress", "before_first_token"),
    "mid_reasoning": ("plain", "response.reasoning_text.delta", "streaming"),
    "mid_answer": ("plain", "response.output_text.delta", "streaming"),
    "mid_call_arguments": ("tools", "response.function_call_arguments.delta", "streaming"),
    # The client has everything; the proxy reads upstream's tail (usage, [DONE]) in vain.
    "after_last_token": ("plain", "response.completed", None),
}


def stall_after(encoding: HarmonyEncoding, where: str, request: dict[str, Any]) -> int:
    ids = completion(encoding, request).token_ids
    messages = [index for index, token in enumerate(ids) if token == MESSAGE]
    return {
        "after_created": 0,
        "mid_reasoning": messages[0] + 4,
        "mid_answer": messages[-1] + 4,
        "mid_call_arguments": messages[-1] + 3,
        "after_last_token": len(ids),
    }[where]


@pytest.mark.parametrize("where", list(POINTS))
def test_disconnect_releases_upstream_within_a_second(
    proxy: Proxy, sim: SimThread, encoding: HarmonyEncoding, where: str
) -> None:
    kind, wait_for_type, phase = POINTS[where]
    request = body(tools=TOOLS) if kind == "tools" else body()
    after = stall_after(encoding, where, request)
    request_id = f"leave-{where}"
    before = counted(proxy, phase or "streaming"), completed(proxy)
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            proxy.url + "/v1/responses",
            json=request,
            headers={"X-Sim-Fault": f"stall@{after}:{HOLD}", "X-Request-Id": request_id},
        ) as answer,
    ):
        for line in answer.iter_lines():
            if line == f"event: {wait_for_type}":
                break
        else:
            raise AssertionError(f"no {wait_for_type} event")
    left = time.monotonic()  # the connection is closed
    record = record_of(sim, request_id)
    assert wait_until(lambda: record.closed, 3), "upstream request still open"
    assert record.disconnected, "the proxy did not close the upstream request"
    assert record.closed_at is not None
    assert record.closed_at - left < 1.0
    assert wait_until(lambda: proxy.in_flight() == 0, 2)
    if phase is None:
        assert wait_until(lambda: completed(proxy) == before[1] + 1, 1), "not completed"
        assert counted(proxy, "streaming") == before[0], "counted as a disconnect"
    else:
        assert wait_until(lambda: counted(proxy, phase) == before[0] + 1, 1)
    assert_still_serving(proxy)


def test_disconnect_while_sending_the_body(proxy: Proxy) -> None:
    before = counted(proxy, "before_upstream")
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 1000\r\n\r\n{"model": "openai/gpt-oss-120b", "in'
        )
        time.sleep(0.1)
    assert wait_until(lambda: counted(proxy, "before_upstream") == before + 1, 2)
    assert_still_serving(proxy)


def test_disconnect_before_upstream_answers(encoding: HarmonyEncoding) -> None:
    double = UpstreamDouble()
    with LiveServer(double) as upstream, running_proxy(upstream.url, encoding) as proxy:
        double.queue = [[("sleep", 2.0)]]  # the double sleeps on when its client leaves
        before = counted(proxy, "before_upstream")
        with httpx.Client() as client:
            request = client.build_request(
                "POST", proxy.url + "/v1/responses", json=body(), timeout=httpx.Timeout(0.5)
            )
            with pytest.raises(httpx.ReadTimeout):
                client.send(request)  # no status line yet: an impatient client gives up
        left = time.monotonic()
        assert wait_until(lambda: bool(double.completions()) and double.completions()[-1].ended, 3)
        seen = double.completions()[-1]
        assert seen.disconnected
        assert seen.ended is not None
        assert seen.ended - left < 1.0
        assert wait_until(lambda: counted(proxy, "before_upstream") == before + 1, 2)
        assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]


def test_a_hundred_clients_leave_at_once(proxy: Proxy, sim: SimThread) -> None:
    count = 100
    before = counted(proxy, "streaming")
    ready = 0

    async def client(number: int, leave: asyncio.Event, http: httpx.AsyncClient) -> None:
        nonlocal ready
        headers = {"X-Sim-Fault": f"stall@30:{HOLD}", "X-Request-Id": f"crowd-{number}"}
        async with http.stream(
            "POST", proxy.url + "/v1/responses", json=body(), headers=headers
        ) as answer:
            async for line in answer.aiter_lines():
                if line == "event: response.reasoning_text.delta":
                    break
            ready += 1
            await leave.wait()  # leaving the block closes the connection

    async def crowd() -> float:
        leave = asyncio.Event()
        limits = httpx.Limits(max_connections=count + 10)
        async with httpx.AsyncClient(timeout=30, limits=limits) as http:
            tasks = [asyncio.ensure_future(client(n, leave, http)) for n in range(count)]
            async with asyncio.timeout(30):
                while ready < count:
                    await asyncio.sleep(0.01)
            leave.set()
            await asyncio.gather(*tasks)
            return time.monotonic()

    left = asyncio.run(crowd())
    records = [record_of(sim, f"crowd-{n}") for n in range(count)]
    assert wait_until(lambda: all(r.closed for r in records), 3)
    assert all(r.disconnected for r in records)
    slowest = max(r.closed_at or 0.0 for r in records) - left
    assert slowest < 1.0, f"the last upstream request was released after {slowest:.2f} s"
    assert wait_until(lambda: counted(proxy, "streaming") == before + count, 2)
    assert_still_serving(proxy)
