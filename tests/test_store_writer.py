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
