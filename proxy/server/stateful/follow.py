"""A stored response's events as SSE: replayed from the store after a sequence number, then
followed live until its terminal event — wherever it runs (any process or replica sharing the
store). `GET /v1/responses/{id}?stream=true` answers with it, and so does a background create
with `stream: true` (a resume from the first event: the client that drops it stops nothing)."""

from __future__ import annotations

from starlette.types import Send

from proxy import sse
from proxy.errors import StoreUnavailableError
from proxy.harmony.history.stored import RUNNING, decode_events
from proxy.harmony.stream.events import TERMINAL_EVENTS
from proxy.server import asgi
from proxy.server.stateful.state import Stateful


async def follow(
    stateful: Stateful,
    scope_key: str,
    key: str,
    after: int,
    inbound: asgi.Inbound,
    send: Send,
    headers: list[tuple[bytes, bytes]],
) -> None:
    """Stream the events of the response `key` after sequence number `after` as SSE, then
    follow it live until its terminal event (module doc)."""
    store, settings = stateful.store, stateful.settings
    timed = asgi.with_send_timeout(send, settings.send_timeout)

    async def work() -> None:
        await timed(
            {"type": "http.response.start", "status": 200, "headers": [*asgi.SSE_HEADERS, *headers]}
        )
        last = after
        try:
            entries = await stateful.guard(store.read_log(key, after))
            while True:
                events = decode_events(entries, last)
                if events:
                    await timed(
                        {
                            "type": "http.response.body",
                            "body": sse.encode_all(events),
                            "more_body": True,
                        }
                    )
                    last = events[-1]["sequence_number"]
                    if events[-1]["type"] in TERMINAL_EVENTS:
                        break
                else:
                    # Quiet: is it still running somewhere? (ends it if its runner is gone)
                    loaded = await stateful.load(scope_key, key)
                    if loaded is None:
                        break  # deleted meanwhile
                    entries = await stateful.guard(store.read_log(key, last))
                    if not entries and loaded.response["status"] not in RUNNING:
                        break
                    if not entries:
                        await timed(
                            {"type": "http.response.body", "body": sse.KEEPALIVE, "more_body": True}
                        )
                    else:
                        continue
                entries = await stateful.guard(
                    store.wait_log(key, last, settings.keepalive_interval)
                )
        except StoreUnavailableError as error:
            event = {"type": "error", "code": error.code, "message": error.message, "param": None}
            await timed(
                {"type": "http.response.body", "body": sse.encode(event), "more_body": True}
            )
        await timed({"type": "http.response.body", "body": b"", "more_body": False})

    try:
        await asgi.run_until_disconnect(inbound, work())
    except OSError:  # the client's socket died, or it stopped reading: it can resume later
        return
