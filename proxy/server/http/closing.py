"""How a guarded connection ends: the guard's own answers, lingering closes, and which
connections may be closed to make room under the connection cap.

Lingering close. A socket closed with input still unread makes the kernel send a reset instead
of a FIN. A client still sending when that happens — a body over `max_body_bytes`, an 8 MB
header line — has its next write fail, and one that reads only after it has sent everything
(Python's http.client, urllib3, many others) never reads the answer that was waiting for it; on
a real network the reset can also overtake the answer. So, as nginx's lingering_close does, our
FIN goes right after the answer (`write_eof`) and what the client still sends is read and
dropped (`_discarding`), until it closes its end — for at most `LINGER_BYTES` and
`LINGER_SECONDS`, and no longer than `LINGER_IDLE` after its last byte (it has stopped sending:
it is reading us). Then we close whatever the client does. This follows every answer of the
guard (431, 408, 503) and every response that ends while its request's body is still arriving:
a 413 of the app, an early answer passed through from upstream, an answer with
`connection: close` (uvicorn then closes the connection itself: the transport a request's cycle
holds is `_CycleTransport`, whose `close` lingers while the client is still sending).

Room under the cap. `Connections` keeps, oldest first, three registers of connections that may
be closed for a new one when `max_connections` are open (`Connections.make_room`, in this order):
lingering ones (answered already); those waiting for a request head, with none of it received
yet or only part (a silent or slow client: `headless_shed`); idle keep-alive ones
(`idle_shed`). A connection whose head is in and whose answer is not finished — a request in
flight — is in none of them, and is never closed for room.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ClassVar

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from proxy.errors import ProxyError
from proxy.server.http.connections import Connections
from proxy.server.http.upgrade import GuardedWebSocket

#: Bytes a connection we answered may still send us before we close it anyway (a reset): room
#: for a body over the default `max_body_bytes` or a multi-megabyte header line to arrive whole.
LINGER_BYTES = 64 * 1024 * 1024
#: Seconds a connection we answered may go on sending at most.
LINGER_SECONDS = 5.0
#: Seconds without a byte after which a lingering client is taken to be reading our answer.
LINGER_IDLE = 1.0


class _CycleTransport:
    """The connection as a request's cycle (uvicorn's `RequestResponseCycle`) uses it: the
    transport's own `write` and `is_closing`, and a `close` that lingers (module doc)."""

    __slots__ = ("close", "is_closing", "write")

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        self.write = transport.write
        self.is_closing = transport.is_closing
        self.close = close


