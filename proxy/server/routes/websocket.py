"""`GET /v1/responses` upgraded to a WebSocket: a session of `response.create` turns, each
answered with the events of the SSE stream, one JSON text message per event.

The connection itself — handshake under the HTTP guard's head limits, message size limit,
ping/pong, a client that stops reading — is the guard's and uvicorn's (http/upgrade.py). Here:

    response.create   the fields of `POST /v1/responses` (`stream` implicit; `background`
                      refused; `stream_id` echoed in the turn's events) → the same path as
                      over HTTP (routes/repair.py `admit`, exchange.py), events written by a
                      `WebSocketSink`; counted and logged per response as over HTTP, with
                      `transport: ws`; hosted MCP tools run in the same loop
                      (server/hosted/)
    a second one      while a turn runs: an `error` event (`websocket_stream_limit_reached`);
                      turns run one at a time
    anything else     bad JSON, a binary message, an unknown `type`: an `error` event, the
                      session goes on
    refusals          every error before a turn's first event is an `error` event
                      (`ResponseWsError`: `status` and `error`)

The session keeps its last response, stored or not: a `previous_response_id` naming it is
merged here from what the session kept, also with `store: false` (a stored one goes through the
store, as over HTTP). Nothing kept outlives the connection, and the store is read with the
credential of the handshake. The session ends on the client's close or disconnect (the turn
running is cancelled, and with it its upstream request), after `ws_idle_timeout` without a turn
or a message (close 1000), and on the drain: the turn running ends with its terminal event, new
turns are refused, then close 1001.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from proxy.errors import ClientError, ProxyError, UnavailableError, UpstreamError
from proxy.harmony.history import chain as history
from proxy.metrics.websocket import WebSocketMetrics
from proxy.server.deps import SHUTTING_DOWN
from proxy.server.hosted.hosting import Hosting
from proxy.server.outcome import outcome_of, report
from proxy.server.routes.answers import count_refusal, services_in
from proxy.server.routes.repair import Admitted, admit, refused_outcome
from proxy.server.services import Services
from proxy.server.sink import WebSocketSink
from proxy.server.stateful.scope import scope_of

#: Close codes: normal (idle), going away (the drain).
NORMAL, GOING_AWAY = 1000, 1001
#: The error code of a `response.create` while a turn runs (the spec's WebSocket error).
BUSY = "websocket_stream_limit_reached"
_STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
#: Envelope fields of `response.create` that are not `POST /v1/responses` fields.
_ENVELOPE = ("type", "stream_id", "stream", "generate")


async def session(scope: Scope, receive: Receive, send: Send) -> None:
    """The WebSocket route (module doc)."""
    if (await receive())["type"] != "websocket.connect":
        return
    services = services_in(scope)
    await send({"type": "websocket.accept"})
    if services.state.draining:
        await _send_error(send, _shutting_down(), None)
        await send({"type": "websocket.close", "code": GOING_AWAY})
        return
    metrics = services.websocket
    run = Session(services, scope, send, metrics)
    metrics.sessions.inc()
    try:
        await run.serve(receive)
    finally:
        metrics.sessions.dec()
        metrics.turns.observe(run.turns)


@dataclass
class _Last:
    """The session's last response: its id, whether the store has it, and its context (the
    input it was made from, then its output)."""

    response_id: str
    stored: bool
    items: list[Any]


class Session:
    """One WebSocket session (module doc)."""

    def __init__(
        self, services: Services, scope: Scope, send: Send, metrics: WebSocketMetrics
    ) -> None:
        self.services = services
        # The handshake's own headers are not the turns' (never forwarded upstream).
        headers = [(n, v) for n, v in scope["headers"] if not n.startswith(b"sec-websocket-")]
        self.scope = {**scope, "headers": headers}
        self._send = send
        self.metrics = metrics
        self.scope_key = scope_of(scope["headers"], services.settings.store_scope_header)
        self.turn: asyncio.Task[None] | None = None
        self.turns = 0
        self.last: _Last | None = None

    async def serve(self, receive: Receive) -> None:
        state, settings = self.services.state, self.services.settings
        loop = asyncio.get_running_loop()
        receiving: asyncio.Future[Any] = asyncio.ensure_future(receive())
        drain: asyncio.Future[Any] = asyncio.ensure_future(state.drain_started.wait())
        try:
            while True:
                waits = {receiving, drain} if self.turn is None else {receiving, drain, self.turn}
                idle = settings.ws_idle_timeout if self.turn is None else None
                done, _ = await asyncio.wait(waits, timeout=idle, return_when="FIRST_COMPLETED")
                if not done:
                    await self._close(NORMAL, "idle timeout")
                    return
                if self.turn is not None and self.turn.done():
                    turn, self.turn = self.turn, None
                    turn.result()  # a turn ends by itself; a bug in it is not swallowed
                if drain in done:
                    drain = loop.create_future()  # seen: never again
                if state.draining and self.turn is None:
                    await self._close(GOING_AWAY, "the proxy is shutting down")
                    return
                if receiving in done:
                    message = receiving.result()
                    if message["type"] == "websocket.disconnect":
                        return
                    receiving = asyncio.ensure_future(receive())
                    await self._on_message(message)
        except OSError:  # the client's socket died, or it stopped reading (http/upgrade.py)
            return
        finally:
            receiving.cancel()
            drain.cancel()
            if self.turn is not None:  # the client went: its upstream request ends now
                self.turn.cancel()
                await asyncio.gather(self.turn, return_exceptions=True)

    async def _close(self, code: int, reason: str) -> None:
        await self._send({"type": "websocket.close", "code": code, "reason": reason})

    # -- client messages ---------------------------------------------------------------------

    async def _on_message(self, message: dict[str, Any]) -> None:
        self.metrics.messages.labels("in").inc()
        text = message.get("text")
        event: Any = None
        try:
            if text is None:
                raise ClientError("send JSON text messages; binary messages are not accepted")
            try:
                event = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise ClientError("the message is not valid JSON", code="invalid_json") from None
            stream_id = _stream_id(event)
            if not isinstance(event, dict) or event.get("type") != "response.create":
                kind = event.get("type") if isinstance(event, dict) else None
                shown = repr(kind)[:80] if kind is not None else "none"
                raise ClientError(
                    f"unknown client event type {shown}: this server accepts 'response.create'",
                    param="type",
                    code="unknown_event_type",
                )
            if self.services.state.draining:
                raise _shutting_down()
            if self.turn is not None:
                raise ClientError(
                    "a response is already running on this WebSocket connection; send the next "
                    "response.create after its terminal event, or open another connection",
                    param="stream_id" if stream_id is not None else None,
                    code=BUSY,
                )
            if not isinstance(event.get("generate", True), bool):
                raise ClientError(
                    "generate must be a boolean", param="generate", code="invalid_type"
                )
            if event.get("background") is True:
                raise ClientError(
                    "background is not supported over WebSocket; use POST /v1/responses",
                    param="background",
                    code="unsupported_parameter",
                )
        except ProxyError as error:
            sid = event.get("stream_id") if isinstance(event, dict) else None
            await self._error(error, sid if isinstance(sid, str) else None)
            return
        body = {key: value for key, value in event.items() if key not in _ENVELOPE}
        body["stream"] = True
        generate = event.get("generate") is not False
        self.turn = asyncio.create_task(self._run_turn(body, stream_id, generate=generate))

    # -- a turn ------------------------------------------------------------------------------

    async def _run_turn(
        self, body: dict[str, Any], stream_id: str | None, *, generate: bool = True
    ) -> None:
        tracing = self.services.deps.tracing
        if tracing is None:
            await self._turn(body, stream_id, generate=generate)
            return
        # A turn is a response of its own: a trace of its own, linked to the handshake's span.
        with tracing.linked("chat"):
            await self._turn(body, stream_id, generate=generate)

    async def _turn(self, body: dict[str, Any], stream_id: str | None, *, generate: bool) -> None:
        services = self.services
        deps, state = services.deps, services.state
        started = services.monotonic()
        request_id = deps.ids("req")
        if deps.tracing is not None:
            deps.tracing.genai_request(body, request_id)
        model = str(body.get("model"))
        sent = body
        continued: str | None = None
        last, previous = self.last, body.get("previous_response_id")
        if (
            last is not None
            and previous == last.response_id
            and not last.stored
            and body.get("conversation") is None  # both: refused as over HTTP
        ):
            sent = history.merged_body(body, last.items)
            continued = last.response_id
        hosting = Hosting(services.hosted, deps.renderer)
        try:
            admitted = await admit(
                services,
                self.scope,
                sent,
                request_id,
                started,
                self.scope_key,
                previous_response_id=continued,
                hosting=hosting,
            )
        except ProxyError as error:
            count_refusal(
                services,
                error,
                request_id,
                started,
                outcome=refused_outcome(error),
                stream="true",
                model=model,
                transport="ws",
            )
            await self._error(error, stream_id)
            return
        exchange = admitted.exchange
        sink = WebSocketSink(self._send, stream_id)
        if not generate and hosting.plan is None:
            await self._warm_up(admitted, sink, model, body, sent)
            return
        state.in_flight += 1
        deps.metrics.in_flight.inc()
        outcome = "client_disconnect"
        try:
            try:
                if hosting.plan is not None:  # hosted MCP tools: the loop, as over HTTP
                    await hosting.answer(exchange, sink, generate=generate)
                else:
                    await exchange.stream(sink)
                outcome = outcome_of(exchange)
            except ProxyError as error:  # upstream refused it before the first event
                exchange.status, exchange.error_code = error.status, error.code
                outcome = refused_outcome(error)
                if isinstance(error, UpstreamError) and error.code:
                    kind = "timeout" if error.code == "upstream_timeout" else error.code
                    deps.metrics.upstream_errors.labels(kind).inc()
                await self._error(error, stream_id)
            except OSError:  # the client went, or stopped reading
                if exchange.delivered:
                    outcome = outcome_of(exchange)
                else:
                    deps.metrics.disconnects.labels(exchange.phase).inc()
        except asyncio.CancelledError:
            if not exchange.delivered:
                deps.metrics.disconnects.labels(exchange.phase).inc()
            raise
        finally:
            state.in_flight -= 1
            deps.metrics.in_flight.dec()
            if exchange.recorder is not None and not exchange.recorder.finished:
                await exchange.recorder.finish(exchange.settle(), wait=False)
            self.metrics.messages.labels("out").inc(sink.sent)
            self.turns += 1
            report(deps, exchange, outcome, "true", model, body, transport="ws")
        self._keep(admitted, sent)

    async def _warm_up(
        self,
        admitted: Admitted,
        sink: WebSocketSink,
        model: str,
        body: dict[str, Any],
        sent: dict[str, Any],
    ) -> None:
        """`generate: false`: the request is validated and rendered, nothing is generated (no
        upstream request); a completed response without output, which later turns may continue
        with `previous_response_id`."""
        exchange = admitted.exchange
        events = exchange.core.start() + exchange.core.finish("stop", output_tokens=0)
        exchange.phase = "streaming"
        exchange.snapshot = events[-1]["response"]
        outcome = "client_disconnect"
        try:
            if exchange.recorder is not None:
                await exchange.recorder.finish(events)
            await sink.events(events)
            exchange.delivered = True
            outcome = outcome_of(exchange)
        except OSError:  # the client went
            pass
        finally:
            self.metrics.messages.labels("out").inc(sink.sent)
            self.turns += 1
            report(self.services.deps, exchange, outcome, "true", model, body, transport="ws")
        self._keep(admitted, sent)

    def _keep(self, admitted: Admitted, sent: dict[str, Any]) -> None:
        """Keep the turn's response as the session's last, when it ended well."""
        exchange = admitted.exchange
        snapshot = exchange.snapshot
        if snapshot is not None and snapshot.get("status") in ("completed", "incomplete"):
            made_from = admitted.context.body if admitted.context is not None else sent
            self.last = _Last(
                exchange.response_id,
                stored=admitted.context is not None and admitted.context.store,
                items=[*_as_items(made_from.get("input")), *(snapshot.get("output") or [])],
            )

    async def _error(self, error: ProxyError, stream_id: str | None) -> None:
        await _send_error(self._send, error, stream_id)
        self.metrics.messages.labels("out").inc()


async def _send_error(send: Send, error: ProxyError, stream_id: str | None) -> None:
    """An `error` event (the spec's `ResponseWsError`)."""
    event: dict[str, Any] = {"type": "error", "status": error.status, **error.to_body()}
    if stream_id is not None:
        event["stream_id"] = stream_id
    await send({"type": "websocket.send", "text": orjson.dumps(event).decode()})


def _stream_id(event: Any) -> str | None:
    """The event's `stream_id`, checked (None: absent)."""
    if not isinstance(event, dict) or "stream_id" not in event:
        return None
    value = event["stream_id"]
    if not isinstance(value, str) or not _STREAM_ID.fullmatch(value):
        raise ClientError(
            "stream_id must be 1 to 256 characters of A-Z, a-z, 0-9, '_', '.' and '-'",
            param="stream_id",
            code="invalid_value",
        )
    return value


def _as_items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def _shutting_down() -> UnavailableError:
    return UnavailableError(
        "the proxy is shutting down; open a new connection to another replica",
        code=SHUTTING_DOWN,
    )


class _Elsewhere:
    """A WebSocket handshake on any other path: refused (403 at the handshake)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] == "websocket.connect":
            await send({"type": "websocket.close", "code": 1008})


elsewhere = _Elsewhere()
