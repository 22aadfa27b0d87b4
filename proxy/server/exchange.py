"""One repaired request's exchange with upstream: the pump from upstream frames through the core
to the client (a stream, or one JSON answer), its failures, and its stored copy's writes.

`response.created`/`in_progress` go out as soon as upstream accepted the request, before its
first token — or, with `created_before_upstream`, before upstream is asked: a refusal that
comes with its head is then a failure like the later ones. After that every failure — upstream
cut, `{"error": …}` frame, malformed frame, first-token or idle timeout, `[DONE]` without a
finish, shutdown — ends the stream with the core's `error` + `response.failed`; so does output
that breaks the request's `tool_choice` or `text.format` (the core's `violation`, code
`constraint_violated`), at once: the upstream request is closed there, and a `stream: false`
answer is the failed response object. A client that goes away cancels the exchange, whose
`async with` closes the upstream request at once (trtllm-serve then aborts generation).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.types import Send

from proxy.errors import ProxyError, UpstreamError
from proxy.harmony.constraint import CONSTRAINT_VIOLATED
from proxy.harmony.request.prepare import PreparedRequest
from proxy.harmony.response import ResponseContext
from proxy.harmony.stream.events import TERMINAL_EVENTS
from proxy.harmony.stream.repair import ResponseStream
from proxy.metrics.batch import HistogramBatch
from proxy.server import asgi
from proxy.server.deadline import Deadline
from proxy.server.deps import SHUTTING_DOWN, RepairDeps, until_drained
from proxy.server.selfcheck import SelfCheck
from proxy.server.sink import EventSink, Recording
from proxy.tracing import client_attributes
from proxy.upstream.completions import FrameError
from proxy.upstream.frames import Frames


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
    #: The client's headers as the scope has them, decoded only for the request upstream: a
    #: stream's life long they cost nothing beside the scope's own (bench/stream_memory.py).
    headers: asgi.RawHeaders
    selfcheck: SelfCheck = field(default_factory=SelfCheck)
    phase: str = "before_upstream"
    status: int = 200
    error_code: str | None = None
    first_content: float | None = None
    snapshot: dict[str, Any] | None = None
    #: The client has its whole answer (the terminal event, or the JSON body).
    delivered: bool = False
    #: Where the events of a stored response go; None: not stored.
    recorder: Recording | None = None
    #: Whether upstream enforces `response_format` (None: unknown), and whether it takes the
    #: field at all: a stock trtllm-serve takes and ignores it (sent anyway: harmless), a
    #: server that refused it in the probe would refuse the request (left out).
    guided: bool | None = None
    takes_response_format: bool = True
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
            clock=deps.clock,  # for completed_at
            seal=deps.reasoning_keys.seal if prepared.sealed_reasoning else None,
            top_logprobs=prepared.top_logprobs,
            constraint=prepared.constraint,
            leading=prepared.leading,
        )

    @property
    def core(self) -> ResponseStream:
        """The repair core, made at first use (see `stream`)."""
        return self._core or self._make_core()

    def _make_core(self) -> ResponseStream:
        """Make the core unless it exists: off the request's way to upstream (see `stream`)."""
        if self._core is None:
            deps = self.deps
            self._core = ResponseStream(deps.encoding, self.ctx, deps.ids, table=deps.tokens)
        return self._core

    @property
    def response_id(self) -> str:
        return self.ctx.response_id

    # -- the two answers: an event stream, or one JSON object --------------------------------

    async def stream(self, sink: EventSink) -> None:
        """The events, as upstream's frames come, written to `sink` (sink.py)."""
        if self.deps.settings.created_before_upstream:
            await self._stream_announced(sink)
            return
        # The core is made while upstream reads the request (its tables cost ~0.1 ms): the
        # callback runs when this task first waits for upstream. It is started only once
        # upstream answered.
        asyncio.get_running_loop().call_soon(self._make_core)
        async with self._opened() as frames:
            await self._start(sink)
            await self._run(sink, frames)
        await sink.close()

    async def _stream_announced(self, sink: EventSink) -> None:
        """`stream` with the response announced before upstream is asked: a refusal before
        upstream's head ends the stream as any later failure does (`error` + `failed`)."""
        await self._start(sink)
        try:
            async with self._opened() as frames:
                await self._run(sink, frames)
        except ProxyError as error:
            code = error.code or "upstream_error"
            if isinstance(error, UpstreamError):
                kind = "timeout" if code == "upstream_timeout" else code
                self.deps.metrics.upstream_errors.labels(kind).inc()
                if kind == "timeout":
                    self.deps.metrics.timeouts.labels("first_byte").inc()
            self.error_code = code
            await self._write(sink, self.core.fail(code, str(error)))
        await sink.close()

    async def _start(self, sink: EventSink) -> None:
        await sink.open()
        self.phase = "before_first_token"
        await self._write(sink, self.core.start())
        self.deps.metrics.first_event.observe(self.deps.monotonic() - self.started)

    async def _run(self, sink: EventSink, frames: Frames) -> None:
        try:
            async for events in self._pump(frames, keepalive=True):
                if events:
                    await self._write(sink, events)
                else:
                    await sink.keepalive()
        except _End as end:
            await self._write(sink, end.events)
        else:
            await frames.release()

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
                if self.error_code != CONSTRAINT_VIOLATED:  # that one answers the failed object
                    message = end.events[-2]["message"]
                    status = 504 if self.error_code == "upstream_timeout" else 502
                    raise UpstreamError(message, status=status, code=self.error_code) from None
            else:
                await frames.release()
        assert self.snapshot is not None
        await asgi.send_json(
            send, 200, self.snapshot, [(b"x-request-id", self.request_id.encode())]
        )
        self.delivered = True

    async def batches(self) -> AsyncGenerator[list[dict[str, Any]], None]:
        """The events, batch by batch, for a caller that writes them itself (the hosted-tool
        loop, server/hosted/): the start, each frame's ([] = time for a keepalive), and the end
        — a failure's closing events included. An error before upstream answered raises, as
        in `stream`."""
        async with self._opened() as frames:
            self.phase = "before_first_token"
            yield self.core.start()
            try:
                async for events in self._pump(frames, keepalive=True):
                    yield events
            except _End as end:
                yield end.events
            else:
                await frames.release()

    # -- the pump ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _opened(self) -> AsyncIterator[Frames]:
        """Upstream's stream; the wait for its head ends with a 503 at the drain's end."""
        async with contextlib.AsyncExitStack() as stack:
            tracing = self.deps.tracing
            if tracing is not None:  # a CLIENT span to the stream's end; upstream joins it
                url = self.deps.upstream.base_url + "/v1/completions"
                span = stack.enter_context(
                    tracing.span("POST", client_attributes(url), client=True)
                )
            opened = stack.enter_async_context(self._upstream())
            frames = await until_drained(self.deps.state, opened)
            if tracing is not None:
                span.add_event("upstream.head")
                span.set_attribute("http.response.status_code", 200)
            yield frames

    def _upstream(self) -> Any:
        # The client's own X-Request-Id is replaced by ours (the same when it was a sane one),
        # as on the pass-through route: never two of them, never the client's junk, upstream.
        headers = [(n, v) for n, v in asgi.decoded(self.headers) if n.lower() != asgi.REQUEST_ID]
        if self.deps.tracing is not None:  # within the CLIENT span (`_opened`)
            headers = self.deps.tracing.inject(headers)
        body = self.prepared.completion_body
        # Sent once: the prompt's ids are not kept for the stream's life (its count is in `ctx`).
        self.prepared = replace(self.prepared, prompt_token_ids=[], completion_body={})
        if not self.takes_response_format and "response_format" in body:
            body = {key: value for key, value in body.items() if key != "response_format"}
        # An iterator, read once when the request is sent: the context manager keeps its
        # arguments for the stream's life, and an iterator read to its end holds nothing.
        return self.deps.upstream.completion_stream(
            body,
            iter([*headers, (asgi.REQUEST_ID, self.request_id)]),
            timeout=self.deps.settings.first_token_timeout,
        )

    async def _pump(
        self, frames: Frames, *, keepalive: bool
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield the events of each upstream frame ([] = time for a keepalive) until the core
        ended; raise `_End` with the failure events when the stream breaks.

        Both deadlines count from the last *token*: the first token within
        `first_token_timeout` of the request, each next one within `idle_timeout` of the one
        before. Frames without tokens (empty ones, the usage frame) reset neither, so an
        upstream that sends one token and then empty frames for ever still ends in
        `upstream_timeout`. Keepalives count from the last bytes written to the client.

        The wait for a frame is one `await` under a deadline (`Frames` is cancel-safe), so a
        frame reaches the core one event-loop wake-up after its bytes: no task, timer or
        `asyncio.wait` per frame. The drain's end expires the current wait at once."""
        deps, settings, core = self.deps, self.deps.settings, self.core
        state = deps.state
        # Two histograms per frame, observed in batches (metrics/batch.py, `HistogramBatch`): a
        # prometheus_client `observe` takes its locks, ~2 µs, and frames come by the thousand.
        overhead = HistogramBatch(deps.metrics.frame_overhead)
        frame_tokens = HistogramBatch(deps.metrics.repair.tokens_per_frame)
        # One lazily re-armed timer for all the waits, not an `asyncio.timeout` per frame
        # (~14 µs each); the drain's end expires the current wait through it.
        waits = Deadline()
        state.interrupts.add(waits.expire)
        deadline = self.started + settings.first_token_timeout
        timeout_kind = "first_token"
        ping_every = settings.keepalive_interval if keepalive else math.inf
        ping_at = deps.monotonic() + ping_every
        try:
            while not core.ended:
                if state.force_end:
                    self._fail(SHUTTING_DOWN, "the proxy is shutting down")
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
                    events = core.feed(frame.token_ids, frame.logprobs, frame.top_logprobs)
                    if frame.token_ids:
                        self.phase = "streaming"
                        timeout_kind = "idle"
                        deadline = arrived + settings.idle_timeout
                if frame.finish_reason is not None and core.violation is None:
                    events += core.finish(frame.finish_reason, frame.stop_reason)
                if core.violation is not None:
                    self._violated(events)
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
        if code != SHUTTING_DOWN:  # our own drain, not upstream's fault
            kind = "timeout" if code == "upstream_timeout" else code
            self.deps.metrics.upstream_errors.labels(kind).inc()
        raise _End(self.core.fail(code, message))

    def _violated(self, events: list[dict[str, Any]]) -> None:
        """The output broke its constraint: end the response after `events` (and the upstream
        request with it), counted by the constraint's kind and whether upstream enforced it."""
        violation = self.core.violation
        assert violation is not None
        self.error_code = CONSTRAINT_VIOLATED
        enforced = "true" if self.guided else "false"
        self.deps.metrics.constraint_violations.labels(violation.kind, enforced).inc()
        message = violation.failure(bool(self.guided))
        raise _End(events + self.core.fail(CONSTRAINT_VIOLATED, message))

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

    async def _write(self, sink: EventSink, events: list[dict[str, Any]]) -> None:
        recorder = self.recorder
        if recorder is None or not self.core.ended:
            if recorder is not None:
                recorder.add(events)
            await sink.events(events)
        elif not recorder.end(events):
            await sink.events(events)
        else:
            # The terminal event (last) is stored before the client sees it; the last frame's
            # tokens before it go out meanwhile, not after the commit.
            head, terminal = events[:-1], events[-1:]
            try:
                if head:
                    await sink.events(head)
            finally:
                await recorder.stored()
            await sink.events(terminal)
        # The check follows what was written, after the bytes are on their way (latency).
        self.selfcheck.observe(events)
        self._note(events)
        self.delivered = self.core.ended

    def _note(self, events: list[dict[str, Any]]) -> None:
        if self.first_content is None and any(e["type"].endswith(".delta") for e in events):
            self.first_content = self.deps.monotonic()
            self.deps.metrics.first_content.observe(self.first_content - self.started)
        last = events[-1] if events else None
        if last is not None and last["type"] in TERMINAL_EVENTS:
            self.snapshot = last["response"]
