"""A lean HTTP/1.1 client to upstream: the one way the proxy reaches trtllm-serve. It carries the
streamed `POST /v1/completions` of every repaired request (`Upstream.completion_stream`, the
proxy's one hot upstream call), the requests passed through untouched (`Upstream.forward`), and
the capability probe and `/health` (`proxy.upstream.probe`).

Why not httpx: it sends a request through httpcore, anyio and h11, which per upstream frame is
~10 objects and several awaits before the bytes reach the SSE decoder, and per open stream
several KB of request, response, connection and stream objects. Here one `asyncio.Protocol` per
connection (`proxy.upstream.connection`) parses what arrives with llhttp and hands body bytes to
the one reader waiting for them (bench/latency.py and bench/byte_relay.py measure the cost per
frame). And httpcore reuses a connection whose response was followed by stray bytes, so a 204
"with a body" became the next request's answer; here such a connection is never reused.

    StreamClient.send() ─▶ idle connection (or a new one) ─▶ request written ─▶ head read
                                                 (a streamed body is written meanwhile)
                                                                                 │
    Response.read() … b"" at the end ─▶ Response.close(): back to the pool when the body was
                                        read to its end and both sides keep the connection;
                                        closed at once otherwise (a cancelled exchange:
                                        trtllm-serve sees the connection go and aborts)

New connections come from a `Transport` (`proxy.upstream.transport`: TCP and TLS, or what a
test injects). Errors are `StreamError`s (the tree is in `proxy.upstream.connection`);
`Upstream` translates them at its boundary.

The pool keeps at most `max_idle` idle connections, each for `keepalive_expiry` seconds (below
uvicorn's 5 s: see `proxy.upstream.client.KEEPALIVE_EXPIRY`), newest first, and never one whose
response was not read to its end, that upstream closed, that received unasked-for bytes, or
whose request was not written to its end. A request with a body of bytes on a reused
connection that upstream closes before a byte of its answer (the keep-alive race) is sent once
more on a new connection; upstream never read it.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import deque
from collections.abc import AsyncIterable, Callable
from typing import cast
from urllib.parse import quote, unquote, urlsplit

from proxy.upstream.connection import (
    HIGH_WATER,
    ConnectError,
    Connection,
    ConnectTimeout,
    LocalProtocolError,
    MalformedResponseError,
    ReadError,
    RemoteProtocolError,
    StreamError,
)
from proxy.upstream.http1 import (
    LAST_CHUNK,
    Head,
    ProtocolError,
    chunk,
    request_bytes,
    request_head,
)
from proxy.upstream.transport import TCPTransport, Transport, tls_context

__all__ = [
    "HIGH_WATER",
    "ConnectError",
    "ConnectTimeout",
    "LocalProtocolError",
    "MalformedResponseError",
    "ReadError",
    "RemoteProtocolError",
    "Response",
    "StreamClient",
    "StreamError",
]


class Response:
    """An upstream response whose body is read as it arrives; `close()` it (in `finally`)."""

    __slots__ = ("_client", "_connection", "head")

    def __init__(self, client: StreamClient, connection: Connection, head: Head) -> None:
        self._client = client
        self._connection: Connection | None = connection
        self.head = head

    @property
    def status(self) -> int:
        return self.head.status

    @property
    def trailing(self) -> bool:
        """Bytes arrived after the end of the response: upstream is broken (or smuggling)."""
        return self._connection is not None and self._connection.trailing

    @property
    def done(self) -> bool:
        """The response was read to its end (a bodyless one is, at its head)."""
        return self._connection is not None and self._connection.done

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

    Connections are opened by `transport` (default: TCP to the origin, TLS for https, see
    `proxy.upstream.transport`); `clock` is injectable for tests of the idle expiry."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        keepalive_expiry: float,
        max_idle: int = 256,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if tls else 80)
        if transport is None:
            transport = TCPTransport(self._host, self._port, tls_context() if tls else None)
        self._transport = transport
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
        self._idle: deque[Connection] = deque()
        self._closed = False

    @property
    def idle_connections(self) -> int:
        """Idle connections held for reuse (expired ones are dropped on the next request)."""
        return len(self._idle)

    async def send(
        self,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterable[bytes],
        *,
        length: int | None = None,
    ) -> Response:
        """Write a request and wait for its response head. The caller times the whole call.

        `body` is bytes, or an async iterable streamed as it comes: with `length` (the
        client's Content-Length) as is, else chunked. A streamed body cannot be sent twice, so
        its request is not retried after the keep-alive race (neither does httpx)."""
        fixed = self._fixed
        wire = [*fixed, *[(n, v) for n, v in headers if n.lower() not in self._fixed_names]]
        target = self._prefix + path.encode()
        head_request = method == "HEAD"
        try:
            if isinstance(body, bytes):
                request = request_bytes(method.encode(), target, wire, body)
            else:
                request = request_head(method.encode(), target, wire, length)
        except ProtocolError as exc:
            raise LocalProtocolError(str(exc)) from exc
        if not isinstance(body, bytes):
            streamed = self._acquire()
            if streamed is None:
                streamed = await self._connect()
            return await self._exchange(streamed, request, head_request, (body, length))
        connection = self._acquire()
        if connection is not None:
            try:
                return await self._exchange(connection, request, head_request)
            except (RemoteProtocolError, ReadError):
                # Upstream closed this idle connection as we reused it (the keep-alive race):
                # it never read the request, so sending it again on a new one is safe. Any
                # byte of an answer means it did, and the error stands.
                if connection.heard:
                    raise
        return await self._exchange(await self._connect(), request, head_request)

    async def _exchange(
        self,
        connection: Connection,
        request: bytes,
        head_request: bool,
        streamed: tuple[AsyncIterable[bytes], int | None] | None = None,
    ) -> Response:
        try:
            connection.start(request, head_request=head_request)
            if streamed is None:
                head = await connection.head()
            else:
                head = await _head_while_sending(connection, *streamed)
        except BaseException:
            connection.close()
            raise
        return Response(self, connection, head)

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    # -- the pool -------------------------------------------------------------------------------

    def _acquire(self) -> Connection | None:
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

    def _release(self, connection: Connection) -> None:
        if not connection.reusable or self._closed or len(self._idle) >= self._max_idle:
            connection.close()
            return
        now = self._clock()
        connection.idle_since = now
        self._idle.append(connection)
        while self._idle and self._idle[0].idle_since < now - self._expiry:
            self._idle.popleft().close()

    async def _connect(self) -> Connection:
        connection = Connection()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._transport.connect(connection)
        except TimeoutError:
            raise ConnectTimeout(
                f"not connected to {self._host}:{self._port} within {self._connect_timeout:g} s"
            ) from None
        except OSError as exc:  # refused, unreachable, name not known, TLS (ssl.SSLError)
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return connection


async def _head_while_sending(
    connection: Connection, body: AsyncIterable[bytes], length: int | None
) -> Head:
    """Send a streamed body while waiting for the head; upstream may answer before it read
    the whole body (a 413, say): the rest is not sent and the connection not reused. An error
    of the body's source (our client's 413, its disconnect) is raised as it is."""
    sending = asyncio.ensure_future(_send_body(connection, body, length))
    answer = asyncio.ensure_future(connection.head())
    try:
        await asyncio.wait({sending, answer}, return_when=asyncio.FIRST_COMPLETED)
        if not answer.done() and sending.exception() is not None:
            raise cast(BaseException, sending.exception())
        return await answer
    finally:
        sending.cancel()
        answer.cancel()
        (sent,) = await asyncio.gather(sending, return_exceptions=True)
        if sent is not None:  # cut short or failed: upstream waits for the rest of a request
            connection.unfinished = True


async def _send_body(
    connection: Connection, body: AsyncIterable[bytes], length: int | None
) -> None:
    sent = 0
    async for data in body:
        if not data:
            continue
        sent += len(data)
        if length is not None and sent > length:
            raise LocalProtocolError(f"request body longer than its Content-Length {length}")
        await connection.write(data if length is not None else chunk(data))
    if length is None:
        await connection.write(LAST_CHUNK)
    elif sent != length:
        raise LocalProtocolError(f"request body of {sent} bytes, not its Content-Length {length}")
