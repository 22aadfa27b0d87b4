"""The WebSocket sessions of `GET /v1/responses` (routes/websocket.py), counted on the same
injected registry as `Metrics` (serving.py). Each response of a session is counted and logged
like one over HTTP, by `Metrics` (its log line says `transport: ws`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from proxy.metrics.families import counter, gauge, histogram

#: Turns in one session: a short exchange up to a long agent loop.
_TURN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class WebSocketMetrics:
    """Sessions open, messages by direction, turns per session, history bytes kept."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sessions = gauge(
            registry,
            "proxy_websocket_sessions",
            "WebSocket sessions open on /v1/responses",
            "livesum",
        )
        self.messages = counter(
            registry,
            "proxy_websocket_messages",
            "WebSocket messages on /v1/responses, by direction (in: from the client)",
            ["direction"],
            zeros=("in", "out"),
        )
        self.turns = histogram(
            registry,
            "proxy_websocket_turns_per_session",
            "response.create turns answered per WebSocket session, observed when it ends",
            _TURN_BUCKETS,
        )
        self.kept = gauge(
            registry,
            "proxy_websocket_kept_bytes",
            "encoded bytes of unstored history the open WebSocket sessions keep for "
            "previous_response_id (each at most ws_max_message_bytes)",
            "livesum",
        )
