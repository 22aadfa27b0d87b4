"""Where a repaired stream's events go: the seam between the exchange's pump (exchange.py) and
the transport that carries the events to the client.

    open()          upstream answered: the stream begins (SSE: the response head)
    events(batch)   the events of one upstream frame, in order
    keepalive()     nothing to say for a while (SSE: a comment line)
    close()         after the terminal event (SSE: the end of the body)

`SseSink` writes server-sent events on an HTTP response; `WebSocketSink` writes one JSON text
message per event on a WebSocket (routes/websocket.py, routes/turn.py), the pings of the
WebSocket protocol keeping it alive, and a refusal as the spec's `error` event (`error`);
`NO_SINK` is a run with no client (a background response). `Recording` is the other place
the events go, for a stored response: its copy in the store.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson
from starlette.types import Send

from proxy import sse
from proxy.errors import ProxyError
from proxy.server import asgi


class EventSink(Protocol):
    """The four steps of a stream's way out (module doc)."""

    async def open(self) -> None: ...

    async def events(self, events: list[dict[str, Any]]) -> None: ...

    async def keepalive(self) -> None: ...

    async def close(self) -> None: ...


class SseSink:
    """Server-sent events on the HTTP response of `send`, one send per batch."""

    def __init__(self, send: Send, request_id: str) -> None:
        self._send = send
        self._request_id = request_id

    async def open(self) -> None:
        headers = [*asgi.SSE_HEADERS, (b"x-request-id", self._request_id.encode())]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def events(self, events: list[dict[str, Any]]) -> None:
        body = sse.encode_all(events)
        await self._send({"type": "http.response.body", "body": body, "more_body": True})

    async def keepalive(self) -> None:
        await self._send({"type": "http.response.body", "body": sse.KEEPALIVE, "more_body": True})

    async def close(self) -> None:
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})


class WebSocketSink:
    """One JSON text message per event on the WebSocket of `send`; with a `stream_id`, each
    event echoes it. `sent` counts the messages."""

    def __init__(self, send: Send, stream_id: str | None = None) -> None:
        self._send = send
        self._stream_id = stream_id
        self.sent = 0

    async def open(self) -> None:
        return None

    async def events(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if self._stream_id is not None:
                event = {**event, "stream_id": self._stream_id}
            await self._send({"type": "websocket.send", "text": orjson.dumps(event).decode()})
            self.sent += 1

    async def keepalive(self) -> None:
        return None  # the WebSocket's own ping/pong keeps the connection alive

    async def error(self, error: ProxyError) -> None:
        """A refusal before any event of the response: an `error` event (the spec's
        `ResponseWsError`: `status` and the OpenAI error body), with the `stream_id`."""
        event: dict[str, Any] = {"type": "error", "status": error.status, **error.to_body()}
        await self.events([event])

    async def close(self) -> None:
        return None


class _NoSink:
    """A run with no client: every event is dropped (the recorder keeps them)."""

    async def open(self) -> None:
        return None

    async def events(self, events: list[dict[str, Any]]) -> None:
        return None

    async def keepalive(self) -> None:
        return None

    async def close(self) -> None:
        return None


NO_SINK: EventSink = _NoSink()


class Recording(Protocol):
    """Where the events of a stored response go as they are written: the exchange's stored copy
    (`Recorder`, stateful/recording.py, made by the route or the background run)."""

    @property
    def finished(self) -> bool: ...

    def add(self, events: list[dict[str, Any]]) -> None:
        """A batch of events, not the last."""

    async def finish(self, events: list[dict[str, Any]], *, wait: bool = True) -> None:
        """The terminal batch: stored before the client sees it when `wait`."""

    def end(self, events: list[dict[str, Any]]) -> bool:
        """The terminal batch handed over; True when `stored()` is to be awaited before the
        client sees its terminal event."""

    async def stored(self) -> None:
        """Until what `end` handed over is stored (or failed, logged)."""
