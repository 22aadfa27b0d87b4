"""`Push` and `Remove` (a conversation's items), on every store backend: the store
numbers pushed entries, concurrent pushes from two handles (two processes) never collide,
interleave or get lost, and a removed entry's bytes no longer count."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from proxy.store import Create, Delete, Push, Remove, Store
from tests.store_support import BACKENDS, Opener, opener_for

HOUR = 3600.0


@pytest.fixture(params=BACKENDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    return opener_for(request.param, tmp_path, url)


def create(key: str, doc: bytes = b"{}") -> Create:
    now = time.time()
    return Create(key, "alice", doc, now, now + HOUR)


async def data(store: Store, key: str) -> list[bytes]:
    return [entry for _, entry in await store.read_log(key)]


def test_push_numbers_entries_after_the_last(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener()
        await store.apply([create("conv_a"), Push("conv_a", (b"i0", b"i1"))])
        await store.apply([Push("conv_a", (b"i2",)), Push("conv_a", ())])
        log = await store.read_log("conv_a")
        assert [entry for _, entry in log] == [b"i0", b"i1", b"i2"]
        marks = [mark for mark, _ in log]
        assert marks == sorted(set(marks))  # distinct and growing
        assert await store.read_log("conv_a", marks[0]) == log[1:]
        await store.apply([Push("conv_gone", (b"x",))])  # no entry: nothing written
        assert await store.read_log("conv_gone") == []
        assert await store.get("alice", "conv_gone") is None
        await store.aclose()

    asyncio.run(scenario())


def test_remove_takes_one_entry_out_and_frees_its_bytes(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener()
        await store.apply([create("conv_a", b"doc"), Push("conv_a", (b"aa", b"bbbb", b"c"))])
        assert (await store.stats()).bytes == 3 + 7
        marks = [mark for mark, _ in await store.read_log("conv_a")]
        await store.apply([Remove("conv_a", marks[1]), Remove("conv_a", marks[1])])
        assert await data(store, "conv_a") == [b"aa", b"c"]
        assert (await store.stats()).bytes == 3 + 3
        # the last one removed: later pushes still come after everything left
        await store.apply([Remove("conv_a", marks[2]), Push("conv_a", (b"d", b"e"))])
        log = await store.read_log("conv_a")
        assert [entry for _, entry in log] == [b"aa", b"d", b"e"]
        assert [mark for mark, _ in log] == sorted({mark for mark, _ in log})
        assert (await store.stats()).bytes == 3 + 4
        await store.apply([Remove("conv_a", 10_000), Remove("conv_gone", 0)])  # nothing there
        await store.apply([Delete("conv_a")])
        assert (await store.stats()).bytes == 0
        assert await store.read_log("conv_a") == []
        await store.aclose()

    asyncio.run(scenario())


def test_concurrent_pushes_from_two_handles_lose_nothing(opener: Opener) -> None:
    """Two handles (two processes' worth) push batches at once: every batch lands whole, in one
    order both handles read the same."""

    async def scenario() -> None:
        first = await opener()
        second = await opener()
        await first.apply([create("conv_a")])

        async def pusher(store: Store, name: str) -> None:
            for batch in range(20):
                items = tuple(f"{name}{batch}.{n}".encode() for n in range(3))
                await store.apply([Push("conv_a", items)])

        await asyncio.gather(pusher(first, "a"), pusher(second, "b"))
        seen = await data(first, "conv_a")
        assert seen == await data(second, "conv_a")
        assert len(seen) == 2 * 20 * 3
        for start in range(0, len(seen), 3):  # each batch whole, in its own order
            name, _, _ = seen[start].decode().partition(".")
            assert seen[start : start + 3] == [f"{name}.{n}".encode() for n in range(3)]
        for name in ("a", "b"):  # each writer's batches in the order it pushed them
            mine = [e.decode() for e in seen if e.decode().startswith(name)]
            assert mine == [f"{name}{b}.{n}" for b in range(20) for n in range(3)]
        await first.aclose()
        await second.aclose()

    asyncio.run(scenario())
