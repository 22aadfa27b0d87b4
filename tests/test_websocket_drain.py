"""WebSocket sessions at the edges of the server: SIGTERM (the turn in flight ends with its
terminal event, then close 1001; idle sessions close at once), a client that stops reading (the
connection is aborted after `send_timeout` and the upstream request released), the handshake
through the HTTP guard (head limit, connection cap: a WebSocket is never closed for room)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from proxy.simulator import SimulatorConfig
from tests.harmony import ids_of
from tests.live import LiveServer, wait_for
from tests.reliability import log_problems, running_proxy, start_proxy_process
from tests.simulator_helpers import SimThread
from tests.upstream_double import MODEL, UpstreamDouble

TERMINAL = ("response.completed", "response.failed", "response.incomplete")
SIM = SimulatorConfig(first_token_seconds=0.05, token_seconds=0.01)


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/responses"


def create(model: str = MODEL, **fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": model, "input": "Hi", **fields})


@pytest.fixture
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, SIM) as running:
        yield running


def test_sigterm_ends_the_turn_in_flight_then_closes_with_1001(
    sim: SimThread, tmp_path: Path
) -> None:
    assert sim.server is not None
    proxy = start_proxy_process(sim.server.url, tmp_path / "proxy.log", "--drain-timeout", "10")
    try:
        # 150 tokens at 10 ms: the turn outlives the signal by about a second.
        busy = connect(ws_url(proxy.url), additional_headers={"X-Sim-Tokens": "150"})
        idle = connect(ws_url(proxy.url))
        busy.send(create())
        events = [json.loads(busy.recv(timeout=10))]
        while events[-1]["type"] != "response.output_text.delta":
            events.append(json.loads(busy.recv(timeout=10)))
        proxy.popen.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        with pytest.raises(ConnectionClosed) as idle_closed:
            idle.recv(timeout=5)
        idle_took = time.monotonic() - signalled
        busy.send(create())  # a new turn during the drain
        refusals: list[dict[str, Any]] = []
        closed = _read_until_closed(busy, events, refusals)
        proxy.popen.wait(timeout=15)
    finally:
        proxy.stop()
    assert idle_closed.value.rcvd is not None
    assert idle_closed.value.rcvd.code == 1001
    assert idle_took < 3
    assert [event["error"]["code"] for event in refusals] == ["server_shutting_down"]
    assert refusals[0]["status"] == 503
    assert events[-1]["type"] == "response.completed"
    assert sum(event["type"] in TERMINAL for event in events) == 1
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1001
    assert proxy.popen.returncode in (0, -signal.SIGTERM)
    assert log_problems(proxy.log_text()) == []


def _read_until_closed(
    connection: Any, events: list[dict[str, Any]], errors: list[dict[str, Any]]
) -> ConnectionClosed:
    """Read events into `events` (and `error` events into `errors`) until the close."""
    while True:
        try:
            event = json.loads(connection.recv(timeout=10))
        except ConnectionClosed as closed:
            return closed
        (errors if event["type"] == "error" else events).append(event)


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[UpstreamDouble, LiveServer]]:
    double = UpstreamDouble()
    with LiveServer(double) as server:
        yield double, server


def _masked_text_frame(text: str) -> bytes:
    payload = text.encode()
    mask = os.urandom(4)
    size = len(payload)
    head = bytes([0x81])
    if size < 126:
        head += bytes([0x80 | size])
    else:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _handshake(extra: bytes = b"") -> bytes:
    key = base64.b64encode(os.urandom(16))
    return (
        b"GET /v1/responses HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
        b"sec-websocket-key: " + key + b"\r\nsec-websocket-version: 13\r\n" + extra + b"\r\n"
    )


def test_a_client_that_stops_reading_is_aborted_and_its_upstream_request_released(
    upstream: tuple[UpstreamDouble, LiveServer], encoding: HarmonyEncoding
) -> None:
    double = upstream[0]
    double.seen.clear()
    header = ids_of(encoding, "<|channel|>final<|message|>")
    spaces = [72056] * 1000  # 128 spaces each: 8 MB of text, more than every socket buffer
    script: list[Any] = [("frame", header, None, None), *[("frame", spaces, None, None)] * 64]
    double.script = [*script, ("sleep", 30.0)]
    with running_proxy(upstream[1].url, encoding, send_timeout=0.5) as proxy:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock.connect(("127.0.0.1", proxy.server.port))
            sock.sendall(_handshake())
            assert sock.recv(4096).startswith(b"HTTP/1.1 101")
            sock.sendall(_masked_text_frame(create()))  # ... and never read again
            assert wait_for(
                lambda: bool(double.completions()) and double.completions()[-1].ended, 15
            )
            assert double.completions()[-1].disconnected  # upstream released
            assert proxy.metric("proxy_http_limits_total", kind="ws_send_timeout") == 1
            assert wait_for(lambda: proxy.metric("proxy_websocket_sessions") == 0, 5)
            assert wait_for(lambda: proxy.metric("proxy_client_connections") == 0, 5)
        finally:
            sock.close()


def test_the_handshake_head_is_bounded_by_the_guard(
    upstream: tuple[UpstreamDouble, LiveServer], encoding: HarmonyEncoding
) -> None:
    with running_proxy(upstream[1].url, encoding, max_header_bytes=2048) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.server.port), timeout=5) as sock:
            sock.sendall(_handshake(b"x-filler: " + b"a" * 4000 + b"\r\n"))
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 431")
        assert b"request_header_fields_too_large" in answer
        assert proxy.metric("proxy_http_limits_total", kind="head_too_large") == 1


def test_a_websocket_counts_under_the_cap_and_is_never_closed_for_room(
    upstream: tuple[UpstreamDouble, LiveServer], encoding: HarmonyEncoding
) -> None:
    with running_proxy(upstream[1].url, encoding, max_connections=2) as proxy:
        first = connect(ws_url(proxy.url))
        second = connect(ws_url(proxy.url))
        try:
            assert wait_for(lambda: proxy.metric("proxy_client_connections") == 2, 5)
            with socket.create_connection(("127.0.0.1", proxy.server.port), timeout=5) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 503")
            assert b"too_many_connections" in answer
            first.ping().wait(5)  # both sessions are still open
            second.ping().wait(5)
        finally:
            first.close()
            second.close()
        assert wait_for(lambda: proxy.metric("proxy_client_connections") == 0, 5)


def test_a_get_without_upgrade_is_still_passed_through(
    upstream: tuple[UpstreamDouble, LiveServer], encoding: HarmonyEncoding
) -> None:
    double = upstream[0]
    double.seen.clear()
    with (
        running_proxy(upstream[1].url, encoding) as proxy,
        socket.create_connection(("127.0.0.1", proxy.server.port), timeout=5) as sock,
    ):
        sock.sendall(b"GET /v1/responses HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert not answer.startswith(b"HTTP/1.1 101")
    assert any(seen.path == "/v1/responses" for seen in double.seen)


def test_a_client_that_answers_no_ping_is_closed(
    upstream: tuple[UpstreamDouble, LiveServer], encoding: HarmonyEncoding
) -> None:
    with running_proxy(upstream[1].url, encoding, ws_ping_interval=0.5) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.server.port), timeout=10) as sock:
            sock.sendall(_handshake())
            received = sock.recv(4096)
            assert received.startswith(b"HTTP/1.1 101")
            started = time.monotonic()
            while chunk := sock.recv(4096):  # pings come; no pong goes back
                received += chunk
            took = time.monotonic() - started
        assert b"\x89" in received  # a ping frame was sent
        assert 0.5 < took < 5  # one interval to the ping, one more for its pong
        assert wait_for(lambda: proxy.metric("proxy_websocket_sessions") == 0, 5)
        assert wait_for(lambda: proxy.metric("proxy_client_connections") == 0, 5)
