"""The hosted-tool loop's answer: its events written to a sink (SSE over HTTP, one message per
event over a WebSocket, or nowhere for `stream: false`, whose route answers the final response
as JSON); the stored copy written on the way (the terminal batch stored before the client sees
it)."""

from __future__ import annotations

from typing import Any

from proxy.harmony.stream.events import TERMINAL_EVENTS
from proxy.server.exchange import Exchange
from proxy.server.hosted.loop import Loop
from proxy.server.sink import EventSink


async def answer(loop: Loop, exchange: Exchange, sink: EventSink, *, generate: bool = True) -> None:
    """Run `loop`, its events to `sink`; `exchange` (the first pass's) carries the outcome the
    route counts and logs, the final snapshot, and the stored copy's recorder. `generate=False`:
    the response is settled without an upstream pass (a WebSocket warm-up)."""
    recorder = exchange.recorder
    started = False

    async def emit(events: list[dict[str, Any]]) -> None:
        nonlocal started
        if recorder is not None and events:
            if events[-1]["type"] in TERMINAL_EVENTS:
                await recorder.finish(events)
            else:
                recorder.add(events)
        if not started:
            started = True
            await sink.open()
        if events:
            await sink.events(events)
        else:
            await sink.keepalive()

    try:
        await loop.run(emit, generate=generate)
    finally:
        if recorder is not None and not recorder.finished:
            await recorder.finish(loop.cancelled(), wait=False)
    exchange.snapshot = loop.snapshot
    await sink.close()
