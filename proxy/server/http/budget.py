"""A global budget for request bodies being read and rendered.

Each request's body read was bounded (`max_body_bytes`), but not all of them together: 100
concurrent 15 MiB bodies took the proxy from 122 MB to 1.4 GB RSS, past the 1 GiB our manifests
give the container. A `/v1/responses` body is now read only inside a `Reservation` of this
budget, held until the request is rendered (the raw bytes, the parsed dict and the copy sent to a
render worker all live until then):

- with a `Content-Length`, the whole length is reserved before the first byte is read (and a
  length over `max_body_bytes` is refused before reading, so `Expect: 100-continue` gets a 413,
  not `100 Continue`: uvicorn sends that on the app's first `receive()`);
- a chunked body reserves `STEP` bytes at a time as it grows;
- a reservation that does not fit waits, first come first served, up to `wait` seconds, then the
  request gets 503 + Retry-After (`UnavailableError`, code `body_budget_exhausted`). A body
  larger than the whole budget reserves all of it: it is read alone, never refused for its size.

While a request waits, nothing of its body is read: uvicorn stops reading the socket once ~64 KB
are buffered, so a waiting client costs a few kernel buffers, not its body.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from types import TracebackType

from starlette.types import Scope

from proxy.errors import ClientError, UnavailableError
from proxy.server import asgi

#: Growth step of a chunked body's reservation.
STEP = 1024 * 1024
#: Seconds spent reading and dropping the body of a request refused before it was read.
DISCARD_SECONDS = 2.0


class BodyBudget:
    """`limit` bytes shared by every body being read; `limit` 0 means no budget."""

    def __init__(self, limit: int, wait: float) -> None:
        self.limit = limit
        self.wait = wait
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def reservation(self) -> Reservation:
        """An empty reservation; grow it with `Reservation.ensure`, release it on exit."""
        return Reservation(self)

    async def _acquire(self, size: int) -> int:
        if not self.limit:
            return 0
        size = min(size, self.limit)
        if not self._waiters and self.used + size <= self.limit:
            self.used += size
            return size
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(self.wait):
                await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(size)  # granted just as the wait ended
            else:
                # Cancelled (timeout, client gone): `_wake` may have dropped it already.
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._wake()  # a smaller request behind this one may fit now
            raise
        return size

    def _release(self, size: int) -> None:
        self.used -= size
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            size, waiter = self._waiters[0]
            if waiter.done():  # its task was cancelled; its handler has not run yet
                self._waiters.popleft()
                continue
            if self.used + size > self.limit:
                return
            self._waiters.popleft()
            self.used += size
            waiter.set_result(None)


class Reservation:
    """Bytes of one request in a `BodyBudget`; `async with` releases them."""

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.held = 0
        #: Bytes the body may have before the reservation must grow (a whole budget is final).
        self.covers = 0

    async def ensure(self, size: int) -> None:
        """Hold room for a body of `size` bytes; UnavailableError when none comes in time."""
        budget = self._budget
        if not budget.limit or size <= self.covers:
            return
        want = size - self.held
        try:
            got = await budget._acquire(min(want, budget.limit - self.held))
        except TimeoutError:
            raise UnavailableError(
                f"the proxy is reading its limit of {budget.limit} request body bytes "
                f"(body_budget_bytes) and none came free within {budget.wait:g} s; retry shortly",
                code="body_budget_exhausted",
            ) from None
        self.held += got
        self.covers = size if self.held < budget.limit else 2**63

    def release(self) -> None:
        """Give the bytes back (idempotent)."""
        if self.held:
            self._budget._release(self.held)
            self.held = 0
            self.covers = 0

    async def __aenter__(self) -> Reservation:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, or None (chunked, or none sent; httptools has already
    refused a malformed one)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(scope: Scope, inbound: asgi.Inbound, hold: Reservation, limit: int) -> bytes:
    """The whole body, read only within `hold` (module doc); 413 above `limit` — before the
    first `receive()` when the Content-Length says so, so `Expect: 100-continue` is never
    answered `100 Continue` for a body we would refuse."""
    length = declared_length(scope)
    if length is not None:
        if limit and length > limit:
            raise ClientError(
                f"request body exceeds the limit of {limit} bytes (Content-Length {length})",
                status=413,
                code="request_too_large",
            )
        await hold.ensure(length)
    chunks = []
    size = 0
    async for chunk in inbound.stream_body(limit):
        size += len(chunk)
        if size > hold.covers:
            await hold.ensure(-(-size // STEP) * STEP)
        chunks.append(chunk)
    return b"".join(chunks)


async def discard_body(inbound: asgi.Inbound, limit: int) -> None:
    """Read and drop the body of a request refused before it was read (a 503: budget full, or
    draining), for at most `DISCARD_SECONDS`: answering while the client still sends and then
    closing (its own `Connection: close`) resets the connection, and the client loses the 503
    (a lingering close, as nginx does). Nothing is kept, so it costs no memory."""
    with contextlib.suppress(TimeoutError, ClientError, asgi.ClientDisconnected):
        async with asyncio.timeout(DISCARD_SECONDS):
            async for _ in inbound.stream_body(limit):
                pass
