"""One conformance suite, run on every store backend: memory, the embedded SQLite, real Redis.

What another proxy process sees is tested with a second handle on the same data (a second
SQLite connection on the file, a second Redis client), so sharing, live follow and signals are
checked across handles, not only within one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from proxy.store import (
    CANCEL,
    Append,
    Create,
    Delete,
    Lease,
    Signal,
    Store,
    StoreError,
    Update,
    open_store,
)
from proxy.store.redis_store import RedisStore
from proxy.store.sqlite import SqliteStore
from tests.live import free_port
from tests.store_support import BACKENDS, Opener, opener_for

_T = TypeVar("_T")
HOUR = 3600.0


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(coro)


@pytest.fixture(params=BACKENDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    return opener_for(request.param, tmp_path, url)


def create(key: str, scope: str = "alice", doc: bytes = b"{}", **kw: Any) -> Create:
    now = time.time()
    return Create(key, scope, doc, kw.pop("created", now), kw.pop("expires", now + HOUR), **kw)


async def closing(*stores: Store) -> None:
    for store in {id(s): s for s in stores}.values():
        await store.aclose()


def test_entries_are_visible_only_to_their_scope(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener()
        await store.apply([create("resp_a", doc=b'{"n":1}'), create("resp_b", scope="bob")])
        a = await store.get("alice", "resp_a")
        assert a is not None
        assert (a.key, a.scope, a.doc) == ("resp_a", "alice", b'{"n":1}')
        assert await store.get("bob", "resp_a") is None  # another key: not found, never data
        assert await store.get("alice", "resp_b") is None
        found = await store.get_many("alice", ["resp_b", "resp_a", "resp_missing"])
        assert [e.key if e else None for e in found] == [None, "resp_a", None]
        await store.aclose()

    run(scenario())


def test_update_replaces_the_document_and_never_creates(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener()
        await store.apply([create("resp_a", doc=b"old"), Update("resp_a", b"new", lease=5.0)])
        await store.apply([Update("resp_gone", b"x"), Append("resp_gone", 0, b"e")])
        a = await store.get("alice", "resp_a")
        assert a is not None
        assert (a.doc, a.lease) == (b"new", 5.0)
        assert await store.get("alice", "resp_gone") is None
        assert await store.read_log("resp_gone") == []
        await store.apply([Lease("resp_a", 9.0), Update("resp_a", b"newer")])
        a = await store.get("alice", "resp_a")
        assert a is not None
        assert (a.doc, a.lease) == (b"newer", 9.0)  # no lease given: the lease stays
        await store.aclose()

    run(scenario())


def test_log_is_read_after_a_mark_and_marks_only_grow(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener()
        await store.apply(
            [create("resp_a"), Append("resp_a", 1, b"e0-1"), Append("resp_a", 4, b"e2-4")]
        )
        await store.apply([Append("resp_a", 3, b"late"), Append("resp_a", 4, b"again")])
        await store.apply([Append("resp_a", 9, b"e5-9")])
        assert await store.read_log("resp_a") == [(1, b"e0-1"), (4, b"e2-4"), (9, b"e5-9")]
        assert await store.read_log("resp_a", 1) == [(4, b"e2-4"), (9, b"e5-9")]
        assert await store.read_log("resp_a", 3) == [(4, b"e2-4"), (9, b"e5-9")]
        assert await store.read_log("resp_a", 9) == []
        await store.aclose()

    run(scenario())


def test_create_replaces_an_entry_whole(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener()
        await store.apply([create("resp_a", aliases=("msg_1",)), Append("resp_a", 0, b"x")])
        await store.apply([create("resp_a", scope="bob", doc=b"second")])
        assert await store.get("alice", "resp_a") is None
        assert await store.resolve("alice", "msg_1") is None
        assert await store.read_log("resp_a") == []
        stats = await store.stats()
        assert stats.entries == 1
        assert stats.bytes == len(b"second")
        await store.aclose()

    run(scenario())


def test_delete_removes_entry_log_and_aliases(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener()
        await store.apply(
            [create("resp_a", aliases=("msg_1", "fc_2")), Append("resp_a", 0, b"events")]
        )
        assert await store.resolve("alice", "fc_2") == "resp_a"
        assert await store.resolve("bob", "fc_2") is None
        await store.apply([Update("resp_a", b"{}", aliases=("rs_3",))])
        assert await store.resolve("alice", "rs_3") == "resp_a"
        assert await store.resolve("alice", "msg_1") == "resp_a"
        assert await store.resolve("bob", "rs_3") is None
        await store.apply([Delete("resp_a")])
        assert await store.get("alice", "resp_a") is None
        assert await store.read_log("resp_a") == []
        assert await store.resolve("alice", "fc_2") is None
        assert await store.resolve("alice", "rs_3") is None
        assert await store.stats() == type(await store.stats())(0, 0)
        await store.apply([Delete("resp_a")])  # deleting twice is fine
        await store.aclose()

    run(scenario())


def test_expired_entries_are_gone_and_swept(opener: Opener) -> None:
    # Real time: Redis expires keys by its own clock.
    async def scenario() -> None:
        store = await opener()
        now = time.time()
        await store.apply(
            [
                create("resp_old", created=now - 10, expires=now + 0.3, aliases=("msg_old",)),
                create("resp_new", created=now, expires=now + HOUR),
            ]
        )
        assert await store.get("alice", "resp_old") is not None
        await asyncio.sleep(0.4)
        assert await store.get("alice", "resp_old") is None
        assert await store.resolve("alice", "msg_old") is None
        assert await store.sweep(time.time()) == 1
        stats = await store.stats()
        assert stats.entries == 1
        assert await store.get("alice", "resp_new") is not None
        await store.aclose()

    run(scenario())


def test_size_bound_evicts_oldest_first(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener(max_bytes=1000)
        base = time.time()
        for n in range(3):
            evicted = await store.apply([create(f"resp_{n}", doc=b"x" * 300, created=base + n)])
            assert evicted == 0
        evicted = await store.apply([Append("resp_2", 0, b"y" * 300)])
        assert evicted == 1  # 1200 bytes: the oldest goes
        assert await store.get("alice", "resp_0") is None
        assert await store.get("alice", "resp_1") is not None
        evicted = await store.apply([create("resp_3", doc=b"z" * 900, created=base + 3)])
        assert evicted == 2
        stats = await store.stats()
        assert stats.bytes <= 1000
        assert stats.entries == 1
        assert await store.get("alice", "resp_3") is not None
        await store.aclose()

    run(scenario())


def test_second_handle_shares_entries_and_follows_the_log_live(opener: Opener) -> None:
    async def scenario() -> None:
        writer, reader = await opener(), await opener()
        await writer.apply([create("resp_a")])
        assert await reader.get("alice", "resp_a") is not None
        assert await reader.wait_log("resp_a", -1, 0.05) == []  # nothing yet: times out

        async def later() -> None:
            await asyncio.sleep(0.1)
            await writer.apply([Append("resp_a", 2, b"first")])

        task = asyncio.create_task(later())
        started = time.monotonic()
        assert await reader.wait_log("resp_a", -1, 5.0) == [(2, b"first")]
        assert time.monotonic() - started < 2.0
        await task
        await writer.apply([Append("resp_a", 5, b"second")])
        assert await reader.wait_log("resp_a", 2, 5.0) == [(5, b"second")]
        await closing(writer, reader)

    run(scenario())


def test_signals_reach_a_listener_on_another_handle_once(opener: Opener) -> None:
    async def scenario() -> None:
        runner, canceller = await opener(), await opener()
        await runner.apply([create("resp_a"), create("resp_b")])
        assert await runner.next_signals(0.05) == []  # starts listening
        await canceller.apply([Signal("resp_a", CANCEL)])
        await canceller.apply([Signal("resp_a", CANCEL), Signal("resp_gone", CANCEL)])
        got: list[tuple[str, str]] = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            got += await runner.next_signals(1.0)
        got += await runner.next_signals(0.2)
        assert got == [("resp_a", CANCEL)]
        a = await runner.get("alice", "resp_a")
        b = await runner.get("alice", "resp_b")
        assert a is not None
        assert b is not None
        assert a.signals == frozenset({CANCEL})
        assert b.signals == frozenset()
        await closing(runner, canceller)

    run(scenario())


def test_local_signal_reaches_the_local_listener(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener()
        await store.apply([create("resp_a")])
        await store.next_signals(0.01)
        await store.apply([Signal("resp_a", CANCEL)])
        assert await store.next_signals(1.0) == [("resp_a", CANCEL)]
        await store.aclose()

    run(scenario())


def test_entries_survive_closing_and_reopening(opener: Opener) -> None:
    async def scenario() -> None:
        store = await opener()
        await store.apply([create("resp_a", doc=b"kept"), Append("resp_a", 3, b"log")])
        await store.aclose()
        again = await opener()
        entry = await again.get("alice", "resp_a")
        assert entry is not None
        assert entry.doc == b"kept"
        assert await again.read_log("resp_a") == [(3, b"log")]
        await again.aclose()

    run(scenario())


# -- failures: one exception, StoreError ----------------------------------------------------------


def test_unreachable_redis_raises_store_error() -> None:
    async def scenario() -> None:
        store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout=2.0)
        with pytest.raises(StoreError, match="redis store"):
            await store.ping()
        with pytest.raises(StoreError):
            await store.apply([create("resp_a")])
        with pytest.raises(StoreError):
            await store.get("alice", "resp_a")
        await store.aclose()

    run(scenario())


def test_unwritable_data_directory_raises_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")

    async def scenario() -> None:
        with pytest.raises(StoreError, match="embedded store"):
            await SqliteStore(blocker / "sub" / "store.sqlite3").open()

    run(scenario())


def test_open_store_picks_the_backend_from_the_url(tmp_path: Path, redis_url: str) -> None:
    async def scenario() -> None:
        embedded = await open_store("embedded", data_dir=tmp_path / "data", max_bytes=0)
        assert embedded is not None
        assert embedded.kind == "sqlite"
        assert (tmp_path / "data" / "store.sqlite3").exists()
        await embedded.aclose()
        assert await open_store("off", data_dir=tmp_path, max_bytes=0) is None
        memory = await open_store("memory://", data_dir=tmp_path, max_bytes=0)
        assert memory is not None
        assert memory.kind == "memory"
        remote = await open_store(redis_url + "?prefix=x:", data_dir=tmp_path, max_bytes=0)
        assert remote is not None
        assert remote.kind == "redis"
        await remote.ping()
        await remote.apply([create("resp_p")])
        assert await remote.get("alice", "resp_p") is not None
        await remote.aclose()

    run(scenario())
