"""HTTP/1.1 for the client side of one streamed exchange, without I/O (RFC 9112).

Theory of operation. `request_bytes` writes a request head (and a body of known length) as one
bytes object. `ResponseReader` takes whatever the socket gave, in any pieces, and turns it into
a response head and the bytes of its body:

    HEAD ──head complete──▶ BODY ──body complete──▶ DONE
     │ 1xx: skip it, HEAD again   │ EOF (read-until-close body): DONE
     ▼                            ▼
    ProtocolError              ProtocolError (EOF inside a chunk or before Content-Length)

`feed(data)` returns the body bytes that `data` completed (b"" when none) and sets `head` as soon
as the head is complete; `end_of_input()` reports that the peer closed. Body framing is chunked
transfer coding, a Content-Length, or "read until close" (neither given). `reusable` says whether
the connection may carry another request: the body was read to its end, no bytes followed it,
and neither side asked to close.

Why not h11: it spends ~10 µs per chunk of a 20-token frame in state-machine and event objects
(~1 µs here), on the one call of the proxy that runs once per upstream frame (issue 7). Heads
are parsed strictly — CRLF line ends only, no obs-fold, no control characters in values, token
names, one Content-Length, `chunked` the only transfer coding — because a head we cannot read
exactly must never become a stream (tests/test_reliability_security.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Largest response head accepted (h11 allows 16 KiB; trtllm-serve sends ~150 bytes).
MAX_HEAD_BYTES = 64 * 1024
#: Longest chunk-size line (size, extensions) and trailer section accepted.
MAX_LINE_BYTES = 4096

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# field-value: visible characters, obs-text, spaces and tabs; never CR, LF, NUL or other CTLs.
_VALUE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")
_STATUS_LINE = re.compile(rb"HTTP/1\.([0-9]) ([0-9]{3})(?: [^\x00-\x08\x0a-\x1f\x7f]*)?")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_CHUNKED_STATUSES_WITHOUT_BODY = frozenset({204, 304})


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


def request_bytes(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """A request with a body of known length, ready to write. `headers` must not hold
    Content-Length or Transfer-Encoding (hop-by-hop ones are dropped by the caller)."""
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        # A CR or LF here would let a header value end the head early (request splitting).
        if _TOKEN.fullmatch(name) is None or _VALUE.fullmatch(value) is None:
            raise ProtocolError(f"cannot send header {name!r}: invalid name or value")
        parts += (name, b": ", value, b"\r\n")
    parts += (b"content-length: ", b"%d" % len(body), b"\r\n\r\n", body)
    return b"".join(parts)


_HEAD, _BODY, _DONE = "HEAD", "BODY", "DONE"
_CHUNKED, _LENGTH, _UNTIL_CLOSE = "chunked", "length", "until_close"
#: Chunked sub-states: a size line next, chunk data next, the CRLF after the data, trailers.
_SIZE, _DATA, _DATA_END, _TRAILER = 0, 1, 2, 3


class ResponseReader:
    """Incremental parser of one response (see the module docstring)."""

    __slots__ = (
        "_buffer",
        "_chunk",
        "_closing",
        "_framing",
        "_left",
        "_trailing",
        "head",
        "state",
    )

    def __init__(self) -> None:
        self._buffer = b""
        self.head: Head | None = None
        self.state = _HEAD
        self._framing = _UNTIL_CLOSE
        self._left = 0  # body bytes left: of the Content-Length, or of the current chunk
        self._chunk = _SIZE
        self._closing = False  # `Connection: close`, HTTP/1.0, or framing we must not trust
        self._trailing = False  # bytes arrived after the end of the response

    @property
    def done(self) -> bool:
        return self.state is _DONE

    @property
    def reusable(self) -> bool:
        """The connection may carry another request (response read to its end, cleanly)."""
        return self.state is _DONE and not self._closing and not self._trailing

    def feed(self, data: bytes) -> bytes:
        """Take bytes from the wire; return the body bytes completed by them."""
        if self.state is _DONE:
            self._trailing = self._trailing or bool(data)
            return b""
        buffer = self._buffer + data if self._buffer else data
        self._buffer = b""
        while self.state is _HEAD:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise ProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
                self._buffer = buffer
                return b""
            self._head(buffer[:end])
            buffer = buffer[end + 4 :]
        if self._framing is _UNTIL_CLOSE:
            return buffer
        if self._framing is _LENGTH:
            return self._length(buffer)
        return self._chunked(buffer)

    def end_of_input(self) -> None:
        """The peer closed the connection: the end of a read-until-close body, else an error."""
        if self.state is _BODY and self._framing is _UNTIL_CLOSE:
            self.state = _DONE
            return
        if self.state is _HEAD:
            raise ProtocolError("connection closed before a complete response head")
        if self.state is _BODY:
            raise ProtocolError("connection closed before the end of the response body")

    # -- the head -----------------------------------------------------------------------------

    def _head(self, raw: bytes) -> None:
        unpaired = raw.replace(b"\r\n", b"")
        if b"\n" in unpaired or b"\r" in unpaired:
            raise ProtocolError("response head has a bare CR or LF")
        lines = raw.split(b"\r\n")
        status_line = _STATUS_LINE.fullmatch(lines[0])
        if status_line is None:
            raise ProtocolError(f"invalid status line {lines[0][:100]!r}")
        status = int(status_line.group(2))
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or _TOKEN.fullmatch(name) is None:
                # also an obs-fold line (leading whitespace), which RFC 9112 §5.2 lets us reject
                raise ProtocolError(f"invalid header line {line[:100]!r}")
            value = value.strip(b" \t")
            if _VALUE.fullmatch(value) is None:
                raise ProtocolError(f"invalid value of header {name.decode()!r}")
            headers.append((name.decode("ascii").lower(), value.decode("latin-1")))
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError("upstream switched protocols")
            return  # an interim response (100 Continue, 103 Early Hints): the real one follows
        self.head = Head(status, tuple(headers))
        self.state = _BODY
        self._frame(status_line.group(1) == b"1", headers)

    def _frame(self, http11: bool, headers: list[tuple[str, str]]) -> None:
        codings: list[str] = []
        lengths: set[str] = set()
        for name, value in headers:
            if name == "transfer-encoding":
                codings += [c.strip().lower() for c in value.split(",") if c.strip()]
            elif name == "content-length":
                lengths.update(v.strip() for v in value.split(","))
            elif name == "connection" and "close" in value.lower().replace(" ", "").split(","):
                self._closing = True
        self._closing = self._closing or not http11
        assert self.head is not None
        if self.head.status in _CHUNKED_STATUSES_WITHOUT_BODY:
            self._framing, self._left = _LENGTH, 0
        elif codings:
            if codings != ["chunked"]:
                raise ProtocolError(f"unsupported transfer coding {', '.join(codings)!r}")
            self._framing = _CHUNKED
            # RFC 9112 §6.3: both given means chunked wins, and the connection must close.
            self._closing = self._closing or bool(lengths)
        elif lengths:
            if len(lengths) != 1 or not next(iter(lengths)).isdigit():
                raise ProtocolError(f"invalid Content-Length {', '.join(sorted(lengths))!r}")
            self._framing, self._left = _LENGTH, int(next(iter(lengths)))
        else:
            self._framing, self._closing = _UNTIL_CLOSE, True
        if self._framing is _LENGTH and self._left == 0:
            self.state = _DONE

    # -- the body -------------------------------------------------------------------------------

    def _length(self, buffer: bytes) -> bytes:
        if len(buffer) < self._left:
            self._left -= len(buffer)
            return buffer
        body, rest = buffer[: self._left], buffer[self._left :]
        self._left = 0
        self.state = _DONE
        self._trailing = bool(rest)
        return body

    def _chunked(self, buffer: bytes) -> bytes:
        out: list[bytes] = []
        at = 0
        size = len(buffer)
        while at < size:
            if self._chunk == _DATA:
                take = min(self._left, size - at)
                out.append(buffer[at : at + take])
                at += take
                self._left -= take
                if self._left == 0:
                    self._chunk = _DATA_END
                continue
            end = buffer.find(b"\r\n", at)
            if end < 0:
                if size - at > MAX_LINE_BYTES:
                    raise ProtocolError("chunk-size line or trailer too long")
                break
            line = buffer[at:end]
            at = end + 2
            if self._chunk == _DATA_END:
                if line:
                    raise ProtocolError("chunk data not followed by CRLF")
                self._chunk = _SIZE
            elif self._chunk == _SIZE:
                digits = line.split(b";", 1)[0].rstrip(b" \t")
                if _HEX.fullmatch(digits) is None:
                    raise ProtocolError(f"invalid chunk size {line[:40]!r}")
                self._left = int(digits, 16)
                self._chunk = _DATA if self._left else _TRAILER
            elif not line:  # _TRAILER: the blank line ends the message; trailers are ignored
                self.state = _DONE
                self._trailing = at < size
                break
        if self.state is not _DONE and at < size:
            self._buffer = buffer[at:]
        if len(out) == 1:
            return out[0]
        return b"".join(out)
