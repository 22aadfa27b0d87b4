"""Traces: OpenTelemetry spans over the official SDK and OTLP exporters, off unless asked for.

Off (no traces endpoint anywhere), nothing here is imported by the request path and no span
object is ever made: the shell holds `None` where a `Tracing` would be, and every hook is one
`is not None` test. On, `start_tracing` builds one `TracerProvider` per process with a
`BatchSpanProcessor`: spans queue in memory and a background thread exports them, so a slow or
dead collector costs a request nothing (a full queue drops spans, never waits).

Names and attributes follow the OpenTelemetry GenAI and HTTP semantic conventions; the proxy's
own attributes share the `proxy.` prefix. Prompts, outputs and tool arguments go on spans only
with `capture_content` (the GenAI convention's opt-in), never credentials.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from proxy.semconv import OPERATION, PROVIDER

if TYPE_CHECKING:  # the SDK is imported by `start_tracing` only
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, SpanContext, Tracer

#: The env names the SDK reads, and ours: where traces go, and whether content is captured.
TRACES_ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_ENV = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SERVICE_NAME = "responses-repair-proxy"
PROTOCOLS = ("http/protobuf", "grpc")
#: Longest captured content attribute (with `capture_content` only).
CONTENT_CHARS = 16_384
_PROPAGATED = ("traceparent", "tracestate")
_A = TypeVar("_A")
_R = TypeVar("_R")
INSTRUCTIONS = "gen_ai.system_instructions"
#: The longest a process's exit waits for its last spans to be exported.
SHUTDOWN_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """Where and how traces go; `None` fields fall back to the standard OTEL_* environment."""

    endpoint: str | None = None
    protocol: str | None = None
    sample_ratio: float | None = None
    capture_content: bool = False
    service_name: str | None = None

    def resolved_endpoint(self, env: Mapping[str, str]) -> str | None:
        """The endpoint traces go to; None: tracing is off."""
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return None
        if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
            return None
        if self.endpoint:
            return self.endpoint
        traces, common = (env.get(name, "").strip() for name in TRACES_ENDPOINT_ENV)
        if traces:
            return traces
        if common:  # the common endpoint is a base: the HTTP exporter's signal path follows
            grpc = self.resolved_protocol(env) == "grpc"
            return common if grpc else common.rstrip("/") + "/v1/traces"
        return None

    def resolved_protocol(self, env: Mapping[str, str]) -> str:
        if self.protocol:
            return self.protocol
        for name in PROTOCOL_ENV:
            value = env.get(name, "").strip().lower()
            if value:
                if value not in PROTOCOLS:
                    raise ValueError(
                        f"{name}={value!r}: the proxy exports {' or '.join(PROTOCOLS)}"
                    )
                return value
        return "http/protobuf"

    def captures(self, env: Mapping[str, str]) -> bool:
        return self.capture_content or env.get(CAPTURE_ENV, "").strip().lower() == "true"


@dataclass
class Tracing:
    """The process's tracer, and the few operations the shell needs (module doc)."""

    provider: TracerProvider
    capture_content: bool = False
    tracer: Tracer = field(init=False)

    def __post_init__(self) -> None:
        self.tracer = self.provider.get_tracer("responses_repair_proxy")

    # -- context in and out ------------------------------------------------------------------

    def extract(self, headers: Sequence[tuple[bytes, bytes]]) -> Context:
        """The client's trace context (W3C `traceparent`/`tracestate`), or an empty one."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in headers
            if name in (b"traceparent", b"tracestate")
        }
        return TraceContextTextMapPropagator().extract(carrier)

    def inject(self, headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """`headers` with the current span's `traceparent`/`tracestate` in place of any the
        client sent: upstream's spans become children of ours."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        kept = [(n, v) for n, v in headers if n.lower() not in _PROPAGATED]
        return [*kept, *carrier.items()]

    # -- spans ---------------------------------------------------------------------------------

    def server_span(self, name: str, parent: Context, attributes: dict[str, Any]) -> Span:
        from opentelemetry.trace import SpanKind

        return self.tracer.start_span(name, parent, SpanKind.SERVER, attributes)

    @contextlib.contextmanager
    def span(
        self, name: str, attributes: dict[str, Any] | None = None, *, client: bool = False
    ) -> Iterator[Span]:
        """A child of the current span, current while the block runs; an exception escaping it
        marks it failed (`error.type`)."""
        from opentelemetry.trace import SpanKind

        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        with self.tracer.start_as_current_span(name, kind=kind, attributes=attributes) as span:
            try:
                yield span
            except BaseException as exc:
                span.set_attribute("error.type", getattr(exc, "code", None) or type(exc).__name__)
                raise

    @contextlib.contextmanager
    def linked(self, name: str, attributes: dict[str, Any] | None = None) -> Iterator[Span]:
        """A new trace's root span, current while the block runs, linked to the current span:
        work a request started that outlives it (a background response, a WebSocket turn)."""
        from opentelemetry.context import Context
        from opentelemetry.trace import Link, SpanKind, get_current_span

        origin = get_current_span().get_span_context()
        links = [Link(origin)] if origin.is_valid else []
        with self.tracer.start_as_current_span(
            name, Context(), SpanKind.INTERNAL, attributes, links
        ) as span:
            yield span

    def genai_request(self, body: Mapping[str, Any], request_id: str) -> None:
        """Make the current (server) span a GenAI one: `{operation} {model}`, the request's
        attributes, and its input only when content is captured."""
        span = self.current()
        span.update_name(f"{OPERATION} {_capped(str(body.get('model')))}")
        span.set_attributes(request_attributes(body, request_id))
        for key, name in (("input", "gen_ai.input.messages"), ("instructions", INSTRUCTIONS)):
            content = self.content(body.get(key)) if key in body else None
            if content is not None:
                span.set_attribute(name, content)

    def traced(
        self, name: str, call: Callable[[_A], Awaitable[_R]]
    ) -> Callable[[_A], Awaitable[_R]]:
        """`call`, each await of it a span `name` under the current one."""

        async def traced_call(argument: _A) -> _R:
            with self.span(name):
                return await call(argument)

        return traced_call

    def current(self) -> Span:
        from opentelemetry.trace import get_current_span

        return get_current_span()

    def origin(self) -> SpanContext:
        """The current span's context (to link a later span to it)."""
        return self.current().get_span_context()

    def ids(self) -> dict[str, str]:
        """`trace_id`/`span_id` of the current span for a log line ({} outside a span)."""
        context = self.current().get_span_context()
        if not context.is_valid:
            return {}
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}

    def exemplar(self) -> dict[str, str] | None:
        """The current trace as a Prometheus exemplar's labels (sampled traces only)."""
        context = self.current().get_span_context()
        if not context.is_valid or not context.trace_flags.sampled:
            return None
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}

    def content(self, value: Any) -> str | None:
        """`value` as a captured content attribute, or None unless content is captured."""
        if not self.capture_content:
            return None
        import orjson

        text = orjson.dumps(value, default=str).decode()
        return text if len(text) <= CONTENT_CHARS else text[:CONTENT_CHARS] + "…"

    def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Export what is queued and stop, waiting at most `timeout` seconds: a collector that
        is down or never answers must not hold up the process's exit (the export thread is a
        daemon; what it still holds then is lost)."""
        stopping = threading.Thread(target=self.provider.shutdown, daemon=True)
        stopping.start()
        stopping.join(timeout)


def client_attributes(url: str) -> dict[str, Any]:
    """The HTTP client span's attributes (semantic conventions) for a request to `url`."""
    parts = urlsplit(url)
    https = parts.scheme == "https"
    if parts.username is not None or parts.password is not None:
        # Upstream's base URL may carry Basic credentials: the conventions ask for them
        # redacted, and a span goes to whoever runs the collector.
        host = parts.netloc.rpartition("@")[2]
        url = urlunsplit(parts._replace(netloc=f"REDACTED:REDACTED@{host}"))
    return {
        "http.request.method": "POST",
        "url.full": url,
        "server.address": parts.hostname or "",
        "server.port": parts.port or (443 if https else 80),
    }


