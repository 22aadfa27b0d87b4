"""`Metrics`: the requests served and the process serving them — outcomes and timings of the
repaired route, pass-through, upstream's failures and capabilities, the client side's HTTP
limits, readiness, worker processes and render workers; with the repair's families
(`repair.py`) and the store's (`store.py`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter

from proxy import __version__
from proxy.harmony.constraint import CONSTRAINT_KINDS
from proxy.metrics.families import FAST_BUCKETS, counter, gauge, histogram
from proxy.metrics.repair import RepairMetrics
from proxy.metrics.store import StoreMetrics

OUTCOMES = (
    "completed",
    "incomplete",
    "failed",
    "client_error",
    "upstream_error",
    "client_disconnect",
    "rejected",
    "cancelled",
)
#: What started a compaction: the compact route, a `compact_threshold`, a `compaction_trigger`.
COMPACTION_TRIGGERS = ("endpoint", "threshold", "item")
#: Where a client went away (`Exchange.phase`, the app's body read, pass-through).
DISCONNECT_PHASES = ("before_upstream", "before_first_token", "streaming", "passthrough")
#: The client side: a client that accepted nothing for `send_timeout`.
CLIENT_TIMEOUT = "client_send"
#: Upstream timeouts: before its first token, between frames, before its response headers.
TIMEOUT_KINDS = ("first_token", "idle", "first_byte", CLIENT_TIMEOUT)
#: `proxy_upstream_errors_total` kinds: the error codes of upstream failures, on both routes
#: (a timeout is `timeout`). Pass-through: `upstream_bad_response` for an answer
#: that is no valid HTTP response (502 before our head, an abort after it),
#: `upstream_disconnected` for one cut after our head.
UPSTREAM_ERROR_KINDS = (
    "upstream_unreachable",
    "upstream_error",
    "upstream_bad_response",
    "upstream_disconnected",
    "upstream_incomplete",
    "malformed_frame",
    "missing_token_ids",
    "malformed_logprobs",
    "timeout",
)

#: (path, outcome) of `proxy_renders_total` (proxy/server/rendering/pool.py).
RENDER_LABELS = (
    ("inline", "ok"),
    ("inline", "client_error"),
    ("worker", "ok"),
    ("worker", "client_error"),
    ("worker", "timeout"),
    ("worker", "queue_full"),
    ("worker", "worker_died"),
    ("worker", "failed"),
)
#: `proxy_http_limits_total{kind}`: what the client-side HTTP limits stopped (server/http/guard.py).
HTTP_LIMIT_KINDS = (
    "head_too_large",
    "too_many_headers",
    "head_timeout",
    "body_timeout",
    "headless_shed",
    "idle_shed",
    "connection_refused",
    "pipeline_full",
    "ws_send_timeout",
)

_TTFT = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_OVERHEAD = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1)
_DURATION = (0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400)


class Metrics:
    """Every `proxy_…` metric; one instance per app, on the registry it is given."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        models: Iterable[str] = (),
        harmony_version: str = "",
    ) -> None:
        self.registry = registry
        self._models = frozenset(models)
        r = registry
        self.requests = counter(
            r,
            "proxy_requests",
            "Repaired /v1/responses requests by outcome",
            ["route", "stream", "outcome", "model"],
            zeros=[
                ("responses", stream, outcome, model)
                for model in ("other", *sorted(self._models))
                for stream in ("true", "false")
                for outcome in OUTCOMES
            ],
        )
        self.in_flight = gauge(
            r, "proxy_streams_in_flight", "Repaired requests being served now", "livesum"
        )
        self.first_event = histogram(
            r,
            "proxy_time_to_first_event_seconds",
            "Request received to response.created written",
            FAST_BUCKETS,
        )
        self.first_content = histogram(
            r,
            "proxy_time_to_first_content_seconds",
            "Request received to the first content delta written",
            _TTFT,
        )
        self.frame_overhead = histogram(
            r,
            "proxy_frame_overhead_seconds",
            "Upstream frame received to its events written (the proxy's own cost)",
            _OVERHEAD,
        )
        self.duration = histogram(
            r, "proxy_stream_duration_seconds", "Request received to the terminal event", _DURATION
        )
        self.compactions = counter(
            r,
            "proxy_compactions",
            "Compactions by trigger and outcome",
            ["trigger", "outcome"],
            zeros=itertools.product(COMPACTION_TRIGGERS, ("ok", "failed")),
        )
        self.repair = RepairMetrics(r)
        self.upstream_errors = counter(
            r,
            "proxy_upstream_errors",
            "Upstream failures by kind",
            ["kind"],
            zeros=UPSTREAM_ERROR_KINDS,
        )
        self.timeouts = counter(
            r, "proxy_timeouts", "Upstream timeouts by kind", ["kind"], zeros=TIMEOUT_KINDS
        )
        self.disconnects = counter(
            r,
            "proxy_client_disconnects",
            "Clients gone before the end, by phase",
            ["phase"],
            zeros=DISCONNECT_PHASES,
        )
        self.passthrough = counter(
            r,
            "proxy_passthrough_requests",
            "Requests passed through untouched, by status class",
            ["status_class"],
            zeros=("2xx", "4xx", "5xx"),
        )
        self.upstream_capable = gauge(
            r,
            "proxy_upstream_capable",
            "1 when upstream's /v1/completions returns token ids (startup probe)",
            "livemin",
        )
        self.upstream_guided = gauge(
            r,
            "proxy_upstream_guided_decoding",
            "1 when upstream enforces response_format (guided decoding: probed, or set)",
            "livemin",
        )
        self.constraint_refusals = counter(
            r,
            "proxy_constraint_refusals",
            "Constrained requests refused",
            ["constraint"],
            zeros=CONSTRAINT_KINDS,
        )
        self.constraint_violations = counter(
            r,
            "proxy_constraint_violations",
            "Responses failed: the output broke tool_choice or text.format (upstream enforced?)",
            ["constraint", "enforced"],
            zeros=itertools.product(CONSTRAINT_KINDS, ("true", "false")),
        )
        self.http_limits = counter(
            r,
            "proxy_http_limits",
            "Client connections or requests stopped by an HTTP server limit, by kind",
            ["kind"],
            zeros=HTTP_LIMIT_KINDS,
        )
        self.client_connections = gauge(
            r, "proxy_client_connections", "Open client connections", "livesum"
        )
        self.ready = gauge(r, "proxy_ready", "1 when /readyz answers 200", "livemin")
        self.draining = gauge(r, "proxy_draining", "1 after SIGTERM", "livemax")
        # Worker processes serving the port (each live one counts itself), and
        # those that died and were replaced (counted by the supervisor).
        self.worker_processes = gauge(
            r, "proxy_worker_processes", "Proxy worker processes serving the port", "livesum"
        )
        self.worker_processes.set(1)
        self.worker_restarts = worker_restarts(r)
        # Where requests were rendered (inline on the loop, or in a render worker process)
        # and how it ended.
        self.renders = counter(
            r,
            "proxy_renders",
            "Request renders by path and outcome",
            ["path", "outcome"],
            zeros=RENDER_LABELS,
        )
        self.store = StoreMetrics(r)
        self.background = gauge(
            r, "proxy_background_responses", "Background responses running in the proxy", "livesum"
        )
        build = gauge(r, "proxy_build_info", "Build information", "livemax", ["version", "harmony"])
        build.labels(__version__, harmony_version).set(1)

    def start_drain(self) -> None:
        """SIGTERM: draining, and no longer ready (runner.py), at once."""
        self.draining.set(1)
        self.ready.set(0)

    def model_label(self, model: str) -> str:
        return model if model in self._models else "other"


def worker_restarts(registry: CollectorRegistry | None) -> Counter:
    """`proxy_worker_restarts_total`: worker processes that died and were replaced. The
    supervisor counts (proxy/server/processes/supervisor.py); each worker's `Metrics` declares
    it too, so the series exists at 0 from the first scrape, also with one process."""
    return Counter(
        "proxy_worker_restarts",
        "Worker processes that died and were replaced",
        registry=registry,
    )