class ClosingProtocol(HttpToolsProtocol):
    """The ends of a guarded connection (module doc); `GuardedProtocol` adds the limits, and
    keeps the request state read here (`_in_head`, `_head_bytes`, `_in_body`)."""

    # Its own attributes, and GuardedProtocol's, in slots: with uvicorn's 27 in the instance's
    # `__dict__` they would pass the 30 keys a dict shares with its class's other instances,
    # and each connection would get a dict of its own (~1.2 KB more: bench/stream_memory.py).
    __slots__ = (
        "_cycle_transport",
        "_discard_budget",
        "_discarding",
        "_head_bytes",
        "_idle",
        "_in_body",
        "_in_head",
        "_linger_fed",
        "_linger_timer",
        "_linger_until",
        "_lingering",
        "_waiting",
    )

    #: What the connections of the server share (set by `Guard.protocol`, guard.py).
    guard: ClassVar[Connections]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._in_body = False
        #: Answered (or over the pipeline limit): input is dropped, never parsed again.
        self._discarding = False
        #: Lingering (module doc): bytes it may still send; None before.
        self._discard_budget: int | None = None
        self._linger_fed = False
        self._linger_until = 0.0
        self._linger_timer: asyncio.TimerHandle | None = None
        # Which register of the guard the connection is in (module doc).
        self._waiting = False
        self._idle = False
        self._lingering = False
        #: The transport of this connection's cycles (`_CycleTransport`); Any because uvicorn
        #: types a cycle's as `asyncio.Transport`, of which the cycle calls only these three.
        self._cycle_transport: Any = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._cycle_transport = _CycleTransport(transport, self._close_after_response)

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave_waiting()
        self._leave_idle()
        if self._lingering:
            self._lingering = False
            self.guard.lingering.pop(self, None)
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)

    def _cancel_timers(self) -> None:
        """The limits' timers (GuardedProtocol)."""

    # -- registers -------------------------------------------------------------------------

    def _enter_waiting(self) -> None:
        if not self._waiting:
            self._waiting = True
            self.guard.waiting[self] = None

    def _leave_waiting(self) -> None:
        if self._waiting:
            self._waiting = False
            self.guard.waiting.pop(self, None)

    def _enter_idle(self) -> None:
        self._idle = True
        self.guard.idle[self] = None

    def _leave_idle(self) -> None:
        if self._idle:
            self._idle = False
            self.guard.idle.pop(self, None)

    def _upgrade(self) -> None:
        """A WebSocket handshake passed the head limits: the connection is the WebSocket
        protocol's from here (upgrade.py), still counted, in no register; a client that asked
        while an answer of this connection is still under way is closed."""
        self._cancel_timers()
        self._leave_waiting()
        self._leave_idle()
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete):
            self.transport.close()
            return
        self.handle_websocket_upgrade()
        protocol = self.transport.get_protocol()
        if isinstance(protocol, GuardedWebSocket):
            protocol.handed_over()

    def shed(self) -> None:
        """Close this connection now to make room for a new one (`Connections.make_room`)."""
        transport = self.transport
        if self._lingering:
            self._lingering = False
            self.guard.lingering.pop(self, None)
        elif self._waiting:
            self.guard.observe("headless_shed")
            self._leave_waiting()
            self._discarding = True
            self._cancel_timers()
            if self._head_bytes and not transport.is_closing():
                # Part of a head came: say why, but free the descriptor now (no lingering).
                error = ProxyError(
                    "the proxy is at its limit of client connections and closed this one, "
                    "which had not sent a whole request head; retry shortly",
                    status=503,
                    code="too_many_connections",
                )
                transport.write(self._error_bytes(503, error, [b"retry-after: 1\r\n"]))
        else:
            self.guard.observe("idle_shed")
            self._leave_idle()
        if not transport.is_closing():
            transport.close()

    # -- answers and lingering -------------------------------------------------------------

    def _error_bytes(self, status: int, error: ProxyError, extra: list[bytes] | None) -> bytes:
        body = orjson.dumps(error.to_body())
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n",
            *(extra or []),
            b"\r\n",
            body,
        ]
        return b"".join(head)

    def _answer(self, status: int, error: ProxyError, extra: list[bytes] | None = None) -> None:
        """Write `error` as the connection's last answer, then close it lingering."""
        if not self.transport.is_closing():
            self.transport.write(self._error_bytes(status, error, extra))
        self._linger()

    def _close_after_response(self) -> None:
        """The cycle's `transport.close()`: after an answer with `connection: close`, or from
        an app that failed. Lingers while the client is still sending."""
        if self._lingering or self.transport.is_closing():
            return
        if self._in_body or self._head_bytes or self._discarding:
            self._linger()
        else:
            self.transport.close()

    def _linger(self) -> None:
        """Our FIN now; the client's bytes dropped until it closes or a bound is hit."""
        transport = self.transport
        self._discarding = True
        self._cancel_timers()
        self._unset_keepalive_if_required()
        self._leave_idle()
        self._leave_waiting()
        if self._lingering or transport.is_closing():
            return
        if not transport.can_write_eof():  # pragma: no cover - TLS; the proxy serves plain TCP
            transport.close()
            return
        transport.write_eof()
        self._discard_budget = LINGER_BYTES
        self._linger_until = self.loop.time() + LINGER_SECONDS
        self._linger_timer = self.loop.call_later(LINGER_IDLE, self._linger_check)
        self._lingering = True
        self.guard.lingering[self] = None
        self.flow.resume_reading()

    def _discard(self, size: int) -> None:
        if self._discard_budget is None:
            return  # over the pipeline limit: answers are still being written
        self._linger_fed = True
        self._discard_budget -= size
        if self._discard_budget < 0:
            self.transport.close()

    def _linger_check(self) -> None:
        now = self.loop.time()
        if not self._linger_fed or now >= self._linger_until:
            self._linger_timer = None
            self.transport.close()
            return
        self._linger_fed = False
        wait = min(LINGER_IDLE, self._linger_until - now)
        self._linger_timer = self.loop.call_later(wait, self._linger_check)
