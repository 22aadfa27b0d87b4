"""The repaired answer of `POST /v1/responses` (routes/responses.py read the body): render,
check what upstream can do, stream upstream's token ids through the core, write events.

One `Exchange` (exchange.py) per request. Its life:

    prepare (render + validate) ─▶ open upstream /v1/completions ─┬─▶ HTTP error
      │ 4xx                        │ 4xx/502/504 before a byte    │
      ▼                            ▼                              ▼
    JSON error                  JSON error               pump frames → core → events → one
                                                         send per frame, until exactly one
                                                         terminal event

With the response store, `previous_response_id`, `conversation` and `item_reference` are
resolved and merged before rendering (stateful/state.py), every event batch goes to the
exchange's `Recorder` on its way out (the terminal batch — and a conversation's new items —
stored before the client sees it), and `background: true` hands the exchange to
stateful/background.py, which runs it with no client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from starlette.types import Scope, Send

from proxy.config.settings import Settings
from proxy.errors import ClientError, ProxyError, UnavailableError, UpstreamError
from proxy.harmony.constraint import OutputConstraint
from proxy.harmony.request.prepare import PreparedRequest
from proxy.server import asgi
from proxy.server.capability import first_probe
from proxy.server.compaction import compacting
from proxy.server.deps import ServerState, check_stream_room, until_drained
from proxy.server.exchange import Exchange
from proxy.server.hosted.hosting import Hosting
from proxy.server.outcome import answering, refused_outcome
from proxy.server.routes.answers import refuse
from proxy.server.services import Services
from proxy.server.sink import SseSink
from proxy.server.stateful.background import answer_background
from proxy.server.stateful.recording import recorder
from proxy.server.stateful.scope import refuse_without_store, scope_of
from proxy.server.stateful.state import Context
from proxy.tracing import maybe_span
from proxy.upstream.probe import Capability


async def serve_repaired(
    services: Services,
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
    deps, stateful = services.deps, services.stateful
    metrics, settings = deps.metrics, deps.settings
    stream = body.get("stream") is True
    stream_label = "true" if stream else "false"
    model = str(body.get("model"))
    id_header = [(b"x-request-id", request_id.encode())]
    scope_key = scope_of(scope["headers"], settings.store_scope_header)
    hosting = Hosting(services.hosted, deps.renderer, inbound)
    if deps.tracing is not None:
        deps.tracing.genai_request(body, request_id)
    try:
        admitted = await admit(
            services,
            scope,
            body,
            request_id,
            started,
            scope_key,
            on_prepared=on_prepared,
            inbound=inbound,
            hosting=hosting,
        )
    except asgi.ClientDisconnected:  # gone while its compaction or MCP planning ran (cancelled)
        metrics.disconnects.labels("before_upstream").inc()
        return
    except ProxyError as error:
        await refuse(
            services,
            send,
            error,
            request_id,
            started,
            outcome=refused_outcome(error),
            stream=stream_label,
            model=model,
        )
        return
    exchange, queued = admitted.exchange, admitted.queued
    if queued is not None:  # it runs in background.py, counted and logged there
        assert stateful is not None
        await answer_background(stateful, scope_key, queued, inbound, send, id_header, stream)
        return
    async with answering(deps, exchange, stream_label, model, body) as answer:
        try:
            timed_send = asgi.with_send_timeout(send, settings.send_timeout)
            if hosting.plan is not None and stream:
                work = hosting.answer(exchange, SseSink(timed_send, request_id))
            elif hosting.plan is not None:
                work = hosting.answer_json(exchange, timed_send)
            elif stream:
                work = exchange.stream(SseSink(timed_send, request_id))
            else:
                work = exchange.answer(timed_send)
            if await asgi.run_until_disconnect(inbound, work):
                answer.gone()
            else:
                answer.ended()
        except ProxyError as error:  # before the first byte: an HTTP error
            answer.refused(error)
            if isinstance(error, UnavailableError):
                id_header = [*id_header, (b"retry-after", b"1")]
            await asgi.send_error(send, error, id_header)


async def probed(state: ServerState) -> None:
    """Before the first capability probe has ended (a new worker), wait for it: what upstream
    can do is not known yet (capability.py `first_probe`; 503 when it does not end in time)."""
    if not state.probed.is_set():
        await until_drained(state, first_probe(state))


def passes_through(settings: Settings, state: ServerState, model: Any) -> bool:
    """Whether a body for `model` goes to upstream untouched rather than repaired: a model
    outside `repair_models`, or an upstream that cannot give token ids with
    `passthrough_when_incapable`."""
    return (isinstance(model, str) and not settings.repairs(model)) or (
        not state.capability.token_ids and settings.passthrough_when_incapable
    )


@dataclass
class Admitted:
    """A request that passed every check before upstream: its exchange, the context it
    continues (None: no store), and its queued object when it runs in the background."""

    exchange: Exchange
    context: Context | None
    queued: dict[str, Any] | None = None


async def admit(
    services: Services,
    scope: Scope,
    body: dict[str, Any],
    request_id: str,
    started: float,
    scope_key: str,
    *,
    on_prepared: Callable[[], None] | None = None,
    previous_response_id: str | None = None,
    inbound: asgi.Disconnects | None = None,
    hosting: Hosting | None = None,
) -> Admitted:
    """Render `body` (with its stored context), check what upstream can do and the stream
    limit, and make its exchange; a refusal raises `ProxyError`. `previous_response_id`: the
    response `body`'s input already continues (a WebSocket session's own, merged by it), echoed
    in the response object."""
    deps, stateful = services.deps, services.stateful
    state, settings = deps.state, deps.settings
    context: Context | None = None
    # A body may ask to be compacted first (server/compaction.py); a client gone during that
    # pass (`inbound`) cancels it: `asgi.ClientDisconnected`.
    # Hosted MCP tools are planned (listed, turned into namespaces) before rendering.
    render: Callable[[dict[str, Any]], Awaitable[PreparedRequest]] = (
        deps.renderer.prepare if hosting is None else hosting.render
    )
    if deps.tracing is not None:
        render = deps.tracing.traced("render", render)
    body, render = compacting(deps, body, render, request_id, started, scope["headers"], inbound)
    try:
        with maybe_span(deps.tracing, "prepare"):  # stored history read, then rendered
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
    if previous_response_id is not None:
        echo = {**prepared.echo, "previous_response_id": previous_response_id}
        prepared = replace(prepared, echo=echo)
    if not state.capability.token_ids:
        raise UpstreamError(
            f"cannot repair: {state.capability.detail}",
            status=503 if not state.capability.reachable else 502,
            code="upstream_not_capable",
        )
    if prepared.top_logprobs is not None and not state.capability.logprobs:
        # Never a silent empty list: the client learns before generation.
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
        deps.metrics.constraint_refusals.labels(constraint.kind).inc()
        raise ClientError(
            refusal(constraint, state.capability), param=constraint.param, code=NOT_ENFORCED
        )
    check_stream_room(deps)
    exchange = Exchange(
        deps,
        prepared,
        request_id,
        started,
        scope["headers"],
        guided=guided,
        takes_response_format=state.capability.takes_response_format,
    )
    admitted = Admitted(exchange, context)
    if context is not None and stateful is not None and context.recorded:
        if context.background and services.background is not None:
            admitted.queued = await services.background.launch(exchange, context, scope_key)
        else:
            exchange.recorder = recorder(stateful, exchange.response_id, scope_key, context)
    return admitted


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
