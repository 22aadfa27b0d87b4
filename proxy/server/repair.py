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
`item_reference` are resolved and merged before rendering (stateful.py), every event batch goes
to the exchange's `Recorder` on its way out (the terminal batch — and a conversation's new
items — stored before the client sees it), and `background: true` hands the exchange to
background.py, which runs it with no client.

`response.created`/`in_progress` go out as soon as upstream accepted the request, before its
first token. After that every failure — upstream cut, `{"error": …}` frame, malformed frame,
first-token or idle timeout, `[DONE]` without a finish, shutdown — ends the stream with the
core's `error` + `response.failed`. A client that goes away cancels the exchange, whose
`async with` closes the upstream request at once (trtllm-serve then aborts generation).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from openai_harmony import HarmonyEncoding
from starlette.types import Scope, Send

from proxy import sse
from proxy.config import Settings
from proxy.errors import ClientError, ProxyError, UnavailableError, UpstreamError
from proxy.harmony.parser import TokenTable
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request import PreparedRequest
from proxy.harmony.request_prefix import PrefixCache
from proxy.harmony.response import IdFactory, ResponseContext
from proxy.harmony.stream import ResponseStream
from proxy.metrics import CLIENT_TIMEOUT, HistogramBatch, Metrics
from proxy.server import asgi
from proxy.server.background import answer_background
from proxy.server.deadline import Deadline
from proxy.server.render import Renderer
from proxy.server.selfcheck import SelfCheck
from proxy.server.stateful import Context, refuse_without_store, scope_of
from proxy.upstream.client import Capability, Frames, Upstream
from proxy.upstream.completions import FrameError

T = TypeVar("T")

if TYPE_CHECKING:
    from proxy.server.background import Background
    from proxy.server.recording import Recorder
    from proxy.server.stateful import Stateful

_UNKNOWN = Capability(False, False, "upstream not probed yet")


@dataclass
class ServerState:
    """Mutable state shared by all requests of one app (owned by the app, injected here)."""

    capability: Capability = _UNKNOWN
    in_flight: int = 0
    #: Requests being handled on the proxy's own routes (app.py), for the drain (runner.py).
    active: int = 0
    draining: bool = False
    #: True once the drain period is over: open streams end with `response.failed`.
    force_end: bool = False
    #: What wakes each open stream's wait for its next frame when the drain is over (a
    #: callback per stream, not a task per stream: memory per open stream, issue 7).
    interrupts: set[Callable[[], None]] = field(default_factory=set)

    def end_all(self) -> None:
        """The drain period is over: every open stream ends now."""
        self.force_end = True
        for interrupt in list(self.interrupts):
            interrupt()


@dataclass(frozen=True)
class RepairDeps:
    """Everything an exchange needs, injected by the app factory (house-style principle 5)."""

    settings: Settings
    encoding: HarmonyEncoding
    upstream: Upstream
    metrics: Metrics
    state: ServerState
    log: Callable[..., None]
    ids: IdFactory
    #: Rendered system + developer prompts, shared by the requests of one app.
    prefixes: PrefixCache
    #: Validation + rendering, off the event loop (render.py, issue 12); it opens input
    #: reasoning with the same keys and applies `max_prompt_tokens`.
    renderer: Renderer
    #: Seal `encrypted_content` of output reasoning items (issue 14).
    reasoning_keys: ReasoningKeys
    #: The bytes of token ids, shared by the streams of one app (None: one per stream).
    tokens: TokenTable | None = None
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    #: The response store's side of the shell (None: `store_url = off`) and the background
    #: runs (issue 13).
    stateful: Stateful | None = None
    background: Background | None = None


