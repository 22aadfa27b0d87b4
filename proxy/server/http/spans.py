"""The server span of every HTTP request, when tracing is on (the app adds this middleware only
then: off, a request meets no span code at all).

A WebSocket session's span is its handshake's, open for the session; each turn has a span of
its own linked to it (`Tracing.linked`).

The span continues the client's W3C `traceparent`/`tracestate` and is current while the app
runs, so the routes' child spans hang under it and the upstream requests carry its trace. It
has the HTTP server semantic conventions' attributes (method, route, status, scheme, peer,
user agent); the repaired route renames it and adds the GenAI attributes (routes/repair.py,
outcome.py). A 5xx answer marks it failed with `error.type` the status code.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.logs import capped
from proxy.tracing import Tracing


class ServerSpans:
    """ASGI middleware: one SERVER span per HTTP request or WebSocket session (module doc)."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self._app = app
        self._tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self._app(scope, receive, send)
            return
        from opentelemetry.trace import StatusCode, use_span

        tracing = self._tracing
        method = scope.get("method", "GET")
        span = tracing.server_span(
            method, tracing.extract(scope["headers"]), request_attributes(scope)
        )
        status = 0

        async def traced_send(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
            elif kind == "websocket.accept":
                status = 101
            await send(message)

        try:
            with use_span(span, end_on_exit=False):
                await self._app(scope, receive, traced_send)
        finally:
            route = getattr(scope.get("route"), "path", None)
            if route and route != "/":  # the catch-all Mount has none
                span.set_attribute("http.route", route)
                if "gen_ai.operation.name" not in (getattr(span, "attributes", None) or {}):
                    span.update_name(f"{method} {route}")  # a GenAI span keeps its name
            if status:
                span.set_attribute("http.response.status_code", status)
            if status >= 500 or not status:
                span.set_attribute("error.type", str(status) if status else "no_response")
                span.set_status(StatusCode.ERROR)
            span.end()


def request_attributes(scope: Scope) -> dict[str, Any]:
    """The HTTP server span's request attributes (semantic conventions), client strings capped;
    never the query string (it may carry a key) or any header but the user agent and the id."""
    attributes: dict[str, Any] = {
        "http.request.method": scope.get("method", "GET"),
        "url.path": capped(scope["path"]),
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
    }
    client, server = scope.get("client"), scope.get("server")
    if client:
        attributes["client.address"] = client[0]
    if server:
        attributes["server.address"], attributes["server.port"] = server[0], server[1]
    for name, value in scope["headers"]:
        if name == b"user-agent":
            attributes["user_agent.original"] = capped(value.decode("latin-1"))
        elif name == b"x-request-id":
            attributes["proxy.request_id"] = capped(value.decode("latin-1"))
    return attributes
