"""The hosted-tool loop's answer: its events as one SSE stream, or the final response as JSON;
the stored copy written on the way (the terminal batch stored before the client sees it)."""

from __future__ import annotations

from typing import Any

from starlette.types import Send

from proxy import sse
from proxy.server import asgi
from proxy.server.exchange import Exchange
from proxy.server.hosted.loop import Loop

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


async def answer(loop: Loop, exchange: Exchange, send: Send, *, stream: bool) -> None:
    """Run `loop` for the route; `exchange` (the first pass's) carries the outcome the route
    counts and logs, and the stored copy's recorder."""
    recorder = exchange.recorder
    started = False
    request_id = [(b"x-request-id", exchange.request_id.encode())]

    async def emit(events: list[dict[str, Any]]) -> None:
        nonlocal started
        if recorder is not None and events:
            if events[-1]["type"] in _TERMINAL:
                await recorder.finish(events)
            else:
                recorder.add(events)
        if not stream:
            return
        if not started:
            started = True
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*asgi.SSE_HEADERS, *request_id],
                }
            )
        body = sse.encode_all(events) if events else sse.KEEPALIVE
        await send({"type": "http.response.body", "body": body, "more_body": True})

    try:
        await loop.run(emit)
    finally:
        if recorder is not None and not recorder.finished:
            await recorder.finish(loop.cancelled(), wait=False)
    exchange.snapshot = loop.snapshot
    if stream:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    else:
        assert loop.snapshot is not None
        await asgi.send_json(send, 200, loop.snapshot, request_id)
    exchange.delivered = True
