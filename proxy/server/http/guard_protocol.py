"""The guarded HTTP/1.1 protocol: uvicorn's `HttpToolsProtocol` with the limits of
`proxy/server/http/guard.py`.

Theory of operation. A connection is, at any time, waiting for or inside a head (`_in_head`;
`_head_bytes` counts what arrived of it), or inside a body (`_in_body`), while zero or
more of its requests are being answered (`_running`, then uvicorn's `pipeline` queue). The head
timer runs from the accept, or from the first byte of a later request, until the head is in;
the body timer from then until the body is in. A refusal (`refusals.Refusal`, raised from a parser
callback so that llhttp stops, or made when llhttp rejects the bytes themselves) is answered at
once, or after the answers ahead of it; from then on input is read and dropped (`_discarding`)
until the lingering close ends. How a connection ends — answers, lingering closes, and the
registers of connections that may be closed for room under the cap — is `ClosingProtocol`'s
(closing.py), which this class extends.

Pipelining. uvicorn answers pipelined requests in order from a queue, but its `connection_lost`
tells only the newest parsed request (`self.cycle`) that the client went away: a stream running
ahead of a queued request kept its upstream request generating after the client closed, then
failed writing to the closed transport ("Exception in ASGI application"). Here every request of
the connection, running or queued, sees `http.disconnect`. A client may queue at most
`MAX_PIPELINED` requests behind the running one: those are all answered, the last with
`connection: close`, and what followed them is dropped (RFC 9112 §9.3.2: a client retries the
requests a closed connection left unanswered), so a connection's memory stays bounded. A client
that half-closes ends the connection, as in uvicorn (and nginx, which aborts a proxied request on
it): a half-close cannot be told from a client gone, and a gone client's GPU slot matters more.

Malformed requests. A request line or header that llhttp rejects gets an OpenAI-style JSON 400
(`bad_request`) and a lingering close like every other refusal here, not uvicorn's plain-text 400
and immediate close (which a client still sending would see as a reset).

Cost: nothing on the send path. Per request a few Python calls and a pass over the header list
(~4 µs of CPU on the benchmark machine, bench/http_guard.py); a timer only for a head or body
that a read left unfinished; per received chunk of a body an addition and a clock read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from proxy.errors import ClientError, ProxyError
from proxy.server.http import refusals
from proxy.server.http.closing import ClosingProtocol

#: Requests a client may queue behind the one being answered (module doc, pipelining).
MAX_PIPELINED = 32


class GuardedProtocol(ClosingProtocol):
    """uvicorn's httptools protocol with the limits of the module doc (bound to a `Guard` by
    `Guard.protocol`)."""

    __slots__ = (  # ClosingProtocol's comment
        "_body_bytes",
        "_body_seen",
        "_body_started",
        "_body_timer",
        "_counted",
        "_head_timer",
        "_keep_alive_after_body",
        "_limits",
        "_pending",
        "_running",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = self.guard.limits
        # uvicorn's keep-alive timer, in seconds as given (its Config takes whole seconds).
        self.timeout_keep_alive = self._limits.keepalive_timeout  # type: ignore[assignment]
        self._counted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        # `_in_head`: between two requests, or inside a head. `_head_bytes`: bytes of the reads
        # that began between requests, until a head is in: what bounds a head not yet complete
        # (the parser holds its unfinished line itself), give or take the part of one read that
        # followed an earlier request. Both, and `_in_body`, are declared by ClosingProtocol.
        self._body_bytes = 0
        self._body_started = 0.0
        self._body_seen = 0.0
        self._running: RequestResponseCycle | None = None
        #: A refusal waiting for the responses ahead of it (a pipelined bad head).
        self._pending: refusals.Refusal | None = None
        #: What the request being received asked of keep-alive, restored once its body is in.
        self._keep_alive_after_body = False

    # -- connections -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard = self.guard
        guard.open += 1
        guard.connections(guard.open)
        self._counted = True
        # nginx's client_header_timeout runs from the accept: a connection that never sends a
        # head is closed like one that sends it too slowly.
        self._head_timer = self.loop.call_later(self._limits.header_timeout, self._head_timeout)
        cap = self._limits.max_connections
        if cap and guard.open > cap and not guard.make_room():
            guard.observe("connection_refused")  # every connection has a request in flight
            error = ProxyError(
                f"the proxy has its limit of {cap} client connections open; retry shortly",
                status=503,
                code="too_many_connections",
            )
            self._answer(503, error, [b"retry-after: 1\r\n"])
        else:
            self._enter_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self.guard.open -= 1
            self.guard.connections(self.guard.open)
        self._cancel_timers()
        # Every request of the connection learns that its client is gone, not only the newest
        # parsed one (uvicorn's `self.cycle`): a running stream ahead of a pipelined request
        # must stop, and release its upstream request, at once (module doc, pipelining).
        for cycle in self._cycles():
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.message_event.set()
        super().connection_lost(exc)

    def _cycles(self) -> Iterator[RequestResponseCycle]:
        if self._running is not None:
            yield self._running
        for cycle, _app in self.pipeline:
            yield cycle
        if self.cycle is not None:
            yield self.cycle

    def _responding(self) -> bool:
        """A response of this connection is under way or queued."""
        running = self._running
        return bool(self.pipeline) or (running is not None and not running.response_complete)

    # -- input -----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, with the head/body accounting and our own refusals (theirs
        # would answer a callback's exception with a plain 400).
        if self._discarding:
            self._discard(len(data))
            return
        if self._idle:
            self._leave_idle()
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        elif self._in_body:
            self._body_bytes += len(data)
            self._body_seen = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refusal = exc.__context__
            if isinstance(refusal, refusals.Refusal):
                self._refuse(refusal)
            elif isinstance(refusal, refusals.PipelineFull):
                self._stop_reading_requests()
            else:
                self._bad_request()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        except httptools.HttpParserUpgrade:  # a WebSocket (closing.py), else served as HTTP
            self._upgrade() if self._should_upgrade() else self._unsupported_upgrade_warning()
            return
        # Timers only for what this chunk left unfinished: most requests arrive whole in one
        # read and never arm one (the first byte came in this very call).
        if self._discarding:
            return
        if self._in_head:
            if self._head_bytes > self._limits.max_header_bytes:
                # A head this long that is still incomplete (the parser holds its partial line).
                self._refuse(refusals.head_too_large(self._limits.max_header_bytes))
            elif self._head_bytes and self._head_timer is None:
                self._head_timer = self.loop.call_later(
                    self._limits.header_timeout, self._head_timeout
                )
                if not self._responding():  # a next head, slow: it may be closed for room
                    self._enter_waiting()
        elif self._in_body and self._body_timer is None:
            self._body_started = self._body_seen = self.loop.time()
            self._body_timer = self.loop.call_later(self._limits.body_timeout, self._body_check)

    def _bad_request(self) -> None:
        """llhttp rejected the request (module doc, malformed requests)."""
        self.logger.warning("Invalid HTTP request received.")
        error = ClientError(
            "invalid HTTP request: a malformed request line, header or body chunk",
            code="bad_request",
        )
        if not self._in_body:
            self._refuse(refusals.Refusal(None, 400, error))
            return
        # A malformed body (a bad chunk): its request can never be whole, so its app is told the
        # client is gone; our 400 when nothing was answered yet, else just the close.
        cycle = self.cycle
        self._disconnect_all()
        if cycle is self._running and not cycle.response_started:
            self._answer(400, error)
        else:
            self.transport.close()

    def on_headers_complete(self) -> None:
        # Checked once the head is in, not per header line; until then `_head_bytes` bounds it.
        limits = self._limits
        if len(self.headers) > limits.max_headers:
            raise refusals.too_many_headers(limits.max_headers)
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > limits.max_header_bytes:
            raise refusals.head_too_large(limits.max_header_bytes)
        if len(self.pipeline) >= MAX_PIPELINED:
            raise refusals.PipelineFull()
        self._cancel_head_timer()
        self._leave_waiting()
        self._in_head = False
        self._head_bytes = 0
        self._in_body = True
        self._body_bytes = 0
        super().on_headers_complete()
        if self.parser.should_upgrade() and self._should_upgrade():
            return  # no cycle: the head goes to the WebSocket protocol (`_upgrade`)
        cycle = self.cycle
        # uvicorn closes the connection through the cycle's transport: ours lingers (closing.py).
        cycle.transport = self._cycle_transport
        # A response that starts before its request's body is in ends the connection (the rest
        # of the body is read and dropped, closing.py) and says so with `connection: close`:
        # without it, a client may write its next request into the connection we are closing.
        self._keep_alive_after_body = cycle.keep_alive
        cycle.keep_alive = False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and self._keep_alive_after_body:
            cycle.keep_alive = True
        self._in_body = False
        self._in_head = True
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        if not self._discarding and self._in_body and self._running is self.cycle:
            # Answered before its body was in (a 413, an early answer passed through): the
            # rest of the body is read and dropped, within bounds, and the connection closed.
            self._linger()
        if self._lingering:
            self.server_state.total_requests += 1  # what uvicorn's would count
            return
        super().on_response_complete()
        if self.transport.is_closing() or self._responding():
            return
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._answer(pending.status, pending.error)
        elif self._head_bytes:
            # The next request's head is arriving: its own timer rules, not keep-alive's.
            self._unset_keepalive_if_required()
            self._enter_waiting()
        elif not self._discarding:
            self._enter_idle()

    def shutdown(self) -> None:
        self._keep_alive_after_body = False  # a drain ends the connection after this answer
        super().shutdown()

    # -- limits ----------------------------------------------------------------------------

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._responding():
            # The client is being answered; a pipelined head behind it may wait for that.
            self._head_timer = self.loop.call_later(self._limits.header_timeout, self._head_timeout)
            return
        if not self._head_bytes:
            self.guard.observe("head_timeout")
            self._leave_waiting()
            self.transport.close()  # it never sent a byte: nobody to answer
            return
        self._refuse(refusals.head_timeout(self._limits.header_timeout))

    def _body_check(self) -> None:
        self._body_timer = None
        if not self._in_body or self._discarding:
            return
        limits = self._limits
        now = self.loop.time()
        if self.flow.read_paused:
            # We stopped reading (the app is not taking the body yet): the client is not late.
            self._body_started = self._body_seen = now
            self._body_bytes = 0
            self._body_timer = self.loop.call_later(limits.body_timeout, self._body_check)
            return
        # The next check is when a rule would trip if no byte came meanwhile, never later (a
        # check half a body_timeout on let a body trickling at 1 B/s live 45 s, not 30).
        due = idle_until = self._body_seen + limits.body_timeout
        if limits.body_min_rate:
            # Apache mod_reqtimeout's rule: by body_timeout + bytes received / body_min_rate
            # after the head, the body must have gone on arriving.
            slow_after = self._body_bytes / limits.body_min_rate
            due = min(due, self._body_started + limits.body_timeout + slow_after)
        if now < due:
            self._body_timer = self.loop.call_later(max(due - now, 0.01), self._body_check)
            return
        if now >= idle_until:
            problem = f"no data for {limits.body_timeout:g} s"
        else:
            problem = f"arriving slower than {limits.body_min_rate} bytes/s"
        self.guard.observe("body_timeout")
        cycle = self.cycle
        if cycle is self._running and not cycle.response_started:
            # The app waits for the body: it gets `http.disconnect` (its sends are dropped from
            # now on) and the client our 408.
            self._disconnect_all()
            error = ClientError(
                f"the request body was not received in time: {problem}",
                status=408,
                code="request_timeout",
            )
            self._answer(408, error)
        else:
            # A response is already under way (or queued ahead): nothing more can be said.
            self._disconnect_all()
            self.transport.close()

    def _refuse(self, refusal: refusals.Refusal) -> None:
        """Answer a request we stopped parsing: now, or after the responses ahead of it."""
        if refusal.kind is not None:
            self.guard.observe(refusal.kind)
        if self._responding():
            self._pending = refusal
            self._discarding = True
            self._cancel_timers()
            return
        self._answer(refusal.status, refusal.error)

    def _stop_reading_requests(self) -> None:
        """Too many pipelined requests: answer those queued, the last one closing (module doc)."""
        self.guard.observe("pipeline_full")
        self._discarding = True
        self._cancel_timers()
        newest, _app = self.pipeline[0]  # uvicorn queues with appendleft
        newest.keep_alive = False

    def _disconnect_all(self) -> None:
        for cycle in self._cycles():
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.message_event.set()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_head_timer()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
