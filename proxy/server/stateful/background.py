"""`background: true`: responses that run in the proxy whether or not a client listens, and
`POST /v1/responses/{id}/cancel`.

A background response is recorded in the store *before* it is answered (status `queued`; a
store that cannot take it is a 503), then runs as a task of this process: the same `Exchange`
as a foreground stream, writing to no client — its events go only to the store, where `GET`
(polling) and `GET ?stream=true` (resuming) find them, on any process or replica sharing the
store. `stream: true` on the create is one such resume, from the first event: the client
that drops it loses nothing and stops nothing.

Cancel: the process running the response cancels its task (the upstream request is closed at
once: trtllm-serve stops generating) and the core ends it with status `cancelled`. A cancel
that arrives at another process raises the store's `cancel` signal, which reaches this one by
`next_signals` (pub/sub on Redis, the poller on SQLite); lease renewals also look at the
entries' signals, so a signal missed while not listening is caught within seconds. At
shutdown, runs still going end as failed (`server_shutting_down`) like foreground streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any

from starlette.types import Send

from proxy.errors import ProxyError
from proxy.harmony.history.stored import StoredResponse
from proxy.harmony.response import response_object
from proxy.semconv import OPERATION
from proxy.server import asgi
from proxy.server.deps import SHUTTING_DOWN, RepairDeps
from proxy.server.exchange import Exchange
from proxy.server.outcome import outcome_of, report
from proxy.server.sink import NO_SINK
from proxy.server.stateful.follow import follow
from proxy.server.stateful.recording import recorder
from proxy.server.stateful.state import Context, Stateful
from proxy.store import CANCEL, Create, StoreError
from proxy.tracing import request_attributes

#: Seconds between looks at the running entries' signals (missed pub/sub, poller gaps).
CHECK_PERIOD = 5.0
#: Seconds runs cancelled at shutdown get to store their end.
_SHUTDOWN_GRACE = 5.0


@dataclass
class _Run:
    exchange: Exchange
    scope: str
    task: asyncio.Task[None] | None = None
    reason: str | None = None  # why we cancelled it: "cancel" or "shutdown"


class Background:
    """The background runs of this process (module docstring), over `stateful`'s store."""

    def __init__(self, deps: RepairDeps, stateful: Stateful) -> None:
        self._deps = deps
        self._stateful = stateful
        self.runs: dict[str, _Run] = {}
        self._listener: asyncio.Task[None] | None = None

    async def launch(self, exchange: Exchange, context: Context, scope: str) -> dict[str, Any]:
        """Record the response as queued (503 when the store cannot), start its run, and return
        the queued response object (what the create answers at once)."""
        deps, stateful = self._deps, self._stateful
        key = exchange.response_id
        queued = response_object(exchange.ctx, status="queued", output=[], usage=None)
        record = StoredResponse(queued, context.input, context.chain, True)
        now = stateful.clock()
        create = Create(
            key,
            scope,
            record.encode(),
            created=now,
            expires=now + deps.settings.store_ttl,
            lease=now + stateful.lease_seconds,
            aliases=tuple(item["id"] for item in context.input),
        )
        await stateful.guard(stateful.store.apply([create]))
        exchange.recorder = recorder(stateful, key, scope, context, created=True)
        run = _Run(exchange, scope)
        run.task = asyncio.create_task(
            self._run(run) if deps.tracing is None else self._traced(run)
        )
        self.runs[key] = run
        deps.metrics.background.set(len(self.runs))
        if self._listener is None or self._listener.done():
            # A context of its own: its store reads belong to no request's trace.
            self._listener = asyncio.create_task(self._listen(), context=contextvars.Context())
        return queued

    async def _traced(self, run: _Run) -> None:
        """`_run` under a span of its own, linked to the request's that started it."""
        tracing, ctx = self._deps.tracing, run.exchange.ctx
        assert tracing is not None
        attributes = request_attributes({"model": ctx.model}, run.exchange.request_id)
        with tracing.linked(f"{OPERATION} {ctx.model}", {**attributes, "proxy.background": True}):
            await self._run(run)

    async def _run(self, run: _Run) -> None:
        deps, exchange = self._deps, run.exchange
        keeper = exchange.recorder
        assert keeper is not None
        deps.state.in_flight += 1
        deps.metrics.in_flight.inc()
        outcome = "failed"
        try:
            try:
                await exchange.stream(NO_SINK)
                outcome = outcome_of(exchange)
            except ProxyError as error:  # upstream refused it before its first byte
                events = exchange.core.start() if exchange.phase == "before_upstream" else []
                events += exchange.core.fail(error.code or "upstream_error", error.message)
                await keeper.finish(events)
                outcome = "upstream_error"
            except asyncio.CancelledError:
                if run.reason is None:
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()  # ours: finish the stored copy, then end normally
                events = exchange.core.start() if exchange.phase == "before_upstream" else []
                if not exchange.core.ended:
                    if run.reason == "cancel":
                        events += exchange.core.cancel()
                        outcome = "cancelled"
                    else:
                        events += exchange.core.fail(SHUTTING_DOWN, "the proxy is shutting down")
                await keeper.finish(events)
        finally:
            deps.state.in_flight -= 1
            deps.metrics.in_flight.dec()
            self.runs.pop(exchange.response_id, None)
            deps.metrics.background.set(len(self.runs))
            report(deps, exchange, outcome, "false", exchange.prepared.model, {})

    def cancel(self, key: str) -> bool:
        """Cancel the run of `key` if it is in this process (idempotent)."""
        run = self.runs.get(key)
        if run is None or run.task is None:
            return False
        if run.reason is None:
            run.reason = "cancel"
            run.task.cancel()
        return True

    async def _listen(self) -> None:
        """Cancel signals raised anywhere, while this process runs background responses."""
        stateful = self._stateful
        store = stateful.store
        loop = asyncio.get_running_loop()
        checked = loop.time()
        while self.runs:
            try:
                for key, name in await store.next_signals(1.0):
                    if name == CANCEL:
                        self.cancel(key)
                if loop.time() - checked >= CHECK_PERIOD:
                    checked = loop.time()
                    for key, run in list(self.runs.items()):
                        entry = await store.get(run.scope, key)
                        if entry is not None and CANCEL in entry.signals:
                            self.cancel(key)
            except StoreError as exc:  # counted by the store's metrics; keep listening
                stateful.log_failure("store signals failed", None, exc)
                await asyncio.sleep(1.0)

    async def aclose(self, timeout: float) -> None:
        """Shutdown: runs get the drain period like open streams (the drain's end fails them
        with `server_shutting_down`); any still going then are ended as failed here."""
        tasks = [run.task for run in self.runs.values() if run.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for run in list(self.runs.values()):
            if run.task is not None and run.reason is None:
                run.reason = "shutdown"
                run.task.cancel()
        tasks = [run.task for run in self.runs.values() if run.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=_SHUTDOWN_GRACE)
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener


async def answer_background(
    stateful: Stateful,
    scope_key: str,
    queued: dict[str, Any],
    inbound: asgi.Inbound,
    send: Send,
    id_header: list[tuple[bytes, bytes]],
    stream: bool,
) -> None:
    """A background create's answer: the queued response at once, or its events from the
    store (a resume from the start: the client that drops it stops nothing)."""
    if not stream:
        await asgi.send_json(send, 200, queued, id_header)
        return
    await follow(stateful, scope_key, queued["id"], -1, inbound, send, id_header)
