"""The OpenTelemetry GenAI server metrics, in Prometheus naming, beside the `proxy_…` ones:
`gen_ai_server_request_duration_seconds`, `gen_ai_server_time_to_first_token_seconds` and
`gen_ai_server_time_per_output_token_seconds`, histograms with the convention's advised
bucket boundaries, labelled with the convention's attributes (dots become underscores; the
model only from `metrics_models`, like every model label).

With tracing on, each observation carries its trace as an exemplar; exemplars are written
only in the OpenMetrics exposition, which `/metrics` answers when the scraper asks for it
(exposition.py). With `workers` above 1 the multiprocess files keep no exemplars: the
histograms still add up.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram

from proxy.semconv import OPERATION, PROVIDER

#: The semantic conventions' advised boundaries, in seconds.
REQUEST_DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
TIME_PER_OUTPUT_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
_LABELS = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"]


class GenAIMetrics:
    """The three histograms (module doc) on `registry`."""

    def __init__(self, registry: CollectorRegistry, models: Iterable[str] = ()) -> None:
        self.request_duration = Histogram(
            "gen_ai_server_request_duration",
            "GenAI server request duration: request received to its last byte (OpenTelemetry "
            "gen_ai.server.request.duration)",
            [*_LABELS, "error_type"],
            unit="seconds",
            buckets=REQUEST_DURATION_BUCKETS,
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "gen_ai_server_time_to_first_token",
            "Time to the first output token of successful responses (OpenTelemetry "
            "gen_ai.server.time_to_first_token)",
            _LABELS,
            unit="seconds",
            buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
            registry=registry,
        )
        self.time_per_output_token = Histogram(
            "gen_ai_server_time_per_output_token",
            "Time per output token after the first, of successful responses (OpenTelemetry "
            "gen_ai.server.time_per_output_token)",
            _LABELS,
            unit="seconds",
            buckets=TIME_PER_OUTPUT_TOKEN_BUCKETS,
            registry=registry,
        )
        # Every series a dashboard selects exists from the first scrape (no "No data").
        for model in (*models, "other"):
            labels = (OPERATION, PROVIDER, model)
            self.request_duration.labels(*labels, "")
            self.time_to_first_token.labels(*labels)
            self.time_per_output_token.labels(*labels)

    def observe(
        self,
        labels: tuple[str, str, str],
        *,
        duration: float,
        error_type: str,
        first_token: float | None,
        output_tokens: int,
        exemplar: dict[str, str] | None,
    ) -> None:
        """One finished response: its duration (`error_type` "" when it succeeded); for a
        success, its time to first token and, past one token, its time per later token."""
        self.request_duration.labels(*labels, error_type).observe(duration, exemplar)
        if error_type or first_token is None:
            return
        self.time_to_first_token.labels(*labels).observe(first_token, exemplar)
        if output_tokens > 1:
            per_token = (duration - first_token) / (output_tokens - 1)
            self.time_per_output_token.labels(*labels).observe(per_token, exemplar)
