"""A lean HTTP/1.1 client for the proxy's one hot upstream call: the streamed
`POST /v1/completions` of every repaired request (`Upstream.completion_stream`).

httpx sends it through httpcore, anyio and h11: per upstream frame that is ~10 objects and
several awaits before the bytes reach the SSE decoder, and per open stream several KB of
request, response, connection and stream objects (BENCHMARKS.md, sections 2-3; issue 7). Here
one `asyncio.Protocol` per connection parses what arrives with `http1.ResponseReader` in
`data_received` and hands body bytes to the one reader waiting for them.

    StreamClient.send() ─▶ idle connection (or a new one) ─▶ request written ─▶ head read
                                                                                 │
    Response.read() … b"" at the end ─▶ Response.close(): back to the pool when the body was
                                        read to its end and both sides keep the connection;
                                        closed at once otherwise (a cancelled exchange:
                                        trtllm-serve sees the connection go and aborts)

Errors (all `StreamError`; `Upstream` translates them at its boundary):

    StreamError
    ├── ConnectError         cannot open a connection (refused, no route, name, TLS)
    ├── ConnectTimeout       not connected within `connect_timeout`
    ├── LocalProtocolError   a request that must not be written (a header with CR or LF)
    ├── RemoteProtocolError  upstream's bytes are no readable response, or it closed early
    └── ReadError            the connection broke (reset)

The pool keeps at most `max_idle` idle connections, each for `keepalive_expiry` seconds (below
uvicorn's 5 s: see `proxy.upstream.client.KEEPALIVE_EXPIRY`), newest first, and never one whose
response was not read to its end, that upstream closed, or that received unasked-for bytes. A
request on a reused connection that upstream closes before a byte of its answer (the keep-alive
race) is sent once more on a new connection; upstream never read it.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import cast
from urllib.parse import quote, unquote, urlsplit

from proxy.upstream.http1 import Head, ProtocolError, ResponseReader, request_bytes

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


class ReadError(StreamError):
    pass


class _Connection(asyncio.Protocol):
    """One upstream connection; serves one response at a time."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_error",
        "_paused",
        "_reader",
        "_transport",
        "_waiter",
        "closed",
        "heard",
        "idle_since",
    )

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._reader = ResponseReader()
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: StreamError | None = None
        self.closed = False
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
            self._fail(RemoteProtocolError(str(exc)))
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

    # -- for the client -----------------------------------------------------------------------

    @property
    def reusable(self) -> bool:
        return not self.closed and self._error is None and self._reader.reusable

    def start(self, request: bytes) -> None:
        """Write a request (the previous response, if any, was read to its end)."""
        assert self._transport is not None
        self._reader = ResponseReader()
        # The previous response arrived whole, but its owner may have stopped reading early
        # (a failed frame): its unread bytes belong to it, not to this response.
        self._chunks = []
        self._buffered = 0
        self.heard = False
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        self._transport.write(request)

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


class Response:
    """An upstream response whose body is read as it arrives; `close()` it (in `finally`)."""

    __slots__ = ("_client", "_connection", "head")

    def __init__(self, client: StreamClient, connection: _Connection, head: Head) -> None:
        self._client = client
        self._connection: _Connection | None = connection
        self.head = head

    @property
    def status(self) -> int:
        return self.head.status

    async def read(self) -> bytes:
        """Body bytes as they arrive; b"" once the body ended."""
        if self._connection is None:
            raise ReadError("response already closed")
        return await self._connection.read()

    def close(self) -> None:
        """Give the connection back to the pool (body read to its end) or close it."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._client._release(connection)


class StreamClient:
    """HTTP/1.1 requests to one origin (`base_url`) over a small keep-alive pool.

    `ssl_context` is used for an https origin (`Upstream` passes httpx's, so both clients trust
    the same certificates); `clock` is injectable for tests of the idle expiry."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        keepalive_expiry: float,
        max_idle: int = 256,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if tls else 80)
        self._ssl = (ssl_context or ssl.create_default_context()) if tls else None
        host = f"[{self._host}]" if ":" in self._host else self._host
        authority = host if parts.port is None else f"{host}:{parts.port}"
        self._fixed = [(b"host", authority.encode("idna"))]
        if parts.username is not None or parts.password is not None:
            # As httpx does for a base URL with user info: HTTP basic auth, over the client's.
            secret = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            token = base64.b64encode(secret.encode()).decode()
            self._fixed.append((b"authorization", f"Basic {token}".encode()))
        self._fixed_names = frozenset(name for name, _ in self._fixed)
        self._prefix = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=-._~").encode()
        self._connect_timeout = connect_timeout
        self._expiry = keepalive_expiry
        self._max_idle = max_idle
        self._clock = clock
        self._idle: deque[_Connection] = deque()
        self._closed = False

    @property
    def idle_connections(self) -> int:
        """Idle connections held for reuse (expired ones are dropped on the next request)."""
        return len(self._idle)

    async def send(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Response:
        """Write a request and wait for its response head. The caller times the whole call."""
        fixed = self._fixed
        try:
            request = request_bytes(
                method.encode(),
                self._prefix + path.encode(),
                [*fixed, *[(n, v) for n, v in headers if n.lower() not in self._fixed_names]],
                body,
            )
        except ProtocolError as exc:
            raise LocalProtocolError(str(exc)) from exc
        connection = self._acquire()
        if connection is not None:
            try:
                return await self._exchange(connection, request)
            except (RemoteProtocolError, ReadError):
                # Upstream closed this idle connection as we reused it (the keep-alive race):
                # it never read the request, so sending it again on a new one is safe. Any
                # byte of an answer means it did, and the error stands.
                if connection.heard:
                    raise
        return await self._exchange(await self._connect(), request)

    async def _exchange(self, connection: _Connection, request: bytes) -> Response:
        try:
            connection.start(request)
            head = await connection.head()
        except BaseException:
            connection.close()
            raise
        return Response(self, connection, head)

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    # -- the pool -------------------------------------------------------------------------------

    def _acquire(self) -> _Connection | None:
        deadline = self._clock() - self._expiry
        while self._idle:
            connection = self._idle.pop()  # the newest: least likely to be closing upstream
            if connection.idle_since < deadline:
                # This one and every older one expired (the deque is ordered by idle_since).
                connection.close()
                while self._idle:
                    self._idle.pop().close()
                return None
            if connection.reusable:
                return connection
            connection.close()
        return None

    def _release(self, connection: _Connection) -> None:
        if not connection.reusable or self._closed or len(self._idle) >= self._max_idle:
            connection.close()
            return
        now = self._clock()
        connection.idle_since = now
        self._idle.append(connection)
        while self._idle and self._idle[0].idle_since < now - self._expiry:
            self._idle.popleft().close()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, protocol = await loop.create_connection(
                    _Connection,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise ConnectTimeout(
                f"not connected to {self._host}:{self._port} within {self._connect_timeout:g} s"
            ) from None
        except OSError as exc:  # refused, unreachable, name not known, TLS (ssl.SSLError)
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return protocol
