"""The sans-IO HTTP/1.1 response reader (llhttp) and request writer (proxy/upstream/http1.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.upstream.http1 import (
    LAST_CHUNK,
    MAX_HEAD_BYTES,
    ProtocolError,
    ResponseReader,
    chunk,
    request_bytes,
    request_head,
)

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
        b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n",
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
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nabc",  # llhttp: read until close
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
        # both framings: a smuggling signature (RFC 9112 §6.3 "ought to be handled as an error")
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999999\r\n\r\n",
        # status codes outside 100-599 (llhttp takes any three digits)
        b"HTTP/1.1 600 Odd\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 999 Odd\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 099 Odd\r\ncontent-length: 0\r\n\r\n",
        # a 204 that announces a body
        b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        # bare LF in chunk framing, a space before the chunk size's CRLF
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
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
    with pytest.raises(ProtocolError, match="overflow"):
        reader.feed(b"1" * 5000)


def head_of(size: int, body: bytes = b"") -> bytes:
    """A complete response head of exactly `size` bytes, then `body`."""
    start = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nx-pad: " % len(body)
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n" + body


@given(st.lists(st.integers(min_value=0), max_size=6))
def test_a_head_over_the_limit_is_refused_whole_or_in_pieces(cuts: list[int]) -> None:
    """llhttp has no head limit: a complete 70 KB head fed in one read got through once."""
    with pytest.raises(ProtocolError, match=f"head larger than {MAX_HEAD_BYTES} bytes"):
        read_all(ResponseReader(), split(head_of(70_000, b"ok"), cuts))
    at_limit = ResponseReader()
    assert read_all(at_limit, split(head_of(MAX_HEAD_BYTES, b"ok"), cuts)) == b"ok"
    assert at_limit.reusable
    with pytest.raises(ProtocolError, match="head larger"):
        read_all(ResponseReader(), split(head_of(MAX_HEAD_BYTES + 1, b"ok"), cuts))


def test_interim_heads_count_towards_the_limit() -> None:
    interim = b"HTTP/1.1 103 Early\r\nlink: " + b"a" * 40_000 + b"\r\n\r\n"
    with pytest.raises(ProtocolError, match="head larger"):
        ResponseReader().feed(interim + head_of(30_000))


@pytest.mark.parametrize(
    ("raw", "body"),
    [
        # a response smuggled after ours: never parsed as anything, never reused
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"
            b"content-length: 4\r\n\r\nevil",
            b"ok",
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nevil", b""),
        (b"HTTP/1.1 204 No Content\r\n\r\nhello", b""),
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nokEXTRA", b"ok"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nx", b"ok"),
    ],
    ids=["smuggled", "204_smuggled", "204_body", "after_close", "after_chunked"],
)
def test_bytes_after_the_end_are_trailing_never_a_response(raw: bytes, body: bytes) -> None:
    for pieces in ([raw], [raw[i : i + 1] for i in range(len(raw))]):
        reader = ResponseReader()
        assert read_all(reader, pieces) == body
        assert reader.done
        assert reader.trailing
        assert not reader.reusable


def test_the_answer_to_a_head_request_has_no_body() -> None:
    reader = ResponseReader(head_request=True)
    assert reader.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n") == b""
    assert reader.done
    assert reader.reusable
    sent_anyway = ResponseReader(head_request=True)
    assert sent_anyway.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello") == b""
    assert sent_anyway.trailing
    assert not sent_anyway.reusable


def test_a_304_with_a_length_has_no_body() -> None:
    reader = ResponseReader()
    assert reader.feed(b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n") == b""
    assert reader.head is not None
    assert reader.head.status == 304
    assert reader.reusable


def test_header_values_and_names() -> None:
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\nX-Cafe:  caf\xe9 \t\r\nContent-Length: 0\r\n\r\n")
    assert reader.head is not None
    assert reader.head.headers == (("x-cafe", "café"), ("content-length", "0"))


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


def test_request_heads_for_each_kind_of_body() -> None:
    assert request_head(b"GET", b"/v1/models", [(b"host", b"h")], 0) == (
        b"GET /v1/models HTTP/1.1\r\nhost: h\r\n\r\n"
    )
    assert request_head(b"POST", b"/x", [], 0) == b"POST /x HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
    assert request_head(b"POST", b"/x", [], None) == (
        b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    assert chunk(b"hello") + LAST_CHUNK == b"5\r\nhello\r\n0\r\n\r\n"


@pytest.mark.parametrize(
    "header",
    [(b"x-a", b"1\r\nx-injected: 2"), (b"x-a", b"\x00"), (b"bad name", b"1"), (b"", b"1")],
)
def test_request_headers_that_would_split_the_request_are_refused(
    header: tuple[bytes, bytes],
) -> None:
    with pytest.raises(ProtocolError, match="cannot send header"):
        request_bytes(b"POST", b"/", [header], b"")
