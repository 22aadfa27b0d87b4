"""One upstream HTTP/1.1 connection as an `asyncio.Protocol` (for `proxy.upstream.stream`),
and the client's errors.

`data_received` feeds `http1.ResponseReader` (llhttp) and hands body bytes to the one reader
waiting for them: no task, no stream object, one wake-up per read. Reading stops above
`HIGH_WATER` unread bytes; writing a streamed request body waits while upstream's socket
buffer is full. One response at a time; `reusable` says whether another request may follow.

    StreamError
    ├── ConnectError         cannot open a connection (refused, no route, name, TLS)
    ├── ConnectTimeout       not connected within `connect_timeout`
    ├── LocalProtocolError   a request that must not be written (a header with CR or LF)
    ├── RemoteProtocolError  upstream closed before the response ended
    │   └── MalformedResponseError  upstream's bytes are no valid response (llhttp, our rules)
    └── ReadError            the connection broke (reset)
"""

from __future__ import annotations

import asyncio
import socket
from typing import cast

from proxy.upstream.http1 import Head, ProtocolError, ResponseReader

#: Unread body bytes above which the socket is no longer read (backpressure: a client that
#: does not read holds upstream's stream in the kernel's buffers, not in ours).
HIGH_WATER = 256 * 1024


class StreamError(Exception):
    """The exchange with upstream failed below HTTP semantics (see the module docstring)."""


class ConnectError(StreamError):
    pass


class ConnectTimeout(StreamError):
    pass


class LocalProtocolError(StreamError):
    pass


class RemoteProtocolError(StreamError):
    pass


class MalformedResponseError(RemoteProtocolError):
    """Upstream's bytes are no valid HTTP/1.1 response (not merely cut short)."""


class ReadError(StreamError):
    pass


class Connection(asyncio.Protocol):
    """One upstream connection; serves one response at a time."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_drain",
        "_error",
        "_paused",
        "_reader",
        "_transport",
        "_waiter",
        "_write_paused",
        "closed",
        "heard",
        "idle_since",
        "unfinished",
    )

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._reader = ResponseReader()
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._error: StreamError | None = None
        self.closed = False
        #: Our request was not written to its end (upstream answered first): never reuse.
        self.unfinished = False
        #: Upstream sent a byte since the last `start` (a stale connection fails before any).
        self.heard = False
        self.idle_since = 0.0

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Frames are small and latency-bound: never hold one back (Nagle).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.heard = True
        if self._error is not None:
            return
        try:
            body = self._reader.feed(data)
        except ProtocolError as exc:
            self._fail(MalformedResponseError(str(exc)))
            return
        if body:
            self._chunks.append(body)
            self._buffered += len(body)
            if self._buffered > HIGH_WATER and not self._paused and self._transport is not None:
                self._paused = True
                self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        try:
            self._reader.end_of_input()
        except ProtocolError as exc:
            self._fail(RemoteProtocolError(str(exc)))
        self.closed = True
        self._wake()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._error is None and not self._reader.done:
            if exc is not None:
                self._error = ReadError(f"{type(exc).__name__}: {exc}")
            else:
                self._error = RemoteProtocolError("connection closed before the response ended")
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    # -- for the client -----------------------------------------------------------------------

    @property
    def reusable(self) -> bool:
        return (
            not self.closed
            and not self.unfinished
            and self._error is None
            and self._reader.reusable
        )

    @property
    def done(self) -> bool:
        return self._reader.done

    @property
    def trailing(self) -> bool:
        return self._reader.trailing

    def start(self, request: bytes, *, head_request: bool = False) -> None:
        """Write a request head, or a whole request (the previous response, if any, was read
        to its end). `head_request`: it is a HEAD, whose answer has no body."""
        assert self._transport is not None
        self._reader = ResponseReader(head_request=head_request)
        # The previous response arrived whole, but its owner may have stopped reading early
        # (a failed frame): its unread bytes belong to it, not to this response.
        self._chunks = []
        self._buffered = 0
        self.heard = False
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        self._transport.write(request)

    async def write(self, data: bytes) -> None:
        """Write more of the request (a streamed body), waiting while upstream's socket buffer
        is full (backpressure: a slow upstream never makes us hold the client's body)."""
        transport = self._transport
        assert transport is not None
        if self._error is not None:
            raise self._error
        if self.closed:
            raise ReadError("connection closed while the request was being sent")
        transport.write(data)
        while self._write_paused and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    async def head(self) -> Head:
        while True:
            head = self._reader.head
            if head is not None:
                return head
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at the end."""
        while True:
            if self._chunks:
                chunks = self._chunks
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
                self._buffered = 0
                if self._paused and self._transport is not None:
                    self._paused = False
                    self._transport.resume_reading()
                return data
            if self._reader.done:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()

    def close(self) -> None:
        self.closed = True
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if transport.get_write_buffer_size():
                transport.abort()  # upstream is not reading our request: no FIN after it
            else:
                transport.close()

    def _fail(self, error: StreamError) -> None:
        self._error = error
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
