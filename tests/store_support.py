"""Store backends for the conformance suite: each test gets a fresh store on every backend, and
a way to open a second handle on the same data — what another proxy process would see."""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from proxy.store import Store
from proxy.store.memory import MemoryStore
from proxy.store.redis_store import RedisStore
from proxy.store.sqlite import SqliteStore

BACKENDS = ("memory", "sqlite", "redis")
_prefixes = itertools.count()

#: Opens a handle on the test's store: `await opener(max_bytes=…, clock=…)`.
Opener = Callable[..., Awaitable[Store]]


def opener_for(backend: str, tmp_path: Path, redis_url: str) -> Opener:
    """Handles on one store: every call opens another (the memory store: the same one)."""
    prefix = f"t{next(_prefixes)}:"
    path = tmp_path / "store.sqlite3"
    shared: list[MemoryStore] = []

    async def open_handle(max_bytes: int = 0, clock: Callable[[], float] = time.time) -> Store:
        if backend == "memory":
            if not shared:
                shared.append(MemoryStore(max_bytes=max_bytes, clock=clock))
            return shared[0]
        if backend == "sqlite":
            return await SqliteStore(
                path, max_bytes=max_bytes, clock=clock, poll_interval=0.01
            ).open()
        return RedisStore(redis_url, max_bytes=max_bytes, prefix=prefix, clock=clock)

    return open_handle
