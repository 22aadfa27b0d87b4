"""Costly inputs and many bodies at once, over real sockets.

- A body openai-harmony needs minutes to render (one unbroken run of 1 MB, 100,000 CJK
  characters, 100,000 input items) no longer holds the event loop: `/healthz` and an open stream
  go on answering while it renders in a worker, and it ends in a 400 naming `render_timeout`.
- The body budget: a request that finds it full waits, then gets a JSON 503 with Retry-After;
  a Content-Length over `max_body_bytes` is a 413 before anything is read, so `Expect:
  100-continue` never gets `100 Continue` for a body that would be refused.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.simulator import SimulatorConfig
from tests.reliability import MODEL, Proxy, body, running_proxy, sse_events
from tests.simulator_helpers import SimThread
from tests.wellformed import assert_well_formed

#: Paced so that a stream is open while a hostile body renders.
SIM = SimulatorConfig(first_token_seconds=0.0, token_seconds=0.01, record_limit=5000)
LIMIT = 4 * 1024 * 1024  # max_body_bytes
BUDGET = 256 * 1024  # body_budget_bytes

HOSTILE = {
    "run": {"model": MODEL, "input": "a" * 1_000_000},
    "cjk": {"model": MODEL, "input": "中" * 100_000},
    # openai-harmony renders each (~75 µs); plain user messages alone would be assembled from
    # cached ids (request/prefix.py) in a fraction of a second
    "items": {
        "model": MODEL,
        "input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 50_000,
    },
}


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, SIM) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: SimThread, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    assert sim.server is not None
    with running_proxy(
        sim.server.url,
        encoding,
        max_body_bytes=LIMIT,
        render_timeout=4.0,
        body_budget_bytes=BUDGET,
        body_budget_wait=0.5,
    ) as running:
        assert wait_ready(running)
        yield running


def wait_ready(proxy: Proxy) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(proxy.url + "/readyz", timeout=5).status_code == 200:
            return True
        time.sleep(0.05)
    return False


def renders(proxy: Proxy, path: str, outcome: str) -> float:
    return proxy.metric("proxy_renders_total", path=path, outcome=outcome)


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_costly_render_stalls_nobody_and_is_a_400(proxy: Proxy, kind: str) -> None:
    timeouts = renders(proxy, "worker", "timeout")
    failed = renders(proxy, "worker", "client_error")

    async def scenario() -> tuple[httpx.Response, list[float], list[dict[str, Any]]]:
        async with httpx.AsyncClient(timeout=30) as http:
            stream = asyncio.ensure_future(
                http.post(
                    proxy.url + "/v1/responses",
                    json=body("Tell me a story."),
                    headers={"X-Sim-Tokens": "300"},  # ~3 s of frames, 10 ms apart
                )
            )
            hostile = asyncio.ensure_future(
                http.post(proxy.url + "/v1/responses", content=orjson.dumps(HOSTILE[kind]))
            )
            health = []
            while not hostile.done():
                sent = time.monotonic()
                answer = await http.get(proxy.url + "/healthz", timeout=1.0)  # a stall fails it
                assert answer.status_code == 200
                health.append(time.monotonic() - sent)
                await asyncio.sleep(0.05)
            streamed = await stream
            return await hostile, health, sse_events(streamed.content)

    answer, health, events = asyncio.run(scenario())
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"] == "input"
    if kind == "run":
        # openai-harmony's regex overflows its stack on a 1 MB run (a panic: 500 inline)
        assert error["code"] == "render_failed"
        assert renders(proxy, "worker", "client_error") == failed + 1
    else:
        assert error["code"] == "render_timeout"
        assert "render_timeout (4 s)" in error["message"]
        assert renders(proxy, "worker", "timeout") == timeouts + 1
    assert len(health) >= 2  # /healthz answered all along the render
    assert max(health) < 1.0
    assert assert_well_formed(events)["status"] == "completed"
    assert proxy.logs.problems() == [], proxy.logs.text()[-2000:]
    # the worker was replaced; a request that needs it is served once it is up
    assert wait_ready(proxy)
    served = httpx.post(proxy.url + "/v1/responses", json=body("y " * 3000), timeout=30)
    assert assert_well_formed(sse_events(served.content))["status"] == "completed"


def test_realistic_bodies_up_to_the_limit_are_rendered(proxy: Proxy) -> None:
    words = "the quick brown fox jumps over the lazy dog; " * (LIMIT // 45 + 1)

    def rendered() -> float:  # the second is refused in the worker once max_prompt_tokens exists
        return renders(proxy, "worker", "ok") + renders(proxy, "worker", "client_error")

    before = rendered()
    # ~90,000 prompt tokens: within gpt-oss's context, served
    answer = httpx.post(proxy.url + "/v1/responses", json=body(words[:400_000]), timeout=60)
    assert answer.status_code == 200, answer.text[:300]
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"
    # the body limit: rendered well within render_timeout; ~930,000 tokens are more than the
    # model's context, which upstream (or the proxy's max_prompt_tokens) refuses: a 400
    content = orjson.dumps(body(words[: LIMIT - 200]))
    assert LIMIT - 300 < len(content) <= LIMIT
    answer = httpx.post(proxy.url + "/v1/responses", content=content, timeout=60)
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"]["code"] not in ("render_timeout", "render_failed")
    assert rendered() == before + 2


def _raw_request(proxy: Proxy, head: bytes, body: bytes = b"", read_for: float = 2.0) -> bytes:
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        sock.settimeout(read_for)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
    return received


def test_expect_100_continue_over_the_limit_is_413_without_100_continue(proxy: Proxy) -> None:
    answer = _raw_request(
        proxy,
        b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"expect: 100-continue\r\ncontent-length: 100000000000\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"100 Continue" not in answer
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    assert orjson.loads(payload)["error"]["code"] == "request_too_large"


def test_expect_100_continue_within_the_limit_is_served(proxy: Proxy) -> None:
    content = orjson.dumps(body("Hi", stream=False))
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(content)
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(content)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


def test_a_full_body_budget_is_a_503_with_retry_after(proxy: Proxy) -> None:
    port = int(proxy.url.rsplit(":", 1)[1])
    # One client declares a body as large as the whole budget and sends only part of it: the
    # budget stays taken while it is read.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as holder:
        holder.sendall(
            b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n{" % BUDGET
        )
        time.sleep(0.2)
        started = time.monotonic()
        answer = httpx.post(proxy.url + "/v1/responses", json=body("Hi"), timeout=10)
        waited = time.monotonic() - started
    assert answer.status_code == 503, answer.text[:300]
    assert answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["code"] == "body_budget_exhausted"
    assert "body_budget_bytes" in answer.json()["error"]["message"]
    assert waited >= 0.5  # it waited body_budget_wait before giving up
    # the holder went away: its share is free again
    served = httpx.post(proxy.url + "/v1/responses", json=body("Hi"), timeout=10)
    assert served.status_code == 200
    assert proxy.logs.problems() == [], proxy.logs.text()[-2000:]


def test_a_request_waits_for_room_in_the_budget(proxy: Proxy) -> None:
    port = int(proxy.url.rsplit(":", 1)[1])
    content = orjson.dumps(body("Hi", stream=False))
    holder = socket.create_connection(("127.0.0.1", port), timeout=10)
    first = b'{"model": "%s", "input": "' % MODEL.encode()
    holder.sendall(
        b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (BUDGET - 10) + first
    )

    async def scenario() -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as http:
            waiting = asyncio.ensure_future(http.post(proxy.url + "/v1/responses", content=content))
            await asyncio.sleep(0.2)
            assert not waiting.done()  # no room: it waits
            holder.close()  # the holder gives up: room comes free within body_budget_wait
            return await waiting

    answer = asyncio.run(scenario())
    assert answer.status_code == 200, answer.text[:300]
