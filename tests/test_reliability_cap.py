"""The connection cap on real loopback sockets: at `max_connections` a new connection is served
and another closed for it — a lingering (answered) one first, then the oldest that has not sent
a whole request head (silent, or partway through one), then the longest-idle keep-alive one —
never one with a request in flight; with every connection busy, the newcomer gets 503 +
Retry-After. Clients are raw sockets; answers are parsed with h11 (tests/rawhttp.py).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import orjson
import pytest
from openai_harmony import HarmonyEncoding

from tests.live import LiveServer
from tests.rawhttp import assert_error, exchange, parse, port_of, read_all, request
from tests.reliability import Proxy, body, running_proxy, wait_until
from tests.upstream_double import UpstreamDouble


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[UpstreamDouble, str]]:
    double = UpstreamDouble()
    with LiveServer(double) as server:
        yield double, server.url


@pytest.fixture
def capped(upstream: tuple[UpstreamDouble, str], encoding: HarmonyEncoding) -> Iterator[Proxy]:
    with running_proxy(
        upstream[1], encoding, max_connections=6, header_timeout=2.0, body_timeout=2.0
    ) as proxy:
        yield proxy


def _healthz(sock: socket.socket) -> int:
    sock.sendall(request("GET", "/healthz"))
    data = b""
    while b'"status"' not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed"
        data += chunk
    return parse(data, ["GET"])[0].status


def test_the_cap_sheds_the_longest_idle_keep_alive_connection(capped: Proxy) -> None:
    port = port_of(capped.url)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(6)]
    try:
        for sock in idle:
            assert _healthz(sock) == 200
        assert wait_until(lambda: capped.metric("proxy_client_connections") == 6, 5)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as newcomer:
            assert _healthz(newcomer) == 200
        assert read_all(idle[0], 5).closed  # the oldest idle one made room
        assert _healthz(idle[1]) == 200  # the others are untouched
        assert capped.metric("proxy_http_limits_total", kind="idle_shed") == 1
        assert capped.metric("proxy_http_limits_total", kind="connection_refused") == 0
    finally:
        for sock in idle:
            sock.close()


def test_the_cap_sheds_connections_without_a_head_first(capped: Proxy) -> None:
    """At the cap the connections that have not sent a whole head go first, oldest first —
    silent or partway through a head — then the longest-idle keep-alive one; a connection with
    a request in flight (here a pass-through answer still streaming) is never closed for room."""
    port = port_of(capped.url)

    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=10)

    idle = [connect() for _ in range(2)]
    held: list[socket.socket] = []
    try:
        for sock in idle:
            assert _healthz(sock) == 200
        waiting = [connect(), connect(), connect()]
        waiting[1].sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # partway through a head
        streaming = connect()
        streaming.sendall(request("GET", "/sse?count=15&pause=0.2"))
        held = [*idle, *waiting, streaming]
        assert wait_until(lambda: capped.metric("proxy_client_connections") == 6, 5)
        time.sleep(0.2)  # the partial head and the stream's head are read
        for number, shed in enumerate(waiting):
            newcomer = connect()
            held.append(newcomer)
            assert _healthz(newcomer) == 200  # served at once...
            read = read_all(shed, 5)  # ...the oldest connection without a head closed for it
            assert read.closed
            if number == 1:  # it had sent part of a head: told why
                (answer,) = parse(read.data, ["GET"])
                assert_error(answer, 503, "too_many_connections")
                assert answer.headers["retry-after"] == "1"
            else:
                assert read.data == b""  # it had sent nothing: nobody to answer
        newcomer = connect()
        held.append(newcomer)
        assert _healthz(newcomer) == 200
        assert read_all(idle[0], 5).closed  # none left without a head: the longest idle
        assert _healthz(idle[1]) == 200
        (answer,) = parse(read_all(streaming, 10, ["GET"]).data, ["GET"])
        assert answer.complete
        assert answer.body.endswith(b"data: [DONE]\n\n")
        assert capped.metric("proxy_http_limits_total", kind="headless_shed") == 3
        assert capped.metric("proxy_http_limits_total", kind="idle_shed") == 1
        assert capped.metric("proxy_http_limits_total", kind="connection_refused") == 0
    finally:
        for sock in held or idle:
            sock.close()


def test_the_cap_closes_a_lingering_connection_before_any_other(capped: Proxy) -> None:
    """A connection answered already (a 431, its client still holding it open while the proxy
    lingers) goes before the older connections that have not sent a head yet."""
    port = port_of(capped.url)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
    answered = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        answered.sendall(request("GET", "/healthz", headers=[("x-big", "a" * 70_000)]))
        (refused,) = parse(read_all(answered, 5).data, ["GET"])  # up to our FIN: lingering
        assert refused.status == 431
        assert wait_until(lambda: capped.metric("proxy_client_connections") == 6, 5)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as newcomer:
            assert _healthz(newcomer) == 200
        assert capped.metric("proxy_http_limits_total", kind="headless_shed") == 0
        for sock in silent:  # none of them closed
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
        assert _reset(answered)  # the lingering one was closed: a reset for what follows
    finally:
        for sock in [*silent, answered]:
            sock.close()


def _reset(sock: socket.socket) -> bool:
    """Whether the peer has closed `sock` for good: a send fails within half a second."""
    try:
        for _ in range(50):
            sock.sendall(b"x" * 1024)
            time.sleep(0.01)
    except OSError:
        return True
    return False


def test_the_cap_refuses_with_503_when_every_connection_has_a_request_in_flight(
    capped: Proxy,
) -> None:
    port = port_of(capped.url)
    busy = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(6)]
    try:
        payload = orjson.dumps(body("x" * 500))
        for sock in busy:  # a head in, its body under way: a request in flight
            sock.sendall(request("POST", "/v1/responses", payload)[: -len(payload)] + b"{")
        assert wait_until(lambda: capped.metric("proxy_client_connections") == 6, 5)
        time.sleep(0.2)
        read = exchange(port, request("GET", "/healthz"), timeout=5)
        (answer,) = read.answers
        assert_error(answer, 503, "too_many_connections")
        assert answer.headers["retry-after"] == "1"
        assert read.closed
        assert capped.metric("proxy_http_limits_total", kind="connection_refused") == 1
        # The bodies run out of time; then a client gets in.
        for sock in busy:
            (late,) = parse(read_all(sock, 5).data, ["POST"])
            assert late.status == 408
        assert wait_until(lambda: capped.metric("proxy_client_connections") == 0, 5)
        (served,) = exchange(port, request("GET", "/healthz"), timeout=5).answers
        assert served.status == 200
    finally:
        for sock in busy:
            sock.close()
