"""The repaired `/v1/responses`: render, stream upstream token ids through the core, write events.

One `Exchange` per request. Its life:

    read body ─▶ prepare (render + validate) ─▶ open upstream /v1/completions ─┬─▶ HTTP error
                   │ 4xx                           │ 4xx/502/504 before a byte   │
                   ▼                               ▼                             ▼
                JSON error                      JSON error              pump frames → core →
                                                                        events → one send per
                                                                        frame, until exactly one
                                                                        terminal event

With the response store (issue 13), `previous_response_id`, `conversation` (issue 16) and
`item_reference` are resolved and merged before rendering (stateful/state.py), every event
batch goes to the exchange's `Recorder` on its way out (the terminal batch — and a
conversation's new items — stored before the client sees it), and `background: true` hands the
exchange to stateful/background.py, which runs it with no client.

The exchange itself (the pump, its failures, the stored copy's writes) is exchange.py; the
shared state and injected dependencies are deps.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.types import Scope, Send

from proxy.errors import ClientError, ProxyError, UnavailableError, UpstreamError
from proxy.harmony.constraint import OutputConstraint
from proxy.harmony.request.prepare import PreparedRequest
from proxy.metrics import CLIENT_TIMEOUT
from proxy.server import asgi
from proxy.server.deps import RepairDeps, until_drained
from proxy.server.exchange import Exchange
from proxy.server.stateful.background import answer_background
from proxy.server.stateful.scope import refuse_without_store, scope_of
from proxy.server.stateful.state import Context
from proxy.upstream.probe import Capability

if TYPE_CHECKING:
    pass


async def serve_repaired(
    deps: RepairDeps,
    scope: Scope,
    inbound: asgi.Inbound,
    send: Send,
    body: dict[str, Any],
    request_id: str,
    started: float,
    *,
    on_prepared: Callable[[], None] | None = None,
) -> None:
    """Serve a parsed `/v1/responses` body whose model is in the repair set. `on_prepared` is
    called once the body is rendered (or refused): the app's body budget then lets it go."""
    metrics, state, settings = deps.metrics, deps.state, deps.settings
    stream = body.get("stream") is True
    stream_label = "true" if stream else "false"
    model = str(body.get("model"))
    id_header = [(b"x-request-id", request_id.encode())]
    exchange: Exchange | None = None
    outcome = "client_error"
    stateful = deps.stateful
    scope_key = scope_of(scope["headers"], settings.store_scope_header)
    context: Context | None = None

    render = functools.partial(render_body, deps)
    try:
        try:
            if stateful is not None:
                prepared, context = await until_drained(
                    state, stateful.prepare(body, scope_key, render)
                )
            else:
                refuse_without_store(body)
                prepared = await until_drained(state, render(body))
        finally:
            if on_prepared is not None:
                on_prepared()
        if not state.capability.token_ids:
            raise UpstreamError(
                f"cannot repair: {state.capability.detail}",
                status=503 if not state.capability.reachable else 502,
                code="upstream_not_capable",
            )
        if prepared.top_logprobs is not None and not state.capability.logprobs:
            # Never a silent empty list (issue 15): the client learns before generation.
            raise ClientError(
                "include 'message.output_text.logprobs' needs token logprobs from upstream's "
                f"/v1/completions, which this upstream does not give ({state.capability.detail})",
                param="include",
                code="logprobs_unavailable",
            )
        constraint = prepared.constraint
        guided = state.capability.guided
        if (
            constraint is not None
            and constraint.engine_needed
            and not guided
            and settings.unenforced_constraints == "refuse"
        ):
            # Never a silent success (the output would go unchecked by the engine): the client
            # learns before generation, and what would fix it.
            metrics.constraint_refusals.labels(constraint.kind).inc()
            raise ClientError(
                refusal(constraint, state.capability), param=constraint.param, code=NOT_ENFORCED
            )
        if settings.max_concurrent_streams and state.in_flight >= settings.max_concurrent_streams:
            outcome = "rejected"
            raise ClientError(
                f"the proxy is serving its limit of {settings.max_concurrent_streams} streams; "
                "retry shortly",
                status=429,
                code="too_many_streams",
            )
        exchange = Exchange(
            deps,
            prepared,
            request_id,
            started,
            asgi.header_pairs(scope),
            guided=guided,
            takes_response_format=state.capability.takes_response_format,
        )
        queued: dict[str, Any] | None = None
        if context is not None and stateful is not None and context.recorded:
            if context.background and deps.background is not None:
                queued = await deps.background.launch(exchange, context, scope_key)
            else:
                exchange.recorder = stateful.recorder(exchange.response_id, scope_key, context)
    except ProxyError as error:
        if isinstance(error, UpstreamError):
            outcome = "upstream_error"
        elif isinstance(error, UnavailableError):
            outcome = "rejected"
        extra = [(b"retry-after", b"1")] if error.status in (429, 503) else []
        await asgi.send_error(send, error, [*id_header, *extra])
        metrics.requests.labels(
            "responses", stream_label, outcome, metrics.model_label(model)
        ).inc()
        deps.log(
            "request",
            request_id=request_id,
            route="/v1/responses",
            model=model,
            status=error.status,
            outcome=outcome,
            error=error.code or error.error_type,
            duration_ms=_ms(deps, started),
        )
        return

    if queued is not None:  # it runs in background.py, counted and logged there
        await answer_background(deps, scope_key, queued, inbound, send, id_header, stream)
        return
    state.in_flight += 1
    metrics.in_flight.inc()
    disconnected = False
    try:
        try:
            timed_send = asgi.with_send_timeout(send, settings.send_timeout)
            work = exchange.stream(timed_send) if stream else exchange.answer(timed_send)
            disconnected = await asgi.run_until_disconnect(inbound, work)
        except ProxyError as error:  # before the first byte: an HTTP error
            # A `stream: false` answer whose upstream broke mid-way was counted by `_fail`
            # already (issue 12: it was counted twice).
            counted = exchange.error_code is not None
            exchange.status = error.status
            exchange.error_code = error.code
            outcome = "client_error" if isinstance(error, ClientError) else "upstream_error"
            if isinstance(error, UnavailableError):
                outcome = "rejected"
                id_header = [*id_header, (b"retry-after", b"1")]
            if error.code and not counted:
                kind = "timeout" if error.code == "upstream_timeout" else error.code
                if isinstance(error, UpstreamError):
                    metrics.upstream_errors.labels(kind).inc()
                    if kind == "timeout":
                        metrics.timeouts.labels("first_byte").inc()
            await asgi.send_error(send, error, id_header)
        except OSError as exc:  # the client's socket died mid-send, or it stopped reading
            disconnected = True
            if isinstance(exc, asgi.SendTimeout):
                metrics.timeouts.labels(CLIENT_TIMEOUT).inc()
        else:
            outcome = _outcome(exchange)
        if disconnected and exchange.delivered:
            # The client had its whole answer and hung up while upstream's tail was read
            # (`_release`): a finished response, not a disconnect.
            outcome = _outcome(exchange)
        elif disconnected:
            outcome = "client_disconnect"
            metrics.disconnects.labels(exchange.phase).inc()
    finally:
        state.in_flight -= 1
        metrics.in_flight.dec()
        if exchange.recorder is not None and not exchange.recorder.finished:
            # Ended early (client gone, error before the first byte): so does its stored copy.
            await exchange.recorder.finish(exchange.settle(), wait=False)
    _finish(deps, exchange, outcome, stream_label, model, started, body)


