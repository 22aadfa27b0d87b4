"""The store writer: one `apply` for the writes of every response in flight, `flush` waits for
its batch, failures are reported and never stop the writer, the backlog is bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from proxy.store import Append, Create, Op, StoreError
from proxy.store.memory import MemoryStore
from proxy.store.writer import StoreWriter


class Pending:
    """A source: writes handed over when the writer takes them."""

    def __init__(self, *ops: Op) -> None:
        self.ops = list(ops)
        self.taken = 0

    def take(self) -> list[Op]:
        self.taken += 1
        ops, self.ops = self.ops, []
        return ops


class Recording(MemoryStore):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.batches: list[list[Op]] = []
        self.fail = fail

    async def apply(self, ops: Sequence[Op]) -> int:
        self.batches.append(list(ops))
        await asyncio.sleep(0.01)
        if self.fail:
            raise StoreError("disk full")
        return await super().apply(ops)


def create(key: str) -> Create:
    return Create(key, "s", b"{}", created=1.0, expires=2.0**40)


@pytest.mark.parametrize(("window", "batches"), [(0.0, [2, 1, 5]), (0.05, [2, 6])])
def test_sources_scheduled_together_go_in_one_apply_and_flush_waits(
    window: float, batches: list[int]
) -> None:
    """Without a window, writes arriving while a batch is applied make the next batch; with
    one, the writer gathers for it — unless a flush waits (then at once)."""

    async def scenario() -> None:
        store = Recording()
        writer = StoreWriter(store, lambda error, count, dropped: None, window=window)
        writer.start()
        first, second = Pending(create("a")), Pending(create("b"))
        assert writer.schedule(first)
        assert writer.schedule(first)  # pending once
        await writer.flush(second)
        assert [len(batch) for batch in store.batches] == [2]
        assert first.taken == second.taken == 1
        assert await store.get("s", "a") is not None
        third = Pending(Append("a", 1, b"x"))
        writer.schedule(third)
        await asyncio.sleep(0)
        for n in range(5):
            writer.schedule(Pending(Append("b", n, b"y")))
        await writer.flush(Pending())
        assert [len(batch) for batch in store.batches] == batches
        await writer.aclose()

    asyncio.run(scenario())


def test_failed_batch_is_reported_and_the_writer_goes_on() -> None:
    async def scenario() -> None:
        store = Recording(fail=True)
        failures: list[tuple[str, int, bool]] = []
        writer = StoreWriter(
            store, lambda e, count, dropped: failures.append((str(e), count, dropped))
        )
        writer.start()
        with pytest.raises(StoreError, match="disk full"):
            await writer.flush(Pending(create("a"), Append("a", 0, b"e")))
        assert failures == [("disk full", 2, False)]
        store.fail = False
        await writer.flush(Pending(create("b")))
        assert await store.get("s", "b") is not None
        await writer.aclose()

    asyncio.run(scenario())


def test_backlog_is_bounded_and_close_writes_what_is_pending() -> None:
    async def scenario() -> None:
        store = Recording()
        failures: list[bool] = []
        writer = StoreWriter(
            store, lambda e, count, dropped: failures.append(dropped), max_pending=2
        )
        assert writer.schedule(Pending(create("a")))
        assert writer.schedule(Pending(create("b")))
        assert not writer.schedule(Pending(create("c")))  # not started: the backlog is full
        assert failures == [True]
        with pytest.raises(StoreError, match="backlog"):
            await writer.flush(Pending(create("d")))
        writer.start()
        await writer.aclose()
        assert await store.get("s", "a") is not None
        assert await store.get("s", "b") is not None
        assert await store.get("s", "c") is None

    asyncio.run(scenario())


class Frames:
    """A recorder-like source: one log entry per take with every frame added since."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.frames: list[bytes] = []
        self.mark = 0
        self.created = False

    def add(self, frame: bytes) -> None:
        self.frames.append(frame)

    def take(self) -> list[Op]:
        ops: list[Op] = [] if self.created else [create(self.key)]
        self.created = True
        if self.frames:
            self.mark += len(self.frames)
            ops.append(Append(self.key, self.mark, b"".join(self.frames)))
            self.frames = []
        return ops


def test_a_source_is_taken_at_most_once_per_interval_unless_flushed() -> None:
    """Frames every 10 ms, interval 60 ms: the first at once (its record), then one log entry
    for several frames; the deferred ones are written without another schedule; a flush and
    a new source are not held; `aclose` writes what is deferred."""

    async def scenario() -> None:
        store = Recording()
        writer = StoreWriter(store, lambda e, count, dropped: None, window=0.005, interval=0.06)
        writer.start()
        stream = Frames("a")
        began = asyncio.get_running_loop().time()
        for n in range(12):
            stream.add(b"%d," % n)
            writer.schedule(stream)
            await asyncio.sleep(0.01)
        elapsed = asyncio.get_running_loop().time() - began
        log = await store.read_log("a")
        assert log[0] == (1, b"0,")  # created with its first frame, at once
        # 12 frames in `elapsed` (~120 ms on a quiet machine): the first batch, then at most
        # one per 60 ms
        assert 2 <= len(store.batches) <= 2 + elapsed / 0.06, (store.batches, elapsed)
        assert len(log) < 12
        # nothing scheduled since: what was deferred is written all the same
        await asyncio.sleep(0.15)
        log = await store.read_log("a")
        assert b"".join(data for _, data in log) == b"".join(b"%d," % n for n in range(12))
        # a flush is not held by the interval, nor is a new source
        stream.add(b"end")
        before = len(store.batches)
        waited = asyncio.get_running_loop().time()
        await writer.flush(stream)
        assert asyncio.get_running_loop().time() - waited < 0.05
        assert (await store.read_log("a"))[-1] == (13, b"end")
        fresh = Frames("b")
        fresh.add(b"x")
        await writer.flush(fresh)
        assert len(store.batches) == before + 2
        # deferred writes at close: written, not dropped
        stream.add(b"last")
        writer.schedule(stream)
        await writer.aclose()
        assert (await store.read_log("a"))[-1] == (14, b"last")

    asyncio.run(scenario())


def test_a_large_batch_is_taken_in_slices_with_the_loop_running_between() -> None:
    """Taking thousands of sources at once would hold the loop: between slices of `TAKE_SLICE`
    seconds of takes, other callbacks run; every source's writes still go in one apply."""

    async def scenario() -> None:
        now = [0.0]

        def clock() -> float:
            now[0] += 0.0004  # each read of the clock: 0.4 ms later
            return now[0]

        order: list[str] = []

        class Logged(Pending):
            def take(self) -> list[Op]:
                order.append("take")
                return super().take()

        store = Recording()
        writer = StoreWriter(store, lambda error, count, dropped: None, window=0.0, monotonic=clock)
        writer.start()
        sources = [Logged(create(f"r{n}")) for n in range(12)]
        for source in sources:
            writer.schedule(source)

        async def ticker() -> None:
            while len(order) < 12 + order.count("tick"):
                order.append("tick")
                await asyncio.sleep(0)

        ticking = asyncio.create_task(ticker())
        await writer.flush(sources[0])
        await ticking
        takes = [n for n, what in enumerate(order) if what == "take"]
        assert len(takes) == 12
        assert any(order[n + 1] == "tick" for n in takes[:-1])  # the loop ran between slices
        assert [len(batch) for batch in store.batches] == [12]  # still one apply
        await writer.aclose()

    asyncio.run(scenario())
