"""`memory://`: the store in this process's memory. For unit tests only: nothing survives the
process and nothing is shared with another one (README: never for `serve`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from proxy.store.base import (
    Append,
    Create,
    Delete,
    Entry,
    Lease,
    Op,
    Push,
    Remove,
    Signal,
    Stats,
    Store,
    Update,
    entry_size,
)
from proxy.store.waiters import Waiters


@dataclass
class _Held:
    entry: Entry
    aliases: tuple[str, ...]
    log: list[tuple[int, bytes]] = field(default_factory=list)
    size: int = 0


class MemoryStore(Store):
    """Entries in a dict, in creation order (eviction is oldest first)."""

    kind = "memory"

    def __init__(self, *, max_bytes: int = 0, clock: Callable[[], float] = time.time) -> None:
        self._max_bytes = max_bytes
        self._clock = clock
        self._held: dict[str, _Held] = {}
        self._aliases: dict[tuple[str, str], str] = {}
        self._bytes = 0
        self._waiters = Waiters()
        self._signals: list[tuple[str, str]] | None = None  # None: nobody listens yet
        self._signalled = asyncio.Event()

    async def apply(self, ops: Sequence[Op]) -> int:
        for op in ops:
            self._apply(op)
        return self._evict()

    def _apply(self, op: Op) -> None:
        if isinstance(op, Create):
            self._drop(op.key)
            held = _Held(
                Entry(op.key, op.scope, op.doc, op.created, op.expires, op.lease), op.aliases
            )
            held.size = entry_size(op.doc, op.aliases)
            self._held[op.key] = held
            self._bytes += held.size
            for alias in op.aliases:
                self._aliases[(op.scope, alias)] = op.key
            self._waiters.wake(op.key)
            return
        held_or_none = self._held.get(op.key)
        if held_or_none is None:
            return
        held = held_or_none
        if isinstance(op, Update):
            grow = len(op.doc) - len(held.entry.doc) + entry_size(b"", op.aliases)
            lease = held.entry.lease if op.lease is None else op.lease
            held.entry = replace(held.entry, doc=op.doc, lease=lease)
            held.aliases += op.aliases
            for alias in op.aliases:
                self._aliases[(held.entry.scope, alias)] = op.key
            held.size += grow
            self._bytes += grow
            self._waiters.wake(op.key)
        elif isinstance(op, Append):
            if held.log and op.mark <= held.log[-1][0]:
                return
            held.log.append((op.mark, op.data))
            self._grow(held, len(op.data))
        elif isinstance(op, Push):
            top = held.log[-1][0] if held.log else -1
            held.log += [(top + 1 + index, data) for index, data in enumerate(op.data)]
            self._grow(held, sum(len(data) for data in op.data))
        elif isinstance(op, Remove):
            for index, (mark, data) in enumerate(held.log):
                if mark == op.mark:
                    del held.log[index]
                    self._grow(held, -len(data))
                    break
        elif isinstance(op, Signal):
            if op.name in held.entry.signals:
                return
            held.entry = replace(held.entry, signals=held.entry.signals | {op.name})
            if self._signals is not None:
                self._signals.append((op.key, op.name))
                self._signalled.set()
        elif isinstance(op, Lease):
            held.entry = replace(held.entry, lease=op.until)
        elif isinstance(op, Delete):
            self._drop(op.key)

    def _grow(self, held: _Held, size: int) -> None:
        """The log of `held` changed by `size` bytes."""
        held.size += size
        self._bytes += size
        self._waiters.wake(held.entry.key)

    def _drop(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is None:
            return
        self._bytes -= held.size
        for alias in held.aliases:
            if self._aliases.get((held.entry.scope, alias)) == key:
                del self._aliases[(held.entry.scope, alias)]
        self._waiters.wake(key)

    def _evict(self) -> int:
        evicted = 0
        while self._max_bytes and self._bytes > self._max_bytes and self._held:
            oldest = min(self._held.values(), key=lambda held: held.entry.created)
            self._drop(oldest.entry.key)
            evicted += 1
        return evicted

    def _live(self, key: str) -> _Held | None:
        held = self._held.get(key)
        if held is None or held.entry.expires <= self._clock():
            return None
        return held

    async def get_many(self, scope: str, keys: Sequence[str]) -> list[Entry | None]:
        found: list[Entry | None] = []
        for key in keys:
            held = self._live(key)
            found.append(held.entry if held is not None and held.entry.scope == scope else None)
        return found

    async def read_log(self, key: str, after: int = -1) -> list[tuple[int, bytes]]:
        held = self._live(key)
        if held is None:
            return []
        return [(mark, data) for mark, data in held.log if mark > after]

    async def wait_log(self, key: str, after: int, timeout: float) -> list[tuple[int, bytes]]:
        return await self._waiters.wait_for(key, lambda: self.read_log(key, after), timeout)

    async def resolve(self, scope: str, alias: str) -> str | None:
        key = self._aliases.get((scope, alias))
        return key if key is not None and self._live(key) is not None else None

    async def next_signals(self, timeout: float) -> list[tuple[str, str]]:
        if self._signals is None:
            self._signals = []
        if not self._signals:
            try:
                async with asyncio.timeout(timeout):
                    await self._signalled.wait()
            except TimeoutError:
                return []
        signals, self._signals = self._signals, []
        self._signalled.clear()
        return signals

    async def sweep(self, now: float) -> int:
        gone = [key for key, held in self._held.items() if held.entry.expires <= now]
        for key in gone:
            self._drop(key)
        return len(gone)

    async def stats(self) -> Stats:
        return Stats(len(self._held), self._bytes)

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        self._waiters.wake_all()
