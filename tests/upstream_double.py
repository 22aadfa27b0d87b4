"""A scripted stand-in for trtllm-serve, for live tests that need exact control.

It answers `/v1/completions` streams from a script (frames, pauses, garbage, cuts, statuses, heads
of its choosing), the probe, `/health`, `/v1/models`, plus echo and SSE routes for pass-through
tests, and records every request and when its client (the proxy) went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

MODEL = "openai/gpt-oss-120b"
Step = tuple[Any, ...]


def frame(token_ids: Sequence[int], finish: str | None = None, stop: int | None = None) -> bytes:
    choice = {
        "index": 0,
        "text": "",
        "token_ids": list(token_ids),
        "finish_reason": finish,
        "stop_reason": stop,
    }
    return (
        b"data: "
        + orjson.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})
        + b"\n\n"
    )


def script_for(
    ids: Sequence[int],
    interval: int = 20,
    *,
    finish: str = "stop",
    stop: int | None = None,
    pause: float = 0.0,
) -> list[Step]:
    """trtllm-serve's grouping: 1 token, then `interval` at a time; finish on the last frame."""
    groups = [list(ids[:1])] + [list(ids[i : i + interval]) for i in range(1, len(ids), interval)]
    steps: list[Step] = []
    for number, group in enumerate(groups):
        if pause:
            steps.append(("sleep", pause))
        last = number == len(groups) - 1
        steps.append(("frame", group, finish if last else None, stop if last else None))
    steps += [("usage", len(ids)), ("done",)]
    return steps


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    disconnected: bool = False
    #: The client and scheme as this server's uvicorn made them out: like trtllm-serve's, it
    #: believes `X-Forwarded-For`/`-Proto` from 127.0.0.1 (its default `forwarded_allow_ips`).
    client: str = ""
    scheme: str = ""

    def json(self) -> Any:
        return orjson.loads(self.body)


class UpstreamDouble:
    """An ASGI app; set `script` (used by every completion stream) before a request."""

    def __init__(self) -> None:
        self.script: list[Step] = script_for([200005, 17196, 200008, 12194, 13, 200002])
        #: Scripts for the next streams, in order of arrival (then `script` again).
        self.queue: list[list[Step]] = []
        self.capable = True
        self.healthy = True
        self.seen: list[Seen] = []

    def completions(self) -> list[Seen]:
        return [s for s in self.seen if s.path == "/v1/completions" and b'"stream":true' in s.body]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen = Seen(
            scope["method"],
            scope["path"],
            scope["query_string"].decode(),
            {k.decode(): v.decode() for k, v in scope["headers"]},
            body,
            client=scope["client"][0] if scope.get("client") else "",
            scheme=scope.get("scheme", ""),
        )
        self.seen.append(seen)
        watcher = asyncio.ensure_future(self._watch(receive, seen))
        route = asyncio.ensure_future(self._route(scope, seen, send))
        try:
            # like trtllm-serve, abort the generation when the client (the proxy) goes away
            await asyncio.wait({route, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not route.done():
                route.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await route
            else:
                await route
        finally:
            seen.ended = seen.ended or time.monotonic()
            watcher.cancel()

    async def _watch(self, receive: Receive, seen: Seen) -> None:
        message = await receive()
        if message["type"] == "http.disconnect" and seen.ended is None:
            seen.disconnected = True
            seen.ended = time.monotonic()

    async def _route(self, scope: Scope, seen: Seen, send: Send) -> None:
        path = scope["path"]
        if path == "/health":
            await _json(send, 200 if self.healthy else 503, {})
        elif path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif path == "/v1/completions":
            request = seen.json()
            if request.get("stream"):
                await self._stream(send, seen)
            else:
                choice: dict[str, Any] = {"index": 0, "text": "", "finish_reason": "length"}
                if self.capable:
                    choice["token_ids"] = [200005]
                await _json(send, 200, {"id": "cmpl-p", "choices": [choice]})
        elif path == "/stall":  # a head that never comes (within any test)
            await asyncio.sleep(60)
            await _json(send, 200, {})
        elif path == "/sse":
            options = dict(_query(seen.query))
            count, pause = int(options.get("count", "3")), float(options.get("pause", "0.2"))
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            for number in range(count):
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: %d\n\n" % number,
                        "more_body": True,
                    }
                )
                await asyncio.sleep(pause)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        else:  # echo what arrived
            await _json(
                send,
                int(dict(_query(seen.query)).get("status", "200")),
                {
                    "method": seen.method,
                    "path": path,
                    "query": seen.query,
                    "headers": seen.headers,
                    "body": seen.body.decode("latin-1"),
                },
                extra=[
                    (b"x-upstream", b"double"),
                    (b"connection", b"x-drop-me"),
                    (b"x-drop-me", b"1"),
                ],
            )

    async def _stream(self, send: Send, seen: Seen) -> None:
        started = False
        for step in self.queue.pop(0) if self.queue else self.script:
            kind = step[0]
            if kind == "status":
                await _json(send, step[1], step[2])
                return
            if kind == "sleep":
                await asyncio.sleep(step[1])
                continue
            if kind == "cut":
                raise ConnectionAbortedError("scripted cut")  # uvicorn drops the connection
            if kind == "start":  # a head of our choosing: ("start", status, [(name, value)])
                await send({"type": "http.response.start", "status": step[1], "headers": step[2]})
                started = True
                continue
            if not started:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
                    }
                )
                started = True
            if kind == "frame":
                chunk = frame(step[1], step[2], step[3])
            elif kind == "raw":
                chunk = step[1]
            elif kind == "usage":
                chunk = (
                    b"data: "
                    + orjson.dumps(
                        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": step[1]}}
                    )
                    + b"\n\n"
                )
            elif kind == "done":
                chunk = b"data: [DONE]\n\n"
            else:
                raise AssertionError(f"unknown step {step}")
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if not started:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _query(query: str) -> list[tuple[str, str]]:
    return [tuple(part.split("=", 1)) for part in query.split("&") if "=" in part]  # type: ignore[misc]


async def _json(
    send: Send, status: int, body: Any, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *extra],
        }
    )
    await send({"type": "http.response.body", "body": payload})