def request_attributes(body: Mapping[str, Any], request_id: str) -> dict[str, Any]:
    """The GenAI attributes a Responses create names before it runs: model, parameters,
    conversation (client strings capped; never the input)."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": _capped(str(body.get("model"))),
        "proxy.request_id": request_id,
    }
    for key, name in _PARAMETERS:
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[name] = value
    conversation = body.get("conversation")
    if isinstance(conversation, Mapping):
        conversation = conversation.get("id")
    if isinstance(conversation, str):
        attributes["gen_ai.conversation.id"] = _capped(conversation)
    if isinstance(body.get("previous_response_id"), str):
        attributes["proxy.previous_response_id"] = _capped(body["previous_response_id"])
    return attributes


_PARAMETERS = (
    ("max_output_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
)


def _capped(value: str) -> str:
    return value if len(value) <= 256 else value[:256] + "…"


def maybe_span(tracing: Tracing | None, name: str) -> contextlib.AbstractContextManager[Any]:
    """`tracing.span(name)`, or nothing at all when tracing is off."""
    return contextlib.nullcontext() if tracing is None else tracing.span(name)


def event_time(monotonic_at: float, monotonic_now: float) -> int:
    """The epoch nanoseconds of an instant the monotonic clock saw (span event timestamps)."""
    return time.time_ns() - int((monotonic_now - monotonic_at) * 1e9)


def start_tracing(config: TraceConfig, env: Mapping[str, str] | None = None) -> Tracing | None:
    """The process's `Tracing` when an endpoint is configured, else None (nothing imported)."""
    env = os.environ if env is None else env
    endpoint = config.resolved_endpoint(env)
    if endpoint is None:
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME as SERVICE_KEY
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    exporter: SpanExporter
    if config.resolved_protocol(env) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter(endpoint=endpoint)
    attributes: dict[str, Any] = {}
    if config.service_name:
        attributes[SERVICE_KEY] = config.service_name
    elif not env.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_KEY] = SERVICE_NAME
    resource = Resource.create(attributes)  # adds OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    kwargs: dict[str, Any] = {"resource": resource}
    if config.sample_ratio is not None:
        kwargs["sampler"] = ParentBased(TraceIdRatioBased(config.sample_ratio))
    # else the SDK's own: OTEL_TRACES_SAMPLER[_ARG], parent-based always-on by default
    # shut down by the app's lifespan, bounded (`Tracing.shutdown`), not at exit unbounded
    provider = TracerProvider(shutdown_on_exit=False, **kwargs)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider, capture_content=config.captures(env))
