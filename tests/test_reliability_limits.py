"""HTTP server limits on real loopback sockets: oversized heads and too many
headers (431, nothing forwarded), slow heads (408 / close), body pauses and slow bodies (408),
and keep-alive idle (the connection cap: tests/test_reliability_cap.py). Clients are raw sockets;
answers are parsed with h11 (tests/rawhttp.py).
"""

from __future__ import annotations

import socket
import threading
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


@pytest.fixture(scope="module")
def defaults(upstream: tuple[UpstreamDouble, str], encoding: HarmonyEncoding) -> Iterator[Proxy]:
    """The proxy at its default limits (64 KiB heads, 100 header lines)."""
    with running_proxy(upstream[1], encoding) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def quick(upstream: tuple[UpstreamDouble, str], encoding: HarmonyEncoding) -> Iterator[Proxy]:
    """Short timeouts: heads 1 s, body pauses 1 s (then 1000 B/s), keep-alive 1 s."""
    with running_proxy(
        upstream[1],
        encoding,
        header_timeout=1.0,
        body_timeout=1.0,
        body_min_rate=1000,
        keepalive_timeout=1.0,
    ) as proxy:
        yield proxy


def limit_count(proxy: Proxy, kind: str) -> float:
    return proxy.metric("proxy_http_limits_total", kind=kind)


