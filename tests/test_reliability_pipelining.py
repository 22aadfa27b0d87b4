"""Pipelined requests on one connection, on raw loopback sockets.

Reproduced first: every ordering of a streamed `/v1/responses`, `GET /healthz` and pass-through
requests written at once was answered, in order, by uvicorn's own queue. What was lost were
the running request's ends: uvicorn's `connection_lost` marked only the newest parsed request
disconnected, so a stream ahead of a queued request never heard that its client had gone — it
kept its upstream request generating, then failed writing to the closed socket ("Exception in
ASGI application"), and a client that half-closed after its requests got that too. The fix is
in the protocol (proxy/server/http/guard_protocol.py): every request of the connection sees
the disconnect.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import orjson
import pytest
from openai_harmony import HarmonyEncoding

from tests.harmony import ids_of
from tests.live import LiveServer
from tests.rawhttp import exchange, port_of, read_all, request
from tests.reliability import Proxy, body, running_proxy, wait_until
from tests.upstream_double import UpstreamDouble, script_for
from tests.wellformed import assert_well_formed


@pytest.fixture(scope="module")
def setup(encoding: HarmonyEncoding) -> Iterator[tuple[UpstreamDouble, Proxy]]:
    double = UpstreamDouble()
    with LiveServer(double) as server, running_proxy(server.url, encoding) as proxy:
        yield double, proxy


def slow_script(encoding: HarmonyEncoding) -> list[tuple[object, ...]]:
    """A stream of ~2 s: a frame every 0.25 s."""
    ids = ids_of(encoding, "<|channel|>final<|message|>" + "word " * 40 + "<|return|>")
    return script_for(ids, 5, pause=0.25)


STREAM = request("POST", "/v1/responses", orjson.dumps(body()))
ANSWER = request("POST", "/v1/responses", orjson.dumps(body(stream=False)))
HEALTHZ = request("GET", "/healthz")
MODELS = request("GET", "/v1/models")


def test_pipelined_requests_are_all_answered_in_order(
    setup: tuple[UpstreamDouble, Proxy],
) -> None:
    _, proxy = setup
    data = STREAM + HEALTHZ + MODELS + ANSWER + HEALTHZ + STREAM
    methods = ["POST", "GET", "GET", "POST", "GET", "POST"]
    read = exchange(port_of(proxy.url), data, methods, timeout=3)
    answers = read.answers
    assert [a.status for a in answers] == [200] * 6, answers
    assert all(a.complete for a in answers)
    for streamed in (answers[0], answers[5]):
        assert_well_formed(streamed.events())
        assert streamed.events()[-1]["type"] == "response.completed"
    assert answers[1].json() == {"status": "ok"} == answers[4].json()
    assert answers[2].json()["data"][0]["id"] == "openai/gpt-oss-120b"
    assert answers[3].json()["status"] == "completed"
    assert not proxy.logs.problems()


def _gone(proxy: Proxy) -> float:
    return sum(
        proxy.metric("proxy_client_disconnects_total", phase=phase)
        for phase in ("before_first_token", "streaming")
    )


@pytest.mark.parametrize("ending", ["close", "half-close"])
def test_a_client_gone_with_a_request_queued_stops_the_running_stream(
    setup: tuple[UpstreamDouble, Proxy], encoding: HarmonyEncoding, ending: str
) -> None:
    double, proxy = setup
    double.queue = [slow_script(encoding)]
    before = len(double.completions())
    gone = _gone(proxy)
    sock = socket.create_connection(("127.0.0.1", port_of(proxy.url)), timeout=5)
    sock.sendall(STREAM + HEALTHZ)
    data = b""
    while b"response.created" not in data:
        data += sock.recv(65536)
    if ending == "half-close":
        sock.shutdown(socket.SHUT_WR)  # uvicorn's and nginx's reading: the client left
        read_all(sock, 5)
    sock.close()
    assert wait_until(lambda: len(double.completions()) > before, 5)
    upstream = double.completions()[-1]
    # The upstream request is released at once, long before its ~2 s of frames.
    assert wait_until(lambda: upstream.ended is not None, 5)
    assert upstream.disconnected
    assert upstream.ended is not None
    assert upstream.ended - upstream.started < 1.5
    assert wait_until(lambda: _gone(proxy) == gone + 1, 5)
    assert wait_until(lambda: proxy.in_flight() == 0, 5)
    assert not proxy.logs.problems(), proxy.logs.problems()


def test_a_pipeline_deeper_than_the_limit_is_answered_then_closed(
    setup: tuple[UpstreamDouble, Proxy], encoding: HarmonyEncoding
) -> None:
    double, proxy = setup
    double.queue = [slow_script(encoding)]
    before = proxy.metric("proxy_http_limits_total", kind="pipeline_full")
    read = exchange(port_of(proxy.url), STREAM + HEALTHZ * 40, ["POST"] + ["GET"] * 40)
    answers = read.answers
    # The running stream and the 32 queued behind it; the connection then closes, and the
    # client (RFC 9112 §9.3.2) retries the 8 left unanswered.
    assert len(answers) == 33, len(answers)
    assert answers[0].events()[-1]["type"] == "response.completed"
    assert all(a.status == 200 and a.json() == {"status": "ok"} for a in answers[1:])
    assert answers[-1].headers["connection"] == "close"
    assert "connection" not in answers[-2].headers
    assert read.closed
    assert proxy.metric("proxy_http_limits_total", kind="pipeline_full") == before + 1
    assert not proxy.logs.problems()


def test_an_oversized_head_behind_a_running_stream_is_answered_after_it(
    setup: tuple[UpstreamDouble, Proxy], encoding: HarmonyEncoding
) -> None:
    double, proxy = setup
    double.queue = [slow_script(encoding)]
    big = request("GET", "/v1/models", headers=[("x-big", "a" * 70_000)])
    started = time.monotonic()
    read = exchange(port_of(proxy.url), STREAM + big, ["POST", "GET"])
    first, second = read.answers
    assert first.status == 200
    assert first.events()[-1]["type"] == "response.completed"  # not cut for the bad one
    assert second.status == 431
    assert second.json()["error"]["code"] == "request_header_fields_too_large"
    assert read.closed
    assert time.monotonic() - started < 8
