"""The proxy's ASGI app: one declarative list of routes, the middleware and the lifespan, over
the `Services` built once per app (services.py).

    POST /v1/responses                    repaired, or passed on (routes/responses.py)
    GET /v1/responses + Upgrade           a WebSocket session of turns (routes/websocket.py)
    /v1/responses/input_tokens, /v1/responses/{id}…   the stored responses (routes/stored.py)
    POST /v1/responses/compact            a compaction (routes/compact.py)
    /v1/conversations…                    conversations and their items (routes/conversations.py)
    GET /healthz, /readyz, /metrics       the probes (routes/probes.py)
    anything else                         to upstream untouched (routes/passthrough.py)

Every request first goes through `ForwardingMiddleware` (http/forwarding.py): the forwarding
headers are set from the connection, never taken from the client. With tracing on, then
`ServerSpans` (http/spans.py) opens its server span.
"""

from __future__ import annotations

from typing import Unpack

from openai_harmony import HarmonyEncoding
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount, Route, WebSocketRoute, request_response

from proxy.config.settings import Settings
from proxy.server.http.forwarding import ForwardingMiddleware
from proxy.server.http.spans import ServerSpans
from proxy.server.lifespan import lifespan
from proxy.server.routes import (
    compact,
    conversations,
    passthrough,
    probes,
    responses,
    stored,
    websocket,
)
from proxy.server.routes.answers import Counted
from proxy.server.services import Seams, build_services

_ONE = "/v1/responses/{response_id}"
_CONVERSATION = "/v1/conversations/{conversation_id}"
_ITEM = _CONVERSATION + "/items/{item_id}"


def create_app(settings: Settings, encoding: HarmonyEncoding, **seams: Unpack[Seams]) -> Starlette:
    """The proxy for `settings` (its `upstream_url` set). Every seam is a keyword (`Seams`:
    the upstream transport, the metrics registry, ids and clocks, the shared state, the
    logger, the renderer, the reasoning keys, the response store); the rest default.

    `app.state.services` holds what the routes share; `app.state.proxy` (the `ServerState`),
    `.metrics`, `.registry` and `.renderer` are the parts the runner and tests read."""
    services = build_services(settings, encoding, **seams)
    tracing = services.deps.tracing
    # With the store off, stored response ids are upstream's business (the last route).
    stored_routes = [
        Route(_ONE, stored.retrieve, methods=["GET"]),
        Route(_ONE, stored.delete, methods=["DELETE"]),
        Route(_ONE + "/input_items", stored.input_items, methods=["GET"]),
        Route(_ONE + "/cancel", stored.cancel, methods=["POST"]),
    ]
    app = Starlette(
        routes=[
            WebSocketRoute("/v1/responses", Counted(websocket.session)),
            Route("/v1/responses", Counted(responses.create), methods=None),
            Route("/v1/responses/input_tokens", stored.input_tokens, methods=["POST"]),
            # Counted: the drain waits for a compaction's pass as for any response.
            Route(
                "/v1/responses/compact",
                Counted(request_response(compact.compact)),
                methods=["POST"],
            ),
            *(stored_routes if services.stateful is not None else []),
            Route("/v1/conversations", conversations.create, methods=["POST"]),
            Route(_CONVERSATION, conversations.retrieve, methods=["GET"]),
            Route(_CONVERSATION, conversations.update, methods=["POST"]),
            Route(_CONVERSATION, conversations.delete, methods=["DELETE"]),
            Route(_CONVERSATION + "/items", conversations.list_items, methods=["GET"]),
            Route(_CONVERSATION + "/items", conversations.append, methods=["POST"]),
            Route(_ITEM, conversations.retrieve_item, methods=["GET"]),
            Route(_ITEM, conversations.delete_item, methods=["DELETE"]),
            Route("/healthz", probes.healthz, methods=["GET"]),
            Route("/readyz", probes.readyz, methods=["GET"]),
            Route("/metrics", probes.metrics, methods=["GET"]),
            WebSocketRoute("/{path:path}", websocket.elsewhere),
            Mount("/", Counted(passthrough.everything_else)),
        ],
        middleware=[
            Middleware(ForwardingMiddleware, trusted_proxies=settings.trusted_proxies),
            # tracing off: no span middleware at all (proxy/tracing.py)
            *([] if tracing is None else [Middleware(ServerSpans, tracing=tracing)]),
        ],
        lifespan=lifespan,
    )
    app.state.services = services
    app.state.proxy = services.state
    app.state.metrics = services.metrics
    app.state.registry = services.registry
    app.state.renderer = services.renderer
    return app
