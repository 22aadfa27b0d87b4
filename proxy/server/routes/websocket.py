"""`GET /v1/responses` upgraded to a WebSocket: a session of `response.create` turns, each
answered with the events of the SSE stream, one JSON text message per event.

The connection itself — handshake under the HTTP guard's head limits, message size limit,
ping/pong, a client that stops reading — is the guard's and uvicorn's (http/upgrade.py). Here:

    response.create   the fields of `POST /v1/responses` (`stream` implicit; `background`
                      refused; `stream_id` echoed in the turn's events) → a turn
                      (routes/turn.py): the decisions of the HTTP route, its body budget, the
                      same admission and exchange, counted and logged per response as over
                      HTTP with `transport: ws`
    a second one      while a turn runs: an `error` event (`websocket_stream_limit_reached`);
                      turns run one at a time
    anything else     bad JSON, a binary message, an unknown `type`: an `error` event, the
                      session goes on
    refusals          every error before a turn's first event is an `error` event
                      (`ResponseWsError`: `status` and `error`)

The session keeps its last response (harmony/history/session.py): a stored one as its id (it is
continued through the store, as over HTTP), an unstored one as its history when that fits
`ws_max_message_bytes`, merged into a turn naming it in `previous_response_id`. Nothing kept
outlives the connection, and the store is read with the credential of the handshake.

The session ends on the client's close or disconnect (the turn running ends as a request over
HTTP ends when its client goes: its compaction pass, MCP planning or upstream request cancelled,
counted as a disconnect); after `ws_idle_timeout` without a response starting or ending (close
1000: messages that start none — junk, refused turns — keep no session open); and on the drain:
the turn running ends with its terminal event, new turns are refused, then close 1001.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from proxy.errors import ClientError, ProxyError, UnavailableError
from proxy.metrics.websocket import WebSocketMetrics
from proxy.server.deps import SHUTTING_DOWN
from proxy.server.routes.answers import services_in
from proxy.server.routes.turn import Turns
from proxy.server.services import Services
from proxy.server.sink import WebSocketSink

#: Close codes: normal (idle), going away (the drain).
NORMAL, GOING_AWAY = 1000, 1001
#: The error code of a `response.create` while a turn runs (the spec's WebSocket error).
BUSY = "websocket_stream_limit_reached"
_STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
#: Envelope fields of `response.create` that are not `POST /v1/responses` fields.
_ENVELOPE = ("type", "stream_id", "stream", "generate")
#: Seconds a turn has to end by itself once its client went, before it is cancelled.
_END_GRACE = 1.0


async def session(scope: Scope, receive: Receive, send: Send) -> None:
    """The WebSocket route (module doc)."""
    if (await receive())["type"] != "websocket.connect":
        return
    services = services_in(scope)
    await send({"type": "websocket.accept"})
    if services.state.draining:
        await WebSocketSink(send).error(_shutting_down())
        await send({"type": "websocket.close", "code": GOING_AWAY})
        return
    metrics = services.websocket
    run = Session(services, scope, send, metrics)
    metrics.sessions.inc()
    try:
        await run.serve(receive)
    finally:
        metrics.sessions.dec()
        metrics.turns.observe(run.turns.count)


class Session:
    """One WebSocket session (module doc)."""

    def __init__(
        self, services: Services, scope: Scope, send: Send, metrics: WebSocketMetrics
    ) -> None:
        self.services = services
        self._send = send
        self.metrics = metrics
        self._loop = asyncio.get_running_loop()
        self.turn: asyncio.Task[None] | None = None
        self.turns = Turns(services, scope, send, metrics, self._loop.time)

    async def serve(self, receive: Receive) -> None:
        state, settings = self.services.state, self.services.settings
        loop = self._loop
        receiving: asyncio.Future[Any] = asyncio.ensure_future(receive())
        drain: asyncio.Future[Any] = asyncio.ensure_future(state.drain_started.wait())
        try:
            while True:
                waits = {receiving, drain} if self.turn is None else {receiving, drain, self.turn}
                idle = None  # no idle clock while a turn runs
                if self.turn is None:  # only a response resets it (module doc)
                    idle = max(0.0, self.turns.active + settings.ws_idle_timeout - loop.time())
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
            if self.turn is not None:  # the client went: the turn ends, and its upstream request
                await self._end_turn(self.turn)
            self.turns.forget()

    async def _end_turn(self, turn: asyncio.Task[None]) -> None:
        """The client went while `turn` ran: the turn sees it (`Turns.closed`) and ends as a
        request over HTTP ends when its client goes — its compaction pass, MCP planning or
        answer cancelled, counted as a disconnect. A turn still in a step that does not watch
        (the body budget, the first probe, the store, the render; none talks to upstream) is
        cancelled after `_END_GRACE`."""
        self.turns.closed.close()
        await asyncio.wait({turn}, timeout=_END_GRACE)
        turn.cancel()
        await asyncio.gather(turn, return_exceptions=True)

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
        size = len(text) if text.isascii() else len(text.encode())  # the message's bytes
        self.turn = asyncio.create_task(
            self.turns.run(body, stream_id, size=size, generate=generate)
        )

    async def _error(self, error: ProxyError, stream_id: str | None) -> None:
        await self.turns.error(error, stream_id)


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
