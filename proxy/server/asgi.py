"""Small ASGI building blocks: bounded body reads, JSON answers, disconnect watching, headers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from typing import Any, Protocol

import orjson
from starlette.types import Message, Receive, Scope, Send

from proxy.errors import ClientError, ProxyError
from proxy.server.deadline import Deadline

REQUEST_ID = "x-request-id"
#: A client's X-Request-Id is kept only as such a token: it goes into our log lines,
#: upstream's and back to the client, where junk could forge or break something.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


#: A request's headers as the ASGI scope has them (lower-case names).
RawHeaders = Sequence[tuple[bytes, bytes]]


def header_pairs(scope: Scope) -> list[tuple[str, str]]:
    return decoded(scope["headers"])


def decoded(headers: RawHeaders) -> list[tuple[str, str]]:
    """`headers` as text (latin-1: any byte is a character)."""
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]


def request_id(scope: Scope) -> str:
    """The client's `X-Request-Id` when it is a sane token, else a new one (never echo junk)."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            candidate: str = value.decode("latin-1")
            if _SAFE_ID.fullmatch(candidate):
                return candidate
    return uuid.uuid4().hex


def require_json(scope: Scope) -> None:
    """ClientError 415 unless the request says its body is UTF-8 JSON, or says nothing.

    trtllm-serve (FastAPI) parses a body as JSON only without a Content-Type or with a JSON one,
    and rejects the rest; so does the proxy, with a message naming the type (a `text/plain`
    or form-encoded body is never read as if it were JSON).
    """
    for name, value in scope["headers"]:
        if name != b"content-type":
            continue
        media, _, params = value.decode("latin-1").partition(";")
        media = media.strip().lower()
        charset = ""
        for param in params.split(";"):
            key, _, val = param.partition("=")
            if key.strip().lower() == "charset":
                charset = val.strip().strip('"').lower()
        is_json = media == "application/json" or (
            media.startswith("application/") and media.endswith("+json")
        )
        if not is_json or charset not in ("", "utf-8", "utf8"):
            raise ClientError(
                f"Content-Type {value.decode('latin-1')[:100]!r} is not supported: send the "
                "request body as JSON with Content-Type: application/json (UTF-8)",
                status=415,
                code="unsupported_media_type",
            )
        return


class ClientDisconnected(Exception):
    """The client closed the connection; nothing can be sent any more."""


class ResponseAborted(Exception):
    """Raised out of the app to abort a response whose head is sent and whose body cannot be
    finished (upstream's broke): the client must see the truncation, never a clean end.

    ASGI has no abort. uvicorn closes the connection when the app raises after the response
    started — before the last chunk of a chunked body, or short of its Content-Length, so the
    client's HTTP parser reports the truncation — and logs "Exception in ASGI application".
    The app has logged and counted the failure already; `quiet_aborts` drops exactly that
    second record."""


class _QuietAborts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ResponseAborted))


def quiet_aborts(logger: logging.Logger | None = None) -> None:
    """Keep uvicorn (its `uvicorn.error` logger) from logging our `ResponseAborted` as an
    unhandled exception; every other record passes. Installed by the runner; idempotent."""
    target = logger or logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietAborts) for f in target.filters):
        target.addFilter(_QuietAborts())


class SendTimeout(OSError):
    """The client accepted nothing for the send timeout: treated as gone (an OSError, like a
    dead socket), so its upstream request — a GPU slot — is released."""


def with_send_timeout(send: Send, seconds: float) -> Send:
    """`send`, failing with SendTimeout when one message waits longer than `seconds`.

    A client that stops reading fills the socket buffers, then uvicorn's `send` waits (the
    backpressure that keeps memory bounded); without a bound it would hold its upstream
    request, and a drain, forever.
    """

    # One lazily re-armed timer for every send of the response, not an `asyncio.timeout`
    # per send (~14 µs each, one per upstream frame).
    deadline = Deadline()

    async def timed(message: Message) -> None:
        try:
            async with deadline.after(seconds):
                await send(message)
        except TimeoutError:
            raise SendTimeout(f"the client accepted nothing for {seconds:g} s") from None
        if not message.get("more_body", False) and message["type"] == "http.response.body":
            deadline.close()  # the last message: no timer left behind

    return timed


async def send_json(
    send: Send,
    status: int,
    body: Any,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def send_error(
    send: Send, error: ProxyError, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    await send_json(send, error.status, error.to_body(), headers)


class Inbound:
    """The request side of one ASGI connection, read by one reader at a time: first the body
    (streamed or whole), then the wait for `http.disconnect` (two concurrent `receive()` calls
    would steal each other's messages)."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.body_done = False
        self.disconnected = False
        #: Who waits in `wait_disconnect` while the body still streams: a future each, made on
        #: the wait. Not two `asyncio.Event`s per request (each holds a deque of 64 slots, ~0.7
        #: KB: bench/stream_memory.py), since the body has mostly ended before anyone waits.
        self._waiters: list[asyncio.Future[None]] | None = None

    async def body(self, limit: int) -> bytes:
        """The whole body (413 above `limit`)."""
        return b"".join([chunk async for chunk in self.stream_body(limit)])

    async def stream_body(self, limit: int) -> AsyncIterator[bytes]:
        """The body as it arrives; raises ClientError 413 past `limit`, ClientDisconnected."""
        size = 0
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    self.disconnected = True
                    raise ClientDisconnected("client went away while sending the request")
                chunk = message.get("body", b"")
                size += len(chunk)
                if limit and size > limit:
                    raise ClientError(
                        f"request body exceeds the limit of {limit} bytes",
                        status=413,
                        code="request_too_large",
                    )
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    return
        finally:
            self.body_done = True
            self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    async def wait_disconnect(self) -> None:
        if not self.body_done:  # a body still streaming (pass-through) has the reader
            waiter = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(waiter)
            # the reader sets `body_done` when the body ends, a disconnect included
            await waiter
        while not self.disconnected:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True


class Disconnects(Protocol):
    """What tells that the client went: an HTTP request's `Inbound`, a WebSocket session's
    `Closed`."""

    async def wait_disconnect(self) -> None:
        """Return once the client has gone."""


class Closed:
    """A WebSocket session's end, as its turns watch it: the session reads every message
    itself (one reader), and says when the client closed (`close`)."""

    def __init__(self) -> None:
        self._closed = asyncio.Event()

    def close(self) -> None:
        self._closed.set()

    async def wait_disconnect(self) -> None:
        await self._closed.wait()


async def run_until_disconnect(inbound: Disconnects, work: Awaitable[None]) -> bool:
    """Run `work`; if the client disconnects first, cancel it (closing what it holds, e.g. the
    upstream request, at once) and return True."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(inbound.wait_disconnect())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watcher.cancel()
    if task in done:
        task.result()  # re-raise our own errors
        return False
    # The work was cancelled; what it raised on the way out is of no interest to anyone.
    with contextlib.suppress(asyncio.CancelledError, OSError, ClientDisconnected):
        await task
    return True


def body_coming(scope: Scope) -> bool:
    """Whether the client is sending a body we have not read. Refused before reading it, a
    connection is closed only when none is on its way (`Expect: 100-continue` waits for our
    word; no body at all): closing on unread bytes resets the connection, and the client may
    lose our answer. Otherwise uvicorn reads and drops the rest of the body."""
    length = None
    for name, value in scope["headers"]:
        if name == b"expect" and value.lower() == b"100-continue":
            return False
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            length = value
    return length is not None and length.strip() != b"0"
