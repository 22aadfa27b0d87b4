"""The WebSocket sessions of `GET /v1/responses` (routes/websocket.py), counted on the same
injected registry as `metrics.Metrics`. Each response of a session is counted and logged like one
over HTTP, by `Metrics` (its log line says `transport: ws`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Turns in one session: a short exchange up to a long agent loop.
_TURN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class WebSocketMetrics:
    """Sessions open, messages by direction, turns per session."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sessions = Gauge(
            "proxy_websocket_sessions",
            "WebSocket sessions open on /v1/responses",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.messages = Counter(
            "proxy_websocket_messages",
            "WebSocket messages on /v1/responses, by direction (in: from the client)",
            ["direction"],
            registry=registry,
        )
        self.turns = Histogram(
            "proxy_websocket_turns_per_session",
            "response.create turns answered per WebSocket session, observed when it ends",
            buckets=_TURN_BUCKETS,
            registry=registry,
        )
        for direction in ("in", "out"):
            self.messages.labels(direction)
