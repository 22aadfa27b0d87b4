"""One `response.create` turn of a WebSocket session (routes/websocket.py reads the messages and
runs one turn at a time): the decisions of `POST /v1/responses` (routes/responses.py), then the
same admission and exchange.

    hold the message's size in the body budget until rendered (http/budget.py); none free in
        `body_budget_wait` ─▶ `error` 503 `body_budget_exhausted`, the connection stays open
    first capability probe not ended yet? ─▶ wait for it (routes/repair.py `probed`)
    a model outside `repair_models`, or an incapable upstream with `passthrough_when_incapable`
        ─▶ `error`: over HTTP it would go to upstream untouched, and upstream has no WebSocket
        mode to take it
    `previous_response_id` naming the session's unstored last response ─▶ the history the
        session kept, merged (harmony/history/session.py; one over the bound is a 400)
    admit (routes/repair.py) ─▶ the exchange, its events written by a `WebSocketSink`, counted
        and logged by `answering` (outcome.py) as over HTTP, with `transport: ws`; hosted MCP
        tools run in the same loop (server/hosted/); `generate: false` ─▶ a warm-up
    ended well ─▶ kept as the session's last response (stored: its id alone)

Every refusal before the turn's first event is an `error` event (`WebSocketSink.error`). A
response that starts or ends resets the session's idle clock (`Turns.active`); a refused turn
does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.types import Scope, Send

from proxy.config.settings import Settings
from proxy.errors import ClientError, ProxyError, UpstreamError
from proxy.harmony.history import session
from proxy.metrics.websocket import WebSocketMetrics
from proxy.semconv import OPERATION
from proxy.server import asgi
from proxy.server.deps import ServerState
from proxy.server.hosted.hosting import Hosting
from proxy.server.outcome import answering, outcome_of, refused_outcome, report
from proxy.server.routes.answers import count_refusal
from proxy.server.routes.repair import Admitted, admit, passes_through, probed
from proxy.server.services import Services
from proxy.server.sink import WebSocketSink
from proxy.server.stateful.scope import scope_of


class Turns:
    """The turns of one session (module doc): what it keeps between them, and their count."""

    def __init__(
        self,
        services: Services,
        scope: Scope,
        send: Send,
        metrics: WebSocketMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.services = services
        # The handshake's own headers are not the turns' (never forwarded upstream).
        headers = [(n, v) for n, v in scope["headers"] if not n.startswith(b"sec-websocket-")]
        self.scope = {**scope, "headers": headers}
        self.send = send
        self.metrics = metrics
        self.scope_key = scope_of(scope["headers"], services.settings.store_scope_header)
        self._clock = clock
        #: Turns answered.
        self.count = 0
        #: When a response last started or ended (the session opening counts as one).
        self.active = clock()
        self.kept: session.Kept | None = None
        #: Set by the session when the client closed: what the turn running watches, as a
        #: request over HTTP watches its client (the compaction pass, the MCP planning, the
        #: answer).
        self.closed = asgi.Closed()

    async def run(
        self, body: dict[str, Any], stream_id: str | None, *, size: int, generate: bool
    ) -> None:
        """Answer one turn whose message was `size` bytes (module doc)."""
        tracing = self.services.deps.tracing
        if tracing is None:
            await self._turn(body, stream_id, size, generate)
            return
        # A turn is a response of its own: a trace of its own, linked to the handshake's span.
        with tracing.linked(OPERATION):
            await self._turn(body, stream_id, size, generate)

    async def error(self, error: ProxyError, stream_id: str | None) -> None:
        """An `error` event on the connection."""
        await WebSocketSink(self.send, stream_id).error(error)
        self.metrics.messages.labels("out").inc()

    def forget(self) -> None:
        """The session ends: what it kept goes with it."""
        if self.kept is not None:
            self.metrics.kept.dec(self.kept.held)
            self.kept = None

    async def _turn(
        self, body: dict[str, Any], stream_id: str | None, size: int, generate: bool
    ) -> None:
        services = self.services
        deps, state, settings = services.deps, services.state, services.settings
        started = services.monotonic()
        request_id = deps.ids("req")
        if deps.tracing is not None:
            deps.tracing.genai_request(body, request_id)
        model = str(body.get("model"))
        hosting = Hosting(services.hosted, deps.renderer, self.closed)
        async with services.budget.reservation() as hold:  # until rendered, as over HTTP
            try:
                await hold.ensure(size)
                await probed(state)
                if passes_through(settings, state, body.get("model")):
                    raise _not_over_websocket(body.get("model"), settings, state)
                sent, continued = session.continuing(self.kept, body)
                admitted = await admit(
                    services,
                    self.scope,
                    sent,
                    request_id,
                    started,
                    self.scope_key,
                    on_prepared=hold.release,
                    previous_response_id=continued,
                    inbound=self.closed,
                    hosting=hosting,
                )
            except asgi.ClientDisconnected:  # gone while its compaction or MCP planning ran
                deps.metrics.disconnects.labels("before_upstream").inc()
                return
            except ProxyError as error:
                count_refusal(
                    services,
                    error,
                    request_id,
                    started,
                    outcome=refused_outcome(error),
                    stream="true",
                    model=model,
                    transport="ws",
                )
                await self.error(error, stream_id)
                return
        self.active = self._clock()
        exchange = admitted.exchange
        sink = WebSocketSink(self.send, stream_id)
        if not generate and hosting.plan is None:
            await self._warm_up(admitted, sink, model, body)
        else:
            async with answering(deps, exchange, "true", model, body, transport="ws") as answer:
                try:
                    if hosting.plan is not None:  # hosted MCP tools: the loop, as over HTTP
                        work = hosting.answer(exchange, sink, generate=generate)
                    else:
                        work = exchange.stream(sink)
                    if await asgi.run_until_disconnect(self.closed, work):
                        answer.gone()
                    else:
                        answer.ended()
                except ProxyError as error:  # upstream refused it before the first event
                    answer.refused(error)
                    await self.error(error, stream_id)
                finally:
                    self.metrics.messages.labels("out").inc(sink.sent)
                    self.count += 1
        self.active = self._clock()
        self._keep(admitted, sent)

    async def _warm_up(
        self, admitted: Admitted, sink: WebSocketSink, model: str, body: dict[str, Any]
    ) -> None:
        """`generate: false`: the request is validated and rendered, nothing is generated (no
        upstream request); a completed response without output, which later turns may continue
        with `previous_response_id`."""
        exchange = admitted.exchange
        events = exchange.core.start() + exchange.core.finish("stop", output_tokens=0)
        exchange.phase = "streaming"
        exchange.snapshot = events[-1]["response"]
        outcome = "client_disconnect"
        try:
            if exchange.recorder is not None:
                await exchange.recorder.finish(events)
            await sink.events(events)
            exchange.delivered = True
            outcome = outcome_of(exchange)
        except OSError:  # the client went
            pass
        finally:
            self.metrics.messages.labels("out").inc(sink.sent)
            self.count += 1
            report(self.services.deps, exchange, outcome, "true", model, body, transport="ws")

    def _keep(self, admitted: Admitted, sent: dict[str, Any]) -> None:
        """Keep the turn's response as the session's last, when it ended well (its history
        measured once, here)."""
        exchange = admitted.exchange
        snapshot = exchange.snapshot
        if snapshot is None or snapshot.get("status") not in ("completed", "incomplete"):
            return
        context = admitted.context
        kept = session.keep(
            exchange.response_id,
            stored=context is not None and context.store,
            made_from=context.body if context is not None else sent,
            output=snapshot.get("output") or [],
            limit=self.services.settings.ws_max_message_bytes,
        )
        self.metrics.kept.inc(kept.held - (self.kept.held if self.kept is not None else 0))
        self.kept = kept


def _not_over_websocket(model: Any, settings: Settings, state: ServerState) -> ProxyError:
    """The refusal of a turn that `POST /v1/responses` would pass to upstream untouched."""
    if isinstance(model, str) and not settings.repairs(model):
        return ClientError(
            f"model {model[:200]!r} is not repaired by this proxy (repair_models), so its "
            "requests go to upstream untouched, and upstream has no WebSocket mode; send them "
            "with POST /v1/responses",
            param="model",
            code="model_not_repaired",
        )
    capability = state.capability
    return UpstreamError(
        f"upstream cannot give token_ids ({capability.detail}), so requests go to it untouched "
        "(passthrough_when_incapable), and upstream has no WebSocket mode; send them with "
        "POST /v1/responses",
        status=503 if not capability.reachable else 502,
        code="upstream_not_capable",
    )
