"""One repaired exchange's end, counted and logged: `proxy_requests_total`, the duration, what the
repair did (the core's record), the self-check, and the request's one log line. The same for an
exchange with a client (routes/repair.py over HTTP, routes/turn.py over a WebSocket) and for a
background run (stateful/background.py).

`answering` is the bookkeeping of an answer with a client, the one both routes use: the stream
counted in flight, a refusal before upstream's head counted by kind (`refused`), a client gone
or too slow to read (`OSError`, a cancellation) counted as a disconnect unless it had its whole
answer, the stored copy ended with it, then `report`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from proxy.errors import ClientError, ProxyError, UnavailableError, UpstreamError
from proxy.harmony.stream.record import RepairRecord
from proxy.metrics.serving import CLIENT_TIMEOUT
from proxy.semconv import OPERATION, PROVIDER
from proxy.server import asgi
from proxy.server.deps import TOO_MANY_STREAMS, RepairDeps
from proxy.server.exchange import Exchange
from proxy.tracing import Tracing, event_time

#: The statuses a response can end with; anything else ended it as failed.
_ENDED = frozenset({"completed", "incomplete", "failed", "cancelled"})


def outcome_of(exchange: Exchange) -> str:
    """The `outcome` label of an exchange that ran to its end: its response's status."""
    status = exchange.core.status
    return status if status in _ENDED else "failed"


def refused_outcome(error: ProxyError) -> str:
    """The outcome a refusal before upstream's answer is counted as: `rejected` (the proxy has
    no room now), `client_error`, or `upstream_error` (upstream, or the store, failed)."""
    if isinstance(error, UnavailableError) or error.code == TOO_MANY_STREAMS:
        return "rejected"
    if isinstance(error, ClientError):
        return "client_error"
    return "upstream_error"


class Answer:
    """How one answer with a client is ending (module doc); `outcome` is its label."""

    def __init__(self, deps: RepairDeps, exchange: Exchange) -> None:
        self._deps = deps
        self._exchange = exchange
        self.outcome = "client_disconnect"

    def ended(self) -> None:
        """The exchange ran to its end."""
        self.outcome = outcome_of(self._exchange)

    def refused(self, error: ProxyError) -> None:
        """Upstream refused it before the first event (the route answers `error` itself)."""
        exchange, metrics = self._exchange, self._deps.metrics
        # A `stream: false` answer whose upstream broke mid-way was counted by the exchange's
        # `_fail` already: counted once, not twice.
        counted = exchange.error_code is not None
        exchange.status, exchange.error_code = error.status, error.code
        self.outcome = refused_outcome(error)
        if error.code and not counted and isinstance(error, UpstreamError):
            kind = "timeout" if error.code == "upstream_timeout" else error.code
            metrics.upstream_errors.labels(kind).inc()
            if kind == "timeout":
                metrics.timeouts.labels("first_byte").inc()

    def gone(self, error: BaseException | None = None) -> None:
        """The client went, or stopped reading (`asgi.SendTimeout`)."""
        exchange, metrics = self._exchange, self._deps.metrics
        if isinstance(error, asgi.SendTimeout):
            metrics.timeouts.labels(CLIENT_TIMEOUT).inc()
        if exchange.delivered:
            # The client had its whole answer and hung up while upstream's tail was read
            # (`Frames.release`): a finished response, not a disconnect.
            self.outcome = outcome_of(exchange)
        else:
            self.outcome = "client_disconnect"
            metrics.disconnects.labels(exchange.phase).inc()


@asynccontextmanager
async def answering(
    deps: RepairDeps,
    exchange: Exchange,
    stream_label: str,
    model: str,
    body: dict[str, Any],
    **extra: Any,
) -> AsyncIterator[Answer]:
    """Count `exchange` in flight while the block answers it, and its end (module doc); an
    `OSError` of the block (the client's socket) ends it as `Answer.gone`. `extra`: more fields
    of the log line (the WebSocket transport)."""
    state, metrics = deps.state, deps.metrics
    answer = Answer(deps, exchange)
    state.in_flight += 1
    metrics.in_flight.inc()
    try:
        try:
            yield answer
        except OSError as error:  # the client's socket died mid-send, or it stopped reading
            answer.gone(error)
        except asyncio.CancelledError:  # the client went (its session cancelled the turn)
            answer.gone()
            raise
    finally:
        state.in_flight -= 1
        metrics.in_flight.dec()
        if exchange.recorder is not None and not exchange.recorder.finished:
            # Ended early (client gone, error before the first byte): so does its stored copy.
            await exchange.recorder.finish(exchange.settle(), wait=False)
        report(deps, exchange, answer.outcome, stream_label, model, body, **extra)