async def render_body(deps: RepairDeps, body: dict[str, Any]) -> PreparedRequest:
    """The one place a request body becomes a prompt — a create, a `previous_response_id`
    merge, an `input_tokens` count alike (issue 13: the same body, the same prompt ids), off
    the event loop when it is costly (the renderer, issue 12)."""
    return await deps.renderer.prepare(body)


def finish_exchange(
    deps: RepairDeps, exchange: Exchange, outcome: str, stream_label: str, model: str, body: Any
) -> None:
    """Count and log an exchange that ran without a client of its own (background.py)."""
    _finish(deps, exchange, outcome, stream_label, model, exchange.started, body)


#: The 400's code when a constraint would go unenforced and the policy is to refuse it.
NOT_ENFORCED = "constraint_not_enforced"


def refusal(constraint: OutputConstraint, capability: Capability) -> str:
    """The 400's message: what is refused, why, and the two settings that change it."""
    known = (
        "does not enforce response_format"
        if capability.guided is False
        else "has not been found to enforce response_format"
    )
    return (
        f"{constraint.describe()} is enforced by guided decoding, and upstream {known} "
        f"({capability.guided_detail}). Start trtllm-serve with "
        "'guided_decoding_backend: xgrammar' in its --extra_llm_api_options YAML (then set "
        "the proxy's guided_decoding = auto or on), or set the proxy's unenforced_constraints "
        "= best_effort to have the output checked instead (a response that breaks the "
        "constraint then ends failed with constraint_violated)."
    )


def _outcome(exchange: Exchange) -> str:
    status = exchange.core.status
    return status if status in ("completed", "incomplete", "failed", "cancelled") else "failed"


def _finish(
    deps: RepairDeps,
    exchange: Exchange,
    outcome: str,
    stream_label: str,
    model: str,
    started: float,
    body: dict[str, Any],
) -> None:
    metrics = deps.metrics
    record = exchange.core.record()
    metrics.requests.labels("responses", stream_label, outcome, metrics.model_label(model)).inc()
    metrics.duration.observe(deps.monotonic() - started)
    metrics.observe_record(record)
    if exchange.selfcheck.problem is not None and exchange.core.ended:
        metrics.selfcheck_failures.inc()
    # Content only when an operator asked for it (a debug setting): never by default.
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
        duration_ms=_ms(deps, started),
        ttft_ms=None
        if exchange.first_content is None
        else round((exchange.first_content - started) * 1000, 2),
        repaired=record.repaired,
        recovered_chars=sum(record.recovered_chars.values()),
        items_unannounced=record.items_unannounced,
        malformed=dict(record.malformed) or None,
        selfcheck=exchange.selfcheck.problem,
    )


def _ms(deps: RepairDeps, started: float) -> float:
    return round((deps.monotonic() - started) * 1000, 2)
