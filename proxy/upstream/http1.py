"""HTTP/1.1 for the client side of one exchange, without I/O (RFC 9112): requests are written
here, responses are read by llhttp (through `httptools`, the parser uvicorn serves us with).

Theory of operation. `request_head` writes a request head for a body of known length (or a
chunked one: `chunk`, `LAST_CHUNK`); `request_bytes` a whole request. `ResponseReader` takes
whatever the socket gave, in any pieces, and turns it into a response head and the bytes of its
body:

    HEAD ──head complete──▶ BODY ──body complete──▶ DONE ──any byte──▶ DONE, `trailing`
     │ 1xx: skip it, HEAD again   │ EOF (read-until-close body): DONE
     ▼                            ▼
    ProtocolError              ProtocolError (EOF inside a chunk or before Content-Length)

`feed(data)` returns the body bytes that `data` completed (b"" when none) and sets `head` as soon
as the head is complete; `end_of_input()` reports that the peer closed. Body framing is chunked
transfer coding, a Content-Length, or "read until close" (neither given); a 204, a 304 and the
answer to a HEAD request have none. `reusable` says whether the connection may carry another
request: the body was read to its end, no bytes followed it, and neither side asked to close.
Bytes after the end are never parsed as anything (`trailing`): they are what a response
smuggled into the next one would look like.

Why llhttp (a home-made HTTP parser is where smuggling bugs live): it is the parser
of Node.js, fuzzed and maintained; in its default strict mode it refuses bare CR or LF, obs-fold,
control characters in values, invalid names, `Transfer-Encoding` together with
`Content-Length`, duplicate or signed lengths, and bad chunk framing. What it allows and we do
not, checked here: a status outside 100-599, a transfer coding other than `chunked` alone (we
could not undo one), a 204 that announces a body, 101 (nobody asked to switch), and a head over
`MAX_HEAD_BYTES` (llhttp has no limit). Its cost per frame is measured against the hand parser
it replaced in bench/http_parser.py (its figures: BENCHMARKS.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httptools

#: Largest response head accepted, interim (1xx) heads included (trtllm-serve sends ~150 bytes).
MAX_HEAD_BYTES = 64 * 1024
#: The end of a chunked request body.
LAST_CHUNK = b"0\r\n\r\n"

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# field-value: visible characters, obs-text, spaces and tabs; never CR, LF, NUL or other CTLs.
_VALUE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")
#: Methods whose requests carry content: an empty body still says `content-length: 0`.
_CONTENT_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})


class ProtocolError(Exception):
    """The bytes are not an HTTP/1.1 response we can read exactly (or a request we could
    write safely); the message says what was wrong."""


@dataclass(frozen=True, slots=True)
class Head:
    """A response head: status, and header names (lower case) with values (Latin-1)."""

    status: int
    headers: tuple[tuple[str, str], ...]

    def get(self, name: str, default: str = "") -> str:
        """The first value of `name` (lower case), or `default`."""
        for key, value in self.headers:
            if key == name:
                return value
        return default


def request_head(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], length: int | None
) -> bytes:
    """A request head for a body of `length` bytes, or a chunked body (`length` None).
    `headers` must not hold Content-Length or Transfer-Encoding (hop-by-hop ones are dropped by
    the caller)."""
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        # A CR or LF here would let a header value end the head early (request splitting).
        if _TOKEN.fullmatch(name) is None or _VALUE.fullmatch(value) is None:
            raise ProtocolError(f"cannot send header {name!r}: invalid name or value")
        parts += (name, b": ", value, b"\r\n")
    if length is None:
        parts.append(b"transfer-encoding: chunked\r\n")
    elif length or method in _CONTENT_METHODS:  # RFC 9110 §8.6: no length for a GET's nothing
        parts += (b"content-length: ", b"%d" % length, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def request_bytes(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """A whole request with a body of known length, ready to write."""
    return request_head(method, target, headers, len(body)) + body


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked request body (`data` must not be empty: that is `LAST_CHUNK`)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


_HEAD, _BODY, _DONE = "HEAD", "BODY", "DONE"


class ResponseReader:
    """Incremental reader of one response (see the module docstring). `head_request`: the
    request was a HEAD, so the response has no body whatever its head says."""

    __slots__ = (
        "_budget",
        "_chunks",
        "_closing",
        "_head_request",
        "_headers",
        "_parser",
        "_trailing",
        "_until_close",
        "head",
        "state",
    )

    def __init__(self, *, head_request: bool = False) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.head: Head | None = None
        self.state = _HEAD
        self._head_request = head_request
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._budget = MAX_HEAD_BYTES  # head bytes still allowed
        self._until_close = False
        self._closing = False  # `Connection: close`, HTTP/1.0, or a body read until close
        self._trailing = False  # bytes arrived after the end of the response

    @property
    def done(self) -> bool:
        return self.state is _DONE

    @property
    def trailing(self) -> bool:
        """Bytes arrived after the end of the response (upstream is broken, or smuggling)."""
        return self._trailing

    @property
    def reusable(self) -> bool:
        """The connection may carry another request (response read to its end, cleanly)."""
        return self.state is _DONE and not self._closing and not self._trailing

    def feed(self, data: bytes) -> bytes:
        """Take bytes from the wire; return the body bytes completed by them."""
        if self.state is _HEAD:
            # llhttp has no head limit: give it at most what is left of ours, so a whole
            # oversized head in one read is refused too (fed whole, 70 KB got through).
            budget = self._budget
            head, data = (data, b"") if len(data) <= budget else (data[:budget], data[budget:])
            self._budget -= len(head)
            self._execute(head)
            if self.state is _HEAD and not self._budget:
                raise ProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
        if data:
            if self.state is _DONE:
                self._trailing = True
            else:
                self._execute(data)
        chunks = self._chunks
        if not chunks:
            return b""
        self._chunks = []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def end_of_input(self) -> None:
        """The peer closed the connection: the end of a read-until-close body, else an error."""
        if self.state is _BODY and self._until_close:
            self.state = _DONE
            return
        if self.state is _HEAD:
            raise ProtocolError("connection closed before a complete response head")
        if self.state is _BODY:
            raise ProtocolError("connection closed before the end of the response body")

    def _execute(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            raise cause if isinstance(cause, ProtocolError) else ProtocolError(str(exc)) from None
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.state is not _DONE:
                raise ProtocolError(str(exc)) from None
            # Garbage after a complete response: the response stands, the connection does not.
            self._trailing = True

    # -- llhttp's callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.state is _DONE:  # a second response after ours ended (CR/LF are skipped)
            self._trailing = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.state is _HEAD:  # not trailers, nor a second response's
            self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.state is not _HEAD:
            return
        raw, self._headers = self._headers, []
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError("upstream switched protocols")
            return  # an interim response (100 Continue, 103 Early Hints): the real one follows
        if not 200 <= status <= 599:
            raise ProtocolError(f"invalid status code {status}")
        headers = tuple(
            (name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t"))
            for name, value in raw
        )
        head = Head(status, headers)
        codings = [
            coding.strip().lower()
            for value in _values(head, "transfer-encoding")
            for coding in value.split(",")
        ]
        if codings and codings != ["chunked"]:
            raise ProtocolError(f"unsupported transfer coding {', '.join(codings)[:100]!r}")
        length = head.get("content-length")
        if status == 204 and (codings or length not in ("", "0")):
            raise ProtocolError("a 204 (No Content) response that announces a body")
        self.head = head
        self.state = _BODY
        self._closing = (
            not self._parser.should_keep_alive() or self._parser.get_http_version() != "1.1"
        )
        bodyless = self._head_request or status in (204, 304)
        if bodyless:
            self.state = _DONE
        elif not codings and not length:
            self._until_close = self._closing = True

    def on_body(self, body: bytes) -> None:
        if self.state is _BODY:
            self._chunks.append(body)
        else:  # the body of a HEAD answer or of a second response
            self._trailing = True

    def on_message_complete(self) -> None:
        if self.state is _BODY:
            self.state = _DONE


def _values(head: Head, name: str) -> list[str]:
    return [value for key, value in head.headers if key == name]