async def until_drained(state: ServerState, work: Awaitable[T]) -> T:
    """`await work`, unless the drain period ends first: then 503 `server_shutting_down`
    (issue 12: a request still rendering or waiting for upstream's head at the drain timeout
    gets a JSON 503, never a 500 from uvicorn's cancellation)."""
    timer: asyncio.Timeout | None = None

    def interrupt() -> None:
        if timer is not None and not timer.expired():
            timer.reschedule(asyncio.get_running_loop().time())

    state.interrupts.add(interrupt)
    try:
        if state.force_end:
            raise TimeoutError
        async with asyncio.timeout(None) as timer:
            return await work
    except TimeoutError:
        if not state.force_end:
            raise
        raise UnavailableError(
            "the proxy is shutting down; retry on another replica", code=_SHUTTING_DOWN
        ) from None
    finally:
        state.interrupts.discard(interrupt)
        if asyncio.iscoroutine(work):
            work.close()  # never awaited when the drain had already ended


class _End(Exception):
    """The stream ended abnormally after it started; carries the core's closing events."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events


@dataclass
class Exchange:
    """One repaired request/response (see the module docstring)."""

    deps: RepairDeps
    prepared: PreparedRequest
    request_id: str
    started: float
    headers: list[tuple[str, str]]
    selfcheck: SelfCheck = field(default_factory=SelfCheck)
    phase: str = "before_upstream"
    status: int = 200
    error_code: str | None = None
    first_content: float | None = None
    snapshot: dict[str, Any] | None = None
    #: The client has its whole answer (the terminal event, or the JSON body).
    delivered: bool = False
    #: Where the events of a stored response go (issue 13); None: not stored.
    recorder: Recorder | None = None
    ctx: ResponseContext = field(init=False)
    _core: ResponseStream | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        deps, prepared = self.deps, self.prepared
        self.ctx = ResponseContext(
            response_id=deps.ids("resp"),
            created_at=float(int(deps.clock())),
            model=prepared.model,
            echo=prepared.echo,
            input_tokens=len(prepared.prompt_token_ids),
            namespaces=prepared.namespaces,
            coalesce_deltas=deps.settings.delta_mode == "coalesce",
            clock=deps.clock,  # completed_at (issue 14)
            seal=deps.reasoning_keys.seal if prepared.sealed_reasoning else None,
        )

    @property
    def core(self) -> ResponseStream:
        """The repair core, made at first use (see `stream`)."""
        return self._core or self._make_core()

    def _make_core(self) -> ResponseStream:
        """Make the core unless it exists: off the request's way to upstream (issue 17)."""
        if self._core is None:
            deps = self.deps
            self._core = ResponseStream(deps.encoding, self.ctx, deps.ids, table=deps.tokens)
        return self._core

    @property
    def response_id(self) -> str:
        return self.ctx.response_id

    # -- the two answers: an event stream, or one JSON object --------------------------------

    async def stream(self, send: Send) -> None:
        headers = [*asgi.SSE_HEADERS, (b"x-request-id", self.request_id.encode())]
        # The core is made while upstream reads the request: the callback runs when this task
        # first waits for upstream (issue 17). It is started only once upstream answered.
        asyncio.get_running_loop().call_soon(self._make_core)
        async with self._opened() as frames:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            self.phase = "before_first_token"
            await self._write(send, self.core.start())
            self.deps.metrics.first_event.observe(self.deps.monotonic() - self.started)
            try:
                async for events in self._pump(frames, keepalive=True):
                    if events:
                        await self._write(send, events)
                    else:
                        await send(
                            {"type": "http.response.body", "body": sse.KEEPALIVE, "more_body": True}
                        )
            except _End as end:
                await self._write(send, end.events)
            else:
                await _release(frames)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def answer(self, send: Send) -> None:
        """`stream: false`: the same path, answered with the terminal snapshot as JSON."""
        async with self._opened() as frames:
            self.phase = "before_first_token"
            started = self.core.start()
            self.selfcheck.observe(started)
            await self._keep(started)
            try:
                async for events in self._pump(frames, keepalive=False):
                    self.selfcheck.observe(events)
                    self._note(events)
                    await self._keep(events)
            except _End as end:
                self.selfcheck.observe(end.events)
                self._note(end.events)
                await self._keep(end.events)
                message = end.events[-2]["message"]
                status = 504 if self.error_code == "upstream_timeout" else 502
                raise UpstreamError(message, status=status, code=self.error_code) from None
            await _release(frames)
        assert self.snapshot is not None
        await asgi.send_json(
            send, 200, self.snapshot, [(b"x-request-id", self.request_id.encode())]
        )
        self.delivered = True

    # -- the pump ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _opened(self) -> AsyncIterator[Frames]:
        """Upstream's stream; the wait for its head ends with a 503 at the drain's end."""
        async with contextlib.AsyncExitStack() as stack:
            yield await until_drained(self.deps.state, stack.enter_async_context(self._upstream()))

    def _upstream(self) -> Any:
        # The client's own X-Request-Id is replaced by ours (the same when it was a sane one),
        # as on the pass-through route: never two of them, never the client's junk, upstream.
        headers = [(n, v) for n, v in self.headers if n.lower() != asgi.REQUEST_ID]
        return self.deps.upstream.completion_stream(
            self.prepared.completion_body,
            [*headers, (asgi.REQUEST_ID, self.request_id)],
            timeout=self.deps.settings.first_token_timeout,
        )

    async def _pump(
        self, frames: Frames, *, keepalive: bool
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield the events of each upstream frame ([] = time for a keepalive) until the core
        ended; raise `_End` with the failure events when the stream breaks.

        Both deadlines count from the last *token* (issue 12): the first token within
        `first_token_timeout` of the request, each next one within `idle_timeout` of the one
        before. Frames without tokens (empty ones, the usage frame) reset neither, so an
        upstream that sends one token and then empty frames for ever still ends in
        `upstream_timeout`. Keepalives count from the last bytes written to the client.

        The wait for a frame is one `await` under a deadline (`Frames` is cancel-safe), so a
        frame reaches the core one event-loop wake-up after its bytes: no task, timer or
        `asyncio.wait` per frame. The drain's end expires the current wait at once."""
        deps, settings, core = self.deps, self.deps.settings, self.core
        state = deps.state
        # Two histograms per frame, observed in batches (metrics.HistogramBatch, issue 17).
        overhead = HistogramBatch(deps.metrics.frame_overhead)
        frame_tokens = HistogramBatch(deps.metrics.tokens_per_frame)
        # One lazily re-armed timer for all the waits, not an `asyncio.timeout` per frame
        # (~14 µs each, issue 17); the drain's end expires the current wait through it.
        waits = Deadline()
        state.interrupts.add(waits.expire)
        deadline = self.started + settings.first_token_timeout
        timeout_kind = "first_token"
        ping_every = settings.keepalive_interval if keepalive else math.inf
        ping_at = deps.monotonic() + ping_every
        try:
            while not core.ended:
                if state.force_end:
                    self._fail(_SHUTTING_DOWN, "the proxy is shutting down")
                now = deps.monotonic()
                if now >= deadline:
                    deps.metrics.timeouts.labels(timeout_kind).inc()
                    if timeout_kind == "first_token":
                        limit, what = settings.first_token_timeout, "first token"
                    else:
                        limit, what = settings.idle_timeout, "next token"
                    self._fail("upstream_timeout", f"upstream sent no {what} within {limit:g} s")
                if now >= ping_at:
                    ping_at = now + ping_every
                    yield []
                    continue
                try:
                    async with waits.after(min(deadline, ping_at) - now):
                        frame = await frames.__anext__()
                except TimeoutError:
                    continue  # a deadline, a keepalive, or the drain's end: see above
                except StopAsyncIteration:
                    self._fail(
                        "upstream_incomplete",
                        "upstream closed the stream before the end of generation",
                    )
                except FrameError as exc:
                    self._fail(exc.code, exc.message)
                arrived = deps.monotonic()
                if frame.done:
                    self._fail(
                        "upstream_incomplete", "upstream sent [DONE] before the end of generation"
                    )
                events: list[dict[str, Any]] = []
                if frame.token_ids or frame.finish_reason is None:
                    events = core.feed(frame.token_ids)
                    if frame.token_ids:
                        self.phase = "streaming"
                        timeout_kind = "idle"
                        deadline = arrived + settings.idle_timeout
                if frame.finish_reason is not None:
                    events += core.finish(frame.finish_reason, frame.stop_reason)
                if events:
                    yield events
                    sent = deps.monotonic()
                    ping_at = sent + ping_every
                    overhead.observe(sent - arrived)
                    core.account()  # the recovery accounting, once the events are out
                if frame.token_ids or frame.finish_reason is None:
                    frame_tokens.observe(len(frame.token_ids))
        finally:
            state.interrupts.discard(waits.expire)
            waits.close()
            overhead.flush()
            frame_tokens.flush()

    def _fail(self, code: str, message: str) -> None:
        self.error_code = code
        if code != _SHUTTING_DOWN:  # our own drain, not upstream's fault
            kind = "timeout" if code == "upstream_timeout" else code
            self.deps.metrics.upstream_errors.labels(kind).inc()
        raise _End(self.core.fail(code, message))

    async def _keep(self, events: list[dict[str, Any]]) -> None:
        """Hand a batch to the recorder: at once, or — the terminal batch — stored first."""
        recorder = self.recorder
        if recorder is None:
            return
        if self.core.ended:
            await recorder.finish(events)
        else:
            recorder.add(events)

    def settle(self) -> list[dict[str, Any]]:
        """The exchange stopped early (client gone, error before its first byte, shutdown):
        the events that end its stored copy — `cancelled` once it had started."""
        if self.phase == "before_upstream" or self.core.ended:
            return []
        return self.core.cancel()

    async def _write(self, send: Send, events: list[dict[str, Any]]) -> None:
        if self.recorder is not None:
            await self._keep(events)
        await send(
            {"type": "http.response.body", "body": sse.encode_all(events), "more_body": True}
        )
        # The check follows what was written, after the bytes are on their way (latency).
        self.selfcheck.observe(events)
        self._note(events)
        self.delivered = self.core.ended

    def _note(self, events: list[dict[str, Any]]) -> None:
        if self.first_content is None and any(e["type"].endswith(".delta") for e in events):
            self.first_content = self.deps.monotonic()
            self.deps.metrics.first_content.observe(self.first_content - self.started)
        last = events[-1] if events else None
        if last is not None and last["type"] in _TERMINAL:
            self.snapshot = last["response"]


_SHUTTING_DOWN = "server_shutting_down"
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
#: After the finish frame upstream still sends the usage frame and `[DONE]` (at once, in
#: trtllm-serve's generator). Reading them, within these bounds, lets httpx put the connection
#: back into its pool; closing a response with unread body closes the connection instead, and
#: every request paid a new TCP connection to upstream (found by bench/latency.py, issue 7).
_RELEASE_SECONDS = 0.1
_RELEASE_FRAMES = 4


async def _release(frames: Frames) -> None:
    """Read the rest of a finished upstream stream (bounded) so its connection can be reused.
    The client already has its terminal event; only the end of its body waits for this.
    Whatever goes wrong here only means the connection is closed instead."""
    try:
        async with asyncio.timeout(_RELEASE_SECONDS):
            count = 0
            async for _ in frames:
                count += 1
                if count > _RELEASE_FRAMES:
                    return
    except (TimeoutError, FrameError):
        return


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
        if settings.max_concurrent_streams and state.in_flight >= settings.max_concurrent_streams:
            outcome = "rejected"
            raise ClientError(
                f"the proxy is serving its limit of {settings.max_concurrent_streams} streams; "
                "retry shortly",
                status=429,
                code="too_many_streams",
            )
        exchange = Exchange(deps, prepared, request_id, started, asgi.header_pairs(scope))
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
