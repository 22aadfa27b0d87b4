"""Local wake-ups for `wait_log` and `next_signals`: futures by key, woken by writes of this
process (and by the embedded backend's poller for writes of other processes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

_T = TypeVar("_T")


class Waiters:
    """Futures waiting for a change of a key; `wake(key)` / `wake_all()` resolve them."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        return sum(len(futures) for futures in self._by_key.values())

    def wake(self, key: str) -> None:
        for future in self._by_key.pop(key, ()):
            if not future.done():
                future.set_result(None)

    def wake_all(self) -> None:
        for key in list(self._by_key):
            self.wake(key)

    async def wait_for(
        self,
        key: str,
        read: Callable[[], Awaitable[list[_T]]],
        timeout: float,
        watch: Callable[[], None] = lambda: None,
    ) -> list[_T]:
        """`read()` until it returns something, waiting for a wake-up of `key` in between, up to
        `timeout` seconds in all. The waiter is registered *before* each read, so a write
        between the read and the wait is never missed; `watch()` is called after each
        registration (the embedded backend makes sure its poller runs: a wake-up unregisters
        the waiter, so a poller that checks "anyone waiting?" just then ends, and the waiter,
        registered again a moment later, would wait out its timeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            future: asyncio.Future[None] = loop.create_future()
            self._by_key.setdefault(key, set()).add(future)
            watch()
            try:
                found = await read()
                left = deadline - loop.time()
                if found or left <= 0:
                    return found
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await future
            finally:
                futures = self._by_key.get(key)
                if futures is not None:
                    futures.discard(future)
                    if not futures:
                        del self._by_key[key]
