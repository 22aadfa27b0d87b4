"""Prometheus metrics on an injected registry: the adapter that reads what the core recorded.

Label values come only from small fixed sets (routes, outcomes, channels, event types the core
emits, error kinds); models only from the configured `metrics_models` list, others are `other`.
Never ids, text or client-supplied strings.

With worker processes (`workers` above 1) every process writes its values to prometheus_client's
multiprocess files (proxy/server/processes/multiproc.py) and `/metrics` reads them all: counters
and histograms are summed; each gauge says how its values combine (`multiprocess_mode`, ignored
in a single process): what a process holds is summed over the live ones (`livesum`), a condition
of the whole proxy is the worst live process's (`livemin` for "ready", `livemax` for
"draining"), and what every process reads from one shared source is the same anywhere
(`livemax`). No gauge is read at scrape time (`set_function`): a scrape answered by one process
would never see another's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy import __version__
from proxy.harmony.constraint import CONSTRAINT_KINDS
from proxy.harmony.stream.events import ITEM_EVENT_TYPES
from proxy.harmony.stream.items import CHANNELS
from proxy.harmony.stream.record import MALFORMED_KINDS, RepairRecord

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

_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_TTFT = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_OVERHEAD = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1)
_DURATION = (0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400)
_TOKENS_PER_FRAME = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128, 256)
#: The response store's calls (proxy/store/measured.py) and what its writer drops.
STORE_OPS = ("apply", "get", "read_log", "wait_log", "resolve", "signals", "sweep", "stats", "ping")
STORE_EVICTIONS = ("size", "ttl")


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
        self.requests = Counter(
            "proxy_requests",
            "Repaired /v1/responses requests by outcome",
            ["route", "stream", "outcome", "model"],
            registry=r,
        )
        self.in_flight = Gauge(
            "proxy_streams_in_flight",
            "Repaired requests being served now",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.first_event = Histogram(
            "proxy_time_to_first_event_seconds",
            "Request received to response.created written",
            buckets=_FAST,
            registry=r,
        )
        self.first_content = Histogram(
            "proxy_time_to_first_content_seconds",
            "Request received to the first content delta written",
            buckets=_TTFT,
            registry=r,
        )
        self.frame_overhead = Histogram(
            "proxy_frame_overhead_seconds",
            "Upstream frame received to its events written (the proxy's own cost)",
            buckets=_OVERHEAD,
            registry=r,
        )
        self.duration = Histogram(
            "proxy_stream_duration_seconds",
            "Request received to the terminal event",
            buckets=_DURATION,
            registry=r,
        )
        self.compactions = Counter(
            "proxy_compactions",
            "Compactions by trigger and outcome",
            ["trigger", "outcome"],
            registry=r,
        )
        self.tokens = Counter(
            "proxy_tokens", "Generated tokens by channel", ["channel"], registry=r
        )
        self.tokens_per_frame = Histogram(
            "proxy_upstream_frame_tokens",
            "Tokens per upstream frame (stream_interval and speculative decoding at work)",
            buckets=_TOKENS_PER_FRAME,
            registry=r,
        )
        self.recovered_events = Counter(
            "proxy_recovered_events",
            "Events the unpatched stream would not have carried (one delta per token)",
            ["type"],
            registry=r,
        )
        self.recovered_chars = Counter(
            "proxy_recovered_chars",
            "Text characters the unpatched stream would have lost",
            ["channel"],
            registry=r,
        )
        self.recovered_tokens = Counter(
            "proxy_recovered_tokens",
            "Content tokens the unpatched stream would have lost",
            ["channel"],
            registry=r,
        )
        self.unpatched_text_differs = Counter(
            "proxy_unpatched_text_differs",
            "Streams whose unpatched text would have differed from the final snapshot",
            registry=r,
        )
        self.items_unannounced = Counter(
            "proxy_items_unannounced",
            "Items the unpatched stream would never have announced",
            registry=r,
        )
        self.items_unclosed = Counter(
            "proxy_items_unclosed",
            "Items the unpatched stream would never have closed",
            registry=r,
        )
        self.repaired_streams = Counter(
            "proxy_repaired_streams",
            "Streams where the repair changed what the client saw",
            registry=r,
        )
        self.compared_streams = Counter(
            "proxy_compared_streams",
            "Streams compared with the model of the unpatched upstream",
            registry=r,
        )
        self.selfcheck_failures = Counter(
            "proxy_selfcheck_failures",
            "Streams whose deltas did not concatenate to the terminal snapshot (must stay 0)",
            registry=r,
        )
        self.malformed = Counter(
            "proxy_malformed_outputs",
            "Malformed model output handled, by kind",
            ["kind"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "proxy_upstream_errors", "Upstream failures by kind", ["kind"], registry=r
        )
        self.timeouts = Counter("proxy_timeouts", "Upstream timeouts by kind", ["kind"], registry=r)
        self.disconnects = Counter(
            "proxy_client_disconnects",
            "Clients gone before the end, by phase",
            ["phase"],
            registry=r,
        )
        self.passthrough = Counter(
            "proxy_passthrough_requests",
            "Requests passed through untouched, by status class",
            ["status_class"],
            registry=r,
        )
        self.upstream_capable = Gauge(
            "proxy_upstream_capable",
            "1 when upstream's /v1/completions returns token ids (startup probe)",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.upstream_guided = Gauge(
            "proxy_upstream_guided_decoding",
            "1 when upstream enforces response_format (guided decoding: probed, or set)",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.constraint_refusals = Counter(
            "proxy_constraint_refusals", "Constrained requests refused", ["constraint"], registry=r
        )
        self.constraint_violations = Counter(
            "proxy_constraint_violations",
            "Responses failed: the output broke tool_choice or text.format (upstream enforced?)",
            ["constraint", "enforced"],
            registry=r,
        )
        self.http_limits = Counter(
            "proxy_http_limits",
            "Client connections or requests stopped by an HTTP server limit, by kind",
            ["kind"],
            registry=r,
        )
        self.client_connections = Gauge(
            "proxy_client_connections",
            "Open client connections",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.ready = Gauge(
            "proxy_ready", "1 when /readyz answers 200", registry=r, multiprocess_mode="livemin"
        )
        self.draining = Gauge(
            "proxy_draining", "1 after SIGTERM", registry=r, multiprocess_mode="livemax"
        )
        # Worker processes serving the port (each live one counts itself), and
        # those that died and were replaced (counted by the supervisor).
        self.worker_processes = Gauge(
            "proxy_worker_processes",
            "Proxy worker processes serving the port",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.worker_processes.set(1)
        self.worker_restarts = worker_restarts(r)
        # Where requests were rendered (inline on the loop, or in a render worker process)
        # and how it ended; every label set exported at zero from the start.
        self.renders = Counter(
            "proxy_renders", "Request renders by path and outcome", ["path", "outcome"], registry=r
        )
        for path, outcome in RENDER_LABELS:
            self.renders.labels(path, outcome)

        self.store_responses = Gauge(
            "proxy_store_responses",
            "Entries in the response store: responses and conversations",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.store_bytes = Gauge(
            "proxy_store_bytes",
            "Bytes the response store holds (what store_max_bytes bounds)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.store_evictions = Counter(
            "proxy_store_evictions",
            "Stored responses removed: past store_max_bytes (oldest first) or store_ttl",
            ["reason"],
            registry=r,
        )
        self.store_seconds = Histogram(
            "proxy_store_operation_seconds",
            "Time of one response-store call, by operation (a batch of writes is one apply)",
            ["op"],
            buckets=_FAST,
            registry=r,
        )
        self.store_errors = Counter(
            "proxy_store_errors",
            "Response-store calls that failed, by operation (a failed apply loses its writes)",
            ["op"],
            registry=r,
        )
        self.background = Gauge(
            "proxy_background_responses",
            "Background responses running in the proxy",
            registry=r,
            multiprocess_mode="livesum",
        )
        build = Gauge(
            "proxy_build_info",
            "Build information",
            ["version", "harmony"],
            registry=r,
            multiprocess_mode="livemax",
        )
        build.labels(__version__, harmony_version).set(1)
        # Export zeros for the fixed label sets, so that rates, ratios and alerts have series
        # from the first scrape instead of "no data" until the first event of each kind
        # (unlabelled metrics export their 0 by themselves). Each set is the
        # code's own: the core's malformed kinds, event types and channels, the error codes.
        for model in ("other", *sorted(self._models)):
            for stream in ("true", "false"):
                for outcome in OUTCOMES:
                    self.requests.labels("responses", stream, outcome, model)
        for phase in DISCONNECT_PHASES:
            self.disconnects.labels(phase)
        for kind in TIMEOUT_KINDS:
            self.timeouts.labels(kind)
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(kind)
        for status_class in ("2xx", "4xx", "5xx"):
            self.passthrough.labels(status_class)
        for kind in MALFORMED_KINDS:
            self.malformed.labels(kind)
        for kind in HTTP_LIMIT_KINDS:
            self.http_limits.labels(kind)
        for event_type in ITEM_EVENT_TYPES:
            self.recovered_events.labels(event_type)
        for channel in CHANNELS:
            self.tokens.labels(channel)
            self.recovered_chars.labels(channel)
            self.recovered_tokens.labels(channel)
        for kind in CONSTRAINT_KINDS:
            self.constraint_refusals.labels(kind)
            for enforced in ("true", "false"):
                self.constraint_violations.labels(kind, enforced)
        for op in STORE_OPS:
            self.store_errors.labels(op)
        for reason in STORE_EVICTIONS:
            self.store_evictions.labels(reason)
        for trigger, outcome in itertools.product(COMPACTION_TRIGGERS, ("ok", "failed")):
            self.compactions.labels(trigger, outcome)

    def start_drain(self) -> None:
        """SIGTERM: draining, and no longer ready (runner.py), at once."""
        self.draining.set(1)
        self.ready.set(0)

    def model_label(self, model: str) -> str:
        return model if model in self._models else "other"

    def observe_record(self, record: RepairRecord) -> None:
        """Count what the core recorded for one finished response."""
        for channel, count in record.tokens.items():
            self.tokens.labels(channel).inc(count)
        for kind, count in record.malformed.items():
            self.malformed.labels(kind).inc(count)
        if not record.compared:
            return
        self.compared_streams.inc()
        for event_type, count in record.recovered_events.items():
            if count:
                self.recovered_events.labels(event_type).inc(count)
        for channel, count in record.recovered_chars.items():
            self.recovered_chars.labels(channel).inc(count)
        for channel, count in record.recovered_tokens.items():
            self.recovered_tokens.labels(channel).inc(count)
        if record.unpatched_text_differs:
            self.unpatched_text_differs.inc()
        self.items_unannounced.inc(record.items_unannounced)
        self.items_unclosed.inc(record.items_unclosed)
        if record.repaired:
            self.repaired_streams.inc()


def worker_restarts(registry: CollectorRegistry | None) -> Counter:
    """`proxy_worker_restarts_total`: worker processes that died and were replaced. The
    supervisor counts (proxy/server/processes/supervisor.py); each worker's `Metrics` declares
    it too, so the series exists at 0 from the first scrape, also with one process."""
    return Counter(
        "proxy_worker_restarts",
        "Worker processes that died and were replaced",
        registry=registry,
    )
