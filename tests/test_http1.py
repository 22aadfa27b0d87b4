"""The sans-IO HTTP/1.1 response reader and request writer (proxy/upstream/http1.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.upstream.http1 import MAX_HEAD_BYTES, ProtocolError, ResponseReader, request_bytes

SSE = b'data: {"choices":[]}\n\n'
CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"%x\r\n%s\r\n" % (len(SSE), SSE)
    + b"5;name=value\r\nhello\r\n"
    + b"0\r\nx-trailer: 1\r\n\r\n"
)


def read_all(reader: ResponseReader, pieces: list[bytes]) -> bytes:
    return b"".join(reader.feed(piece) for piece in pieces)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_chunked_body_at_any_split(cuts: list[int]) -> None:
    reader = ResponseReader()
    assert read_all(reader, split(CHUNKED, cuts)) == SSE + b"hello"
    assert reader.head is not None
    assert reader.head.status == 200
    assert reader.head.get("content-type") == "text/event-stream"
    assert reader.done
    assert reader.reusable


@given(st.lists(st.integers(min_value=0), max_size=8))
def test_content_length_body_at_any_split(cuts: list[int]) -> None:
    raw = b'HTTP/1.1 429 Too Many\r\nContent-Length: 11\r\n\r\n{"e": "no"}'
    reader = ResponseReader()
    assert read_all(reader, split(raw, cuts)) == b'{"e": "no"}'
    assert reader.head is not None
    assert reader.head.status == 429
    assert reader.reusable


def test_byte_by_byte_chunked() -> None:
    reader = ResponseReader()
    assert read_all(reader, [CHUNKED[i : i + 1] for i in range(len(CHUNKED))]) == SSE + b"hello"
    assert reader.reusable


def test_interim_responses_are_skipped() -> None:
    reader = ResponseReader()
    body = reader.feed(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nlink: x\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    )
    assert body == b"ok"
    assert reader.head is not None
    assert reader.head.status == 200


def test_read_until_close() -> None:
    reader = ResponseReader()
    assert reader.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\nab") == b"ab"
    assert reader.feed(b"cd") == b"cd"
    assert not reader.done
    reader.end_of_input()
    assert reader.done
    assert not reader.reusable  # the connection is gone with the body


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n",
        # both framings: chunked wins, and the connection must not be reused (RFC 9112 §6.3)
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
)
def test_responses_that_end_the_connection(head: bytes) -> None:
    reader = ResponseReader()
    reader.feed(head)
    assert reader.done
    assert not reader.reusable


def test_bytes_after_the_response_make_it_not_reusable() -> None:
    reader = ResponseReader()
    assert reader.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA") == b"ok"
    assert reader.done
    assert not reader.reusable
    other = ResponseReader()
    other.feed(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert other.reusable
    other.feed(b"x")
    assert not other.reusable


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nx-evil: a\nevent: response.completed\r\n\r\n",  # bare LF
        b"HTTP/1.1 200 OK\r\nx-evil: a\revent: x\r\n\r\n",  # bare CR
        b"HTTP/1.1 200 OK\r\nx-evil:\x00data\r\n\r\n",  # NUL
        b"HTTP/1.1 200 OK\r\nx-a: 1\r\n\tfolded: continuation\r\n\r\n",  # obs-fold
        b"HTTP/1.1 200 OK\r\n folded: continuation\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad name: 1\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 101 Switching\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nokX\r\n",
    ],
)
def test_malformed_responses_are_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        ResponseReader().feed(raw)


def test_limits() -> None:
    with pytest.raises(ProtocolError, match="head larger"):
        ResponseReader().feed(b"HTTP/1.1 200 OK\r\nx: " + b"a" * MAX_HEAD_BYTES)
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    with pytest.raises(ProtocolError, match="too long"):
        reader.feed(b"1" * 5000)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ],
)
def test_end_of_input_before_the_end_is_an_error(raw: bytes) -> None:
    reader = ResponseReader()
    reader.feed(raw)
    with pytest.raises(ProtocolError, match="connection closed"):
        reader.end_of_input()


def test_request_bytes() -> None:
    raw = request_bytes(
        b"POST",
        b"/v1/completions",
        [(b"host", b"h:1"), (b"x-cafe", "café".encode("latin-1"))],
        b"{}",
    )
    assert raw == (
        b"POST /v1/completions HTTP/1.1\r\nhost: h:1\r\nx-cafe: caf\xe9\r\n"
        b"content-length: 2\r\n\r\n{}"
    )


@pytest.mark.parametrize(
    "header",
    [(b"x-a", b"1\r\nx-injected: 2"), (b"x-a", b"\x00"), (b"bad name", b"1"), (b"", b"1")],
)
def test_request_headers_that_would_split_the_request_are_refused(
    header: tuple[bytes, bytes],
) -> None:
    with pytest.raises(ProtocolError, match="cannot send header"):
        request_bytes(b"POST", b"/", [header], b"")
