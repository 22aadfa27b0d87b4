"""Refusals reach a client that is still sending, on real loopback sockets.

A server that answers early (a body over `max_body_bytes`, a head over `max_header_bytes`) and
then closes a socket with unread input makes the kernel send a reset: the client's writes fail,
and a client that reads only once it has sent everything — Python's http.client, urllib3, a
raw socket as here — never gets to read the answer (a reset can also overtake the answer on a
real network). The proxy closes lingering (proxy/server/http/closing.py): its FIN after the
answer, then what the client still sends read and dropped, within bounds of bytes and time.

Each test sends its whole request first, as such a client does, and only then reads: the send
must not fail, and the answer must be the status with its JSON error.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.server.http.closing import LINGER_BYTES, LINGER_IDLE, LINGER_SECONDS
from tests.live import LiveServer
from tests.rawhttp import Answer, parse, port_of, read_all
from tests.reliability import MODEL, Proxy, running_proxy, wait_until
from tests.upstream_double import UpstreamDouble

LIMIT = 16 * 1024 * 1024  # max_body_bytes' default
OVER = 20_000_000  # a body over it
LINE = 8_000_000  # an 8 MB header line


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[UpstreamDouble, str]]:
    double = UpstreamDouble()
    with LiveServer(double) as server:
        yield double, server.url


@pytest.fixture(scope="module")
def proxy(upstream: tuple[UpstreamDouble, str], encoding: HarmonyEncoding) -> Iterator[Proxy]:
    with running_proxy(upstream[1], encoding) as running:
        yield running


def send_then_read(port: int, head: bytes, body: bytes = b"", *, piece: int = 65536) -> Answer:
    """Write the whole request, then read: what a client that reads only afterwards gets."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head)  # raises if the proxy reset the connection
        for start in range(0, len(body), piece):
            sock.sendall(body[start : start + piece])
        read = read_all(sock, 20)
    (answer,) = parse(read.data, ["POST" if head.startswith(b"POST") else "GET"])
    assert read.closed  # the proxy closes once it answered a request it did not read
    return answer


def assert_error(answer: Answer, status: int, code: str) -> None:
    assert answer.complete, answer
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["code"] == code, answer.json()


def post_head(path: str, length: int | None, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: proxy.test", "content-type: application/json"]
    lines.append(
        f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    )
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


def big_body() -> bytes:
    return orjson.dumps({"model": MODEL, "input": "x" * OVER, "stream": True})


# -- a head over max_header_bytes: 431 -----------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_an_8_mb_header_line_gets_its_431(proxy: Proxy, method: str) -> None:
    path = "/v1/models" if method == "GET" else "/v1/responses"
    head = f"{method} {path} HTTP/1.1\r\nhost: proxy.test\r\nx-big: ".encode()
    head += b"a" * LINE + b"\r\n\r\n"
    answer = send_then_read(port_of(proxy.url), head)
    assert_error(answer, 431, "request_header_fields_too_large")
    assert not proxy.logs.problems()


def test_http_client_reads_the_431_of_its_8_mb_header(proxy: Proxy) -> None:
    """Python's http.client writes the whole request before it reads anything."""
    conn = http.client.HTTPConnection("127.0.0.1", port_of(proxy.url), timeout=20)
    try:
        conn.request("GET", "/v1/models", headers={"x-big": "a" * LINE})
        answer = conn.getresponse()
        assert answer.status == 431
        assert orjson.loads(answer.read())["error"]["code"] == "request_header_fields_too_large"
    finally:
        conn.close()


# -- a body over max_body_bytes: 413 -------------------------------------------------------------


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
@pytest.mark.parametrize("route", ["/v1/responses", "/v1/echo"], ids=["repaired", "passthrough"])
def test_a_body_over_the_limit_gets_its_413(
    proxy: Proxy, upstream: tuple[UpstreamDouble, str], route: str, close: bool
) -> None:
    payload = big_body()
    extra = ("connection: close",) if close else ()
    answer = send_then_read(port_of(proxy.url), post_head(route, len(payload), *extra), payload)
    assert_error(answer, 413, "request_too_large")
    assert all(len(seen.body) <= LIMIT for seen in upstream[0].seen if seen.path == route)
    assert not proxy.logs.problems()


def test_a_chunked_body_over_the_limit_gets_its_413(proxy: Proxy) -> None:
    payload = big_body()
    piece = 1 << 20
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(payload[i : i + piece]), payload[i : i + piece])
        for i in range(0, len(payload), piece)
    )
    head = post_head("/v1/responses", None, "connection: close")
    answer = send_then_read(port_of(proxy.url), head, chunks + b"0\r\n\r\n")
    assert_error(answer, 413, "request_too_large")


def test_clients_that_read_afterwards_get_the_413(proxy: Proxy) -> None:
    """httpx (reads after a failed write) and http.client (does not), with `Connection: close`
    (after which the proxy used to close at once) and without."""
    payload = big_body()
    for close in (False, True):
        headers = {"content-type": "application/json"} | ({"connection": "close"} if close else {})
        answer = httpx.post(
            proxy.url + "/v1/responses", content=payload, headers=headers, timeout=30
        )
        assert answer.status_code == 413, answer.text[:200]
        assert answer.json()["error"]["code"] == "request_too_large"
        conn = http.client.HTTPConnection("127.0.0.1", port_of(proxy.url), timeout=20)
        try:
            conn.request("POST", "/v1/responses", body=payload, headers=headers)
            reply = conn.getresponse()
            assert reply.status == 413
            assert orjson.loads(reply.read())["error"]["code"] == "request_too_large"
        finally:
            conn.close()


