"""Metrics around any store backend (house style: instrumentation as an adapter).

`Measured` is a `Store` that times every call of the one it wraps
(`proxy_store_operation_seconds{op}`), counts the calls that failed (`proxy_store_errors_total
{op}`) and the entries evicted (`proxy_store_evictions_total{reason}`), and refreshes the
stored-responses and bytes gauges from `stats()`. Waits (`wait_log`, `next_signals`) are counted
when they fail but not timed: their time is the time nothing happened.

With tracing on, a timed call made inside a traced request is a span `store {op}` under it;
calls of the store's own tasks (the batched writer, the sweeper) belong to no request and
make none.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from proxy.metrics.serving import Metrics
from proxy.store.base import Entry, Op, Stats, Store, StoreError
from proxy.tracing import Tracing

_T = TypeVar("_T")


class Measured(Store):
    """`store`, measured on `metrics` (module docstring)."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        tracing: Tracing | None = None,
    ) -> None:
        self.inner = store
        self._tracing = tracing
        self.kind = store.kind
        self._metrics = metrics
        self._monotonic = monotonic

    async def _measure(self, op: str, work: Awaitable[_T], *, timed: bool = True) -> _T:
        tracing = self._tracing
        if tracing is not None and timed and tracing.current().get_span_context().is_valid:
            attributes = {"db.operation.name": op, "proxy.store_backend": self.kind}
            with tracing.span(f"store {op}", attributes):
                return await self._timed(op, work, timed=timed)
        return await self._timed(op, work, timed=timed)

    async def _timed(self, op: str, work: Awaitable[_T], *, timed: bool) -> _T:
        started = self._monotonic()
        try:
            result = await work
        except StoreError:
            self._metrics.store.errors.labels(op).inc()
            raise
        if timed:
            self._metrics.store.seconds.labels(op).observe(self._monotonic() - started)
        return result

    async def apply(self, ops: Sequence[Op]) -> int:
        evicted = await self._measure("apply", self.inner.apply(ops))
        if evicted:
            self._metrics.store.evictions.labels("size").inc(evicted)
        return evicted

    async def get_many(self, scope: str, keys: Sequence[str]) -> list[Entry | None]:
        return await self._measure("get", self.inner.get_many(scope, keys))

    async def read_log(self, key: str, after: int = -1) -> list[tuple[int, bytes]]:
        return await self._measure("read_log", self.inner.read_log(key, after))

    async def wait_log(self, key: str, after: int, timeout: float) -> list[tuple[int, bytes]]:
        return await self._measure(
            "wait_log", self.inner.wait_log(key, after, timeout), timed=False
        )

    async def resolve(self, scope: str, alias: str) -> str | None:
        return await self._measure("resolve", self.inner.resolve(scope, alias))

    async def next_signals(self, timeout: float) -> list[tuple[str, str]]:
        return await self._measure("signals", self.inner.next_signals(timeout), timed=False)

    async def sweep(self, now: float) -> int:
        gone = await self._measure("sweep", self.inner.sweep(now))
        if gone:
            self._metrics.store.evictions.labels("ttl").inc(gone)
        return gone

    async def stats(self) -> Stats:
        stats = await self._measure("stats", self.inner.stats())
        self._metrics.store.responses.set(stats.entries)
        self._metrics.store.bytes.set(stats.bytes)
        return stats

    async def ping(self) -> None:
        await self._measure("ping", self.inner.ping())

    async def aclose(self) -> None:
        await self.inner.aclose()
