"""One writer task per app: the store writes of every response in flight, batched.

The repaired route never awaits a store on its way to the client (a failed write never breaks
a foreground stream). A response's `Recorder` (proxy/server/stateful/recording.py)
hands its new events to the writer as a *source*: an object with `take() -> list[Op]`, called
when the writer gets to it. Events pile up in the source until then, so under load one log
entry holds several frames of events, and one `apply` — one SQLite transaction, one Redis
round trip — carries the writes of every response that had something new.

    sources ──schedule──▶ pending ──take()──▶ one batch ──apply──▶ store
                                                          └──▶ futures of `flush()` callers

`flush(source)` schedules and waits until the batch holding that source's writes is applied
(raising `StoreError` when it was not): the terminal event of a stored response is committed
before the client sees it, so a client that reads the response back at once finds it. The
pending backlog is bounded; past the bound a source's writes are dropped and counted as errors.

Unless someone waits in `flush`, the writer gathers writes for `window` seconds before it
applies them, and takes a source again at most every `interval` seconds after its last batch
(a new source at once: a stored response's record is created with its first events; a
`flush` at once: its end): a live follower sees events up to that much later, and the store
sees one transaction per window instead of one per upstream frame, and one log entry per
source per interval instead of one per frame (at 20 tokens per frame, 2 ms per token, a frame
comes every 40 ms: the 100 ms interval puts 2-3 frames in one entry). What a write costs the
store is mostly per entry and per transaction, not per byte: bench/store_workers.py measured
SQLite at 0.95 µs per token with one frame per entry, 0.50 with 2, 0.37 with 5 (BENCHMARKS.md).
Durability is unchanged: a stream's end is committed before its client sees it, and `aclose`
writes whatever is deferred.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol

from proxy.store.base import Op, Store, StoreError


class Source(Protocol):
    """Something with writes to make: `take()` hands them over (and forgets them)."""

    def take(self) -> list[Op]: ...


#: (error, how many writes it cost, whether they were dropped unapplied) → log and count; the
#: writer carries on. A failed apply is counted by the store's metrics; a drop only here.
OnError = Callable[[StoreError, int, bool], None]
#: Sources waiting at most; more means the store is far behind (down): their writes are dropped.
MAX_PENDING = 10_000
#: Seconds writes are gathered before a batch that nobody waits for is applied.
WINDOW = 0.01
#: Seconds after a source's last batch before it is taken again (unless flushed).
INTERVAL = 0.1
#: Seconds of `take()` calls in one go on the event loop; a batch of more yields between slices.
TAKE_SLICE = 0.001
#: A source not taken for this long is forgotten (its next writes count as new: taken at once).
FORGET_AFTER = 10 * INTERVAL


class StoreWriter:
    """Batches writes (module docstring). `start()` in the lifespan, `aclose()` at its end."""

    def __init__(
        self,
        store: Store,
        on_error: OnError,
        *,
        max_pending: int = MAX_PENDING,
        window: float = WINDOW,
        interval: float = INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._on_error = on_error
        self._max_pending = max_pending
        self._window = window
        self._interval = interval
        self._monotonic = monotonic
        #: When each source was last taken, by id(); the source is held so that its id is not
        #: reused while it is listed (a new source must never wait for an old one's interval).
        self._taken: dict[int, tuple[float, Source]] = {}
        self._forgotten_at = 0.0
        #: Pending sources to take in the next batch whatever their interval: new ones, and
        #: those a `flush` waits for.
        self._forced: set[int] = set()
        #: When the first deferred source is due (the pending ones are scanned only then, not
        #: every window: thousands of streams would make each batch cost a scan of them all).
        self._first_due = 0.0
        self._urgent = asyncio.Event()  # someone waits in flush(): no window
        #: Whether the last batch was applied: while it is not, callers do not wait on the
        #: store (a hung store would hold every stream's end for the full timeout).
        self.healthy = True
        self._pending: dict[int, Source] = {}  # by id(): a source is pending once
        self._flushed: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: Called with the number of entries evicted by each applied batch (a metric).
        self.on_evicted: Callable[[int], None] = lambda count: None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def schedule(self, source: Source) -> bool:
        """Have `source` taken in the next batch; False when the backlog is full (dropped)."""
        if id(source) in self._pending:
            return True
        if len(self._pending) >= self._max_pending or self._closing:
            self._on_error(StoreError("the store's write backlog is full"), 1, True)
            return False
        self._pending[id(source)] = source
        if id(source) not in self._taken:
            self._forced.add(id(source))  # new (or forgotten): taken at once
        self._wake.set()
        return True

    async def flush(self, source: Source) -> None:
        """Schedule `source` and wait until its writes are applied; `StoreError` if they were
        not (dropped, or the batch failed)."""
        if not self.schedule(source):
            raise StoreError("the store's write backlog is full")
        self._forced.add(id(source))
        if self._flushed is None:
            self._flushed = asyncio.get_running_loop().create_future()
        self._urgent.set()
        await asyncio.shield(self._flushed)

    async def _until_urgent(self, seconds: float) -> None:
        """Wait `seconds`, or less when a flush comes."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._urgent.wait()

    def _due(self) -> tuple[list[Source], float]:
        """The pending sources to take now (module docstring), taken out of `_pending`; and
        when the first of the others is due (inf: none left)."""
        now = self._monotonic()
        if now - self._forgotten_at > FORGET_AFTER:
            self._forgotten_at = now
            self._taken = {
                key: seen for key, seen in self._taken.items() if now - seen[0] < FORGET_AFTER
            }
        due: list[Source] = []
        if now < self._first_due and not self._closing:
            # nothing deferred is due yet: only the forced ones
            for key in self._forced:
                source = self._pending.pop(key, None)
                if source is not None:
                    due.append(source)
            first = self._first_due
        else:
            later: dict[int, Source] = {}
            first = float("inf")
            for key, source in self._pending.items():
                last = self._taken.get(key)
                if (
                    self._closing
                    or key in self._forced
                    or last is None
                    or now - last[0] >= self._interval
                ):
                    due.append(source)
                else:
                    later[key] = source
                    first = min(first, last[0] + self._interval)
            self._pending = later
            self._first_due = first
        self._forced.clear()
        for source in due:
            self._taken[id(source)] = (now, source)
        if due:  # their next writes are due an interval from now
            self._first_due = min(self._first_due, now + self._interval)
        return due, min(first, self._first_due)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if self._window and not self._closing and not self._urgent.is_set():
                await self._until_urgent(self._window)
            self._wake.clear()
            self._urgent.clear()
            sources, first = self._due()
            if not sources:
                if self._closing and not self._pending:
                    return
                if self._pending:  # none due yet: sleep until the first is (or a flush)
                    await self._until_urgent(min(first - self._monotonic(), self._interval))
                    self._wake.set()
                continue
            flushed, self._flushed = self._flushed, None
            ops: list[Op] = []
            until = self._monotonic() + TAKE_SLICE
            for source in sources:
                ops += source.take()
                if self._monotonic() >= until:
                    # Encoding thousands of streams' events at once would hold the loop (and
                    # their frames) for tens of ms: the loop runs between slices.
                    await asyncio.sleep(0)
                    until = self._monotonic() + TAKE_SLICE
            count = len(ops)
            error = await self._apply(ops)
            # The batch's bytes go now, not when the next batch replaces them: with every
            # stream in it, they are a log entry per stored stream (bench/stream_memory.py).
            del ops, sources
            self.healthy = error is None
            if error is not None:
                self._on_error(error, count, False)
            if flushed is not None and not flushed.done():
                if error is None:
                    flushed.set_result(None)
                else:
                    flushed.set_exception(error)
                    flushed.exception()  # retrieved here: callers may have gone away
            if self._closing and not self._pending:
                return
            if self._pending:  # deferred sources: due later, whether or not more come
                self._wake.set()

    async def _apply(self, ops: list[Op]) -> StoreError | None:
        """Apply one batch; the error, if it failed."""
        try:
            if ops:
                self.on_evicted(await self.store.apply(ops))
        except StoreError as exc:
            return exc
        except Exception as exc:  # a bug below us must not stop every later write
            return StoreError(f"{type(exc).__name__}: {exc}")
        return None

    async def aclose(self, timeout: float = 5.0) -> None:
        """Write what is pending (up to `timeout` seconds), then stop."""
        self._closing = True
        self._wake.set()
        self._urgent.set()
        if self._task is None:
            return
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