def test_the_client_that_sent_too_much_is_served_next(proxy: Proxy) -> None:
    with httpx.Client(timeout=30) as client:
        answer = client.post(proxy.url + "/v1/responses", content=big_body())
        assert answer.status_code == 413
        assert client.get(proxy.url + "/healthz").status_code == 200


# -- the bounds --------------------------------------------------------------------------------


def flood(sock: socket.socket, most: int, seconds: float) -> tuple[int, bool]:
    """Send as fast as loopback goes, up to `most` bytes or `seconds`: (bytes sent, whether
    a send failed)."""
    piece = b"x" * 65536
    sent = 0
    started = time.monotonic()
    try:
        while sent < most and time.monotonic() - started < seconds:
            sock.sendall(piece)
            sent += len(piece)
    except OSError:
        return sent, True
    return sent, False


def test_lingering_reads_a_bounded_number_of_bytes(proxy: Proxy) -> None:
    """Content-Length 10 GB, sent as fast as loopback goes: the proxy answers 413 at once,
    drops what follows, and closes (a reset now) after about LINGER_BYTES."""
    with socket.create_connection(("127.0.0.1", port_of(proxy.url)), timeout=20) as sock:
        sock.sendall(post_head("/v1/responses", 10_000_000_000))
        sent, refused = flood(sock, 4 * LINGER_BYTES, LINGER_SECONDS)
    assert refused, sent
    # What the proxy read and dropped, plus the two kernels' socket buffers.
    assert LINGER_BYTES <= sent < LINGER_BYTES + 32 * 1024 * 1024, sent


def test_lingering_ends_when_the_client_stops_sending(proxy: Proxy) -> None:
    """A client that read the answer but keeps its end open: closed LINGER_IDLE after its
    last byte; one that trickles on: closed at LINGER_SECONDS."""
    port = port_of(proxy.url)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(post_head("/v1/responses", LIMIT + 1) + b"{}")
        started = time.monotonic()
        read = read_all(sock, LINGER_SECONDS + 5)
        assert read.closed  # our FIN at once, after the 413
        (answer,) = parse(read.data, ["POST"])
        assert answer.status == 413
        # The proxy's side lingers for LINGER_IDLE without a byte from us, then closes.
        assert wait_until(lambda: proxy.metric("proxy_client_connections") == 0, 5)
        assert time.monotonic() - started < LINGER_IDLE + 2
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(post_head("/v1/responses", LIMIT + 1))
        started = time.monotonic()
        try:
            while time.monotonic() - started < LINGER_SECONDS + 5:
                sock.sendall(b"x")
                time.sleep(LINGER_IDLE / 4)
        except OSError:
            pass  # the proxy closed: a reset for our next byte
        elapsed = time.monotonic() - started
    assert LINGER_SECONDS - 0.5 < elapsed < LINGER_SECONDS + 2, elapsed


# -- a request llhttp rejects: a JSON 400, then the lingering close -------------------------------

MALFORMED = {
    "request_line": b"GET /v1/models HTTP/1.1 extra\r\nhost: proxy.test\r\n\r\n",
    "method": b"G\x01T /v1/models HTTP/1.1\r\nhost: proxy.test\r\n\r\n",
    "header_name": b"GET /v1/models HTTP/1.1\r\nhost: proxy.test\r\nbad header: x\r\n\r\n",
    "header_value": b"GET /v1/models HTTP/1.1\r\nhost: proxy.test\r\nx-a: b\x00c\r\n\r\n",
    "chunk_size": post_head("/v1/responses", None) + b"zz\r\n{}\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=list(MALFORMED))
def test_a_malformed_request_gets_a_json_400(
    proxy: Proxy, upstream: tuple[UpstreamDouble, str], data: bytes
) -> None:
    """Never uvicorn's plain-text 400, and never a reset for a client still sending: what
    follows the bad bytes (here 4 MB of them) is read and dropped before the close."""
    double, _ = upstream

    def asked() -> int:
        return sum(1 for seen in double.seen if seen.path in ("/v1/models", "/v1/responses"))

    before = asked()
    answer = send_then_read(port_of(proxy.url), data, b"x" * 4_000_000)
    assert_error(answer, 400, "bad_request")
    assert answer.headers["connection"] == "close"
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert asked() == before  # nothing reached upstream
    assert not proxy.logs.problems()


def test_a_malformed_request_behind_a_good_one_is_answered_after_it(proxy: Proxy) -> None:
    good = b"GET /healthz HTTP/1.1\r\nhost: proxy.test\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port_of(proxy.url)), timeout=20) as sock:
        sock.sendall(good + MALFORMED["request_line"])
        read = read_all(sock, 20)
    first, second = parse(read.data, ["GET", "GET"])
    assert first.status == 200
    assert first.json() == {"status": "ok"}
    assert_error(second, 400, "bad_request")
    assert read.closed