def report(
    deps: RepairDeps,
    exchange: Exchange,
    outcome: str,
    stream_label: str,
    model: str,
    body: dict[str, Any],
    **extra: Any,
) -> None:
    """Count and log `exchange`, which ended with `outcome` (module doc). `body` is logged only
    when an operator asked for content (`log_content`, a debug setting)."""
    metrics = deps.metrics
    record = exchange.core.record()
    started = exchange.started
    metrics.requests.labels("responses", stream_label, outcome, metrics.model_label(model)).inc()
    metrics.duration.observe(deps.monotonic() - started)
    if deps.genai is not None:
        first = exchange.first_content
        deps.genai.observe(
            (OPERATION, PROVIDER, metrics.model_label(model)),
            duration=deps.monotonic() - started,
            error_type="" if outcome in ("completed", "incomplete") else outcome,
            first_token=None if first is None else first - started,
            output_tokens=record.output_tokens,
            exemplar=None if deps.tracing is None else deps.tracing.exemplar(),
        )
    metrics.repair.observe(record)
    if exchange.selfcheck.problem is not None and exchange.core.ended:
        metrics.repair.selfcheck_failures.inc()
    if deps.tracing is not None:
        trace(deps.tracing, deps, exchange, outcome, record)
    content: dict[str, Any] = {}
    if deps.settings.log_content:
        snapshot = exchange.snapshot or {}
        content = {"request_body": body, "output": snapshot.get("output")}
    deps.log(
        "request",
        **content,
        request_id=exchange.request_id,
        route="/v1/responses",
        model=model,
        stream=stream_label == "true",
        status=exchange.status,
        outcome=outcome,
        error=exchange.error_code,
        output_tokens=record.output_tokens,
        reasoning_tokens=record.reasoning_tokens,
        frames=record.frames,
        duration_ms=round((deps.monotonic() - started) * 1000, 2),
        ttft_ms=None
        if exchange.first_content is None
        else round((exchange.first_content - started) * 1000, 2),
        repaired=record.repaired,
        recovered_chars=sum(record.recovered_chars.values()),
        items_unannounced=record.items_unannounced,
        malformed=dict(record.malformed) or None,
        selfcheck=exchange.selfcheck.problem,
        **extra,
    )


def trace(
    tracing: Tracing, deps: RepairDeps, exchange: Exchange, outcome: str, record: RepairRecord
) -> None:
    """The current span's GenAI response attributes, ours (`proxy.`), and the first-token and
    terminal events; `error.type` when the response did not complete."""
    from opentelemetry.trace import StatusCode

    span = tracing.current()
    now = deps.monotonic()
    usage = (exchange.snapshot or {}).get("usage") or {}
    attributes: dict[str, Any] = {
        "gen_ai.response.id": exchange.response_id,
        "gen_ai.response.model": exchange.ctx.model,
        "gen_ai.usage.input_tokens": usage.get("input_tokens", exchange.ctx.input_tokens),
        "gen_ai.usage.output_tokens": usage.get("output_tokens", record.output_tokens),
        "proxy.outcome": outcome,
        "proxy.frames": record.frames,
        "proxy.tokens_per_frame": round(record.output_tokens / record.frames, 3)
        if record.frames
        else 0.0,
        "proxy.reasoning_tokens": record.reasoning_tokens,
        "proxy.repaired": record.repaired,
        "proxy.recovered_events": sum(record.recovered_events.values()),
        "proxy.recovered_chars": sum(record.recovered_chars.values()),
        "proxy.stored": exchange.recorder is not None,
    }
    if record.finish_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = [record.finish_reason]
    if exchange.error_code is not None:
        attributes["proxy.error_code"] = exchange.error_code
    if exchange.selfcheck.problem is not None:
        attributes["proxy.selfcheck"] = exchange.selfcheck.problem
    if outcome != "completed":
        attributes["error.type"] = exchange.error_code or outcome
        if outcome not in ("incomplete", "cancelled"):
            span.set_status(StatusCode.ERROR, exchange.error_code or outcome)
    span.set_attributes(attributes)
    if exchange.first_content is not None:
        span.add_event("gen_ai.first_token", timestamp=event_time(exchange.first_content, now))
    if exchange.core.ended:
        span.add_event("proxy.terminal", {"status": exchange.core.status})
    content = tracing.content((exchange.snapshot or {}).get("output"))
    if content is not None:
        span.set_attribute("gen_ai.output.messages", content)