def send_while_reading(port: int, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Write `data` (however much the server still takes) while reading its answer: a server
    that answers early must not lose its answer to our still-sending."""
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:

        def read() -> None:
            received.extend(read_all(sock, timeout).data)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            for start in range(0, len(data), 16384):
                sock.sendall(data[start : start + 16384])
        except OSError:
            pass  # the server closed after answering: what we still had to say is moot
        reader.join(timeout + 5)
    return bytes(received)


# -- head size and header count: 431, nothing forwarded ------------------------------------------


@pytest.mark.parametrize(
    ("name", "headers", "target"),
    [
        ("70 KB header", [("x-big", "a" * 70_000)], "/guard-big"),
        ("1 MB header", [("x-big", "a" * 1_000_000)], "/guard-huge"),
        ("70 KB target", [], "/guard-target?" + "q" * 70_000),
        ("101 headers", [(f"x-h{n}", "v") for n in range(101)], "/guard-many"),
        ("20,000 headers", [(f"x-h{n}", "v") for n in range(20_000)], "/guard-flood"),
    ],
)
def test_oversized_heads_get_431_and_nothing_reaches_upstream(
    defaults: Proxy,
    upstream: tuple[UpstreamDouble, str],
    name: str,
    headers: list[tuple[str, str]],
    target: str,
) -> None:
    double = upstream[0]
    # 20,000 header lines are also 240 KB: the size bound may trip before the count.
    kinds = {"101 headers": ("too_many_headers",)}.get(name, ("head_too_large",))
    if name == "20,000 headers":
        kinds = ("too_many_headers", "head_too_large")
    before = sum(limit_count(defaults, kind) for kind in kinds)
    for method, payload in (("GET", b""), ("POST", orjson.dumps(body()))):
        query = target.partition("?")[2]
        path = target if method == "GET" else "/v1/responses" + ("?" + query if query else "")
        completions = len(double.completions())
        data = send_while_reading(port_of(defaults.url), request(method, path, payload, headers))
        (answer,) = parse(data, [method])
        assert_error(answer, 431, "request_header_fields_too_large")
        assert not any(seen.path == target.split("?")[0] for seen in double.seen), name
        assert len(double.completions()) == completions
    assert sum(limit_count(defaults, kind) for kind in kinds) == before + 2
    assert not defaults.logs.problems()


def test_heads_at_the_limits_pass(defaults: Proxy, upstream: tuple[UpstreamDouble, str]) -> None:
    headers = [(f"x-h{n}", "v") for n in range(98)] + [("x-big", "b" * 60_000)]
    read = exchange(port_of(defaults.url), request("GET", "/guard-fits", headers=headers))
    (answer,) = read.answers
    assert answer.status == 200, answer
    echoed = answer.json()["headers"]
    assert echoed["x-h97"] == "v"
    assert len(echoed["x-big"]) == 60_000


def test_a_head_trickled_past_the_limit_is_refused(defaults: Proxy) -> None:
    """The parser holds an unfinished header line itself: the bytes of an incomplete head are
    what bound it, not the header callbacks (a 1 MB value that never ends)."""
    port = port_of(defaults.url)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /guard-trickle HTTP/1.1\r\nhost: x\r\nx-endless: ")
        try:
            for _ in range(20):
                sock.sendall(b"z" * 8192)
        except OSError:
            pass
        read = read_all(sock, 10)
    (answer,) = parse(read.data, ["GET"])
    assert_error(answer, 431, "request_header_fields_too_large")
    assert read.closed


# -- slow heads and bodies: 408 ------------------------------------------------------------------


def test_a_head_too_slow_gets_408(quick: Proxy, upstream: tuple[UpstreamDouble, str]) -> None:
    before = limit_count(quick, "head_timeout")
    port = port_of(quick.url)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        for byte in b"GET /guard-slow HTTP/1.1\r\nhost: x\r\n":
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)  # a byte every 0.1 s: alive, never done within the 1 s allowed
        read = read_all(sock, 5)
    (answer,) = parse(read.data, ["GET"])
    assert_error(answer, 408, "request_timeout")
    assert read.closed
    assert time.monotonic() - started < 4.5
    assert limit_count(quick, "head_timeout") == before + 1
    assert not any(seen.path == "/guard-slow" for seen in upstream[0].seen)


def test_a_connection_that_sends_nothing_is_closed(quick: Proxy) -> None:
    before = limit_count(quick, "head_timeout")
    with socket.create_connection(("127.0.0.1", port_of(quick.url)), timeout=10) as sock:
        read = read_all(sock, 5)
    assert read.closed
    assert read.data == b""  # nobody to answer
    assert limit_count(quick, "head_timeout") == before + 1


@pytest.mark.parametrize("route", ["/v1/responses", "/guard-body"])
def test_a_body_that_stops_gets_408(
    quick: Proxy, upstream: tuple[UpstreamDouble, str], route: str
) -> None:
    """Repaired route (the app reads the body) and pass-through (the body streams upstream)."""
    double = upstream[0]
    payload = orjson.dumps(body("x" * 500))
    head = request("POST", route, payload)[: -len(payload)]
    completions = len(double.completions())
    before = limit_count(quick, "body_timeout")
    with socket.create_connection(("127.0.0.1", port_of(quick.url)), timeout=10) as sock:
        sock.sendall(head + payload[:100])
        read = read_all(sock, 6)
    (answer,) = parse(read.data, ["POST"])
    assert_error(answer, 408, "request_timeout")
    assert "no data for 1 s" in answer.json()["error"]["message"]
    assert read.closed
    assert limit_count(quick, "body_timeout") == before + 1
    assert len(double.completions()) == completions
    # Pass-through streams a body upstream as it arrives: upstream may have seen its start,
    # never a whole request (the proxy's upstream request was aborted with the client's).
    assert all(len(seen.body) < len(payload) for seen in double.seen if seen.path == route)
    assert wait_until(lambda: quick.in_flight() == 0, 5)
    assert not quick.logs.problems()


def test_a_body_below_the_minimum_rate_gets_408(quick: Proxy) -> None:
    """Never a pause as long as body_timeout, but 200 B/s where 1000 B/s are asked for."""
    payload = orjson.dumps(body("y" * 3000))
    head = request("POST", "/v1/responses", payload)[: -len(payload)]
    with socket.create_connection(("127.0.0.1", port_of(quick.url)), timeout=10) as sock:
        sock.sendall(head)
        try:
            for start in range(0, len(payload), 40):
                sock.sendall(payload[start : start + 40])
                time.sleep(0.2)
        except OSError:
            pass
        read = read_all(sock, 5)
    (answer,) = parse(read.data, ["POST"])
    assert_error(answer, 408, "request_timeout")
    assert "slower than 1000 bytes/s" in answer.json()["error"]["message"]


def test_a_slow_but_steady_body_is_served(quick: Proxy) -> None:
    """Pauses under body_timeout; ~2000 B/s on average, above body_min_rate (Apache's
    mod_reqtimeout rule: the deadline is body_timeout + bytes received / body_min_rate)."""
    payload = orjson.dumps(body("z" * 2900))
    head = request("POST", "/v1/responses", payload)[: -len(payload)]
    third = len(payload) // 3 + 1
    with socket.create_connection(("127.0.0.1", port_of(quick.url)), timeout=10) as sock:
        sock.sendall(head)
        for start in range(0, len(payload), third):
            time.sleep(0.5)
            sock.sendall(payload[start : start + third])
        read = read_all(sock, 3)
    (answer,) = parse(read.data, ["POST"])
    assert answer.status == 200, answer
    assert answer.events()[-1]["type"] == "response.completed"


def test_keep_alive_connections_close_when_idle(quick: Proxy) -> None:
    with socket.create_connection(("127.0.0.1", port_of(quick.url)), timeout=10) as sock:
        sock.sendall(request("GET", "/healthz"))
        started = time.monotonic()
        read = read_all(sock, 5)
    (answer,) = parse(read.data, ["GET"])
    assert answer.status == 200
    assert "connection" not in answer.headers  # kept alive...
    assert read.closed  # ...until keepalive_timeout, closed without a word
    assert 0.8 < time.monotonic() - started < 4.5
