"""One repaired exchange's end, counted and logged: `proxy_requests_total`, the duration, what the
repair did (the core's record), the self-check, and the request's one log line. The same for an
exchange with a client (routes/repair.py) and for a background run (stateful/background.py)."""

from __future__ import annotations

from typing import Any

from proxy.server.deps import RepairDeps
from proxy.server.exchange import Exchange

#: The statuses a response can end with; anything else ended it as failed.
_ENDED = frozenset({"completed", "incomplete", "failed", "cancelled"})


def outcome_of(exchange: Exchange) -> str:
    """The `outcome` label of an exchange that ran to its end: its response's status."""
    status = exchange.core.status
    return status if status in _ENDED else "failed"


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
    metrics.observe_record(record)
    if exchange.selfcheck.problem is not None and exchange.core.ended:
        metrics.selfcheck_failures.inc()
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
