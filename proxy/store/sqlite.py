"""The embedded store: SQLite in WAL mode in the data directory (the default `store_url`).

No server to run. It survives restarts (WAL with `synchronous=NORMAL`: a committed write
survives a crash of the process; only a power cut can lose the last commits), and every proxy
process on the host that opens the same file shares it — the worker processes of
`workers` included: a resume or a cancel may reach any of them.

All SQLite work runs on one thread per process, with one connection (sqlite3 releases the GIL
while it works), so the event loop never waits on the disk. Writes of one `apply` are one
`BEGIN IMMEDIATE` transaction; other processes wait up to `busy_timeout` for the lock.

Wake-ups: an append in this process wakes this process's `wait_log` waiters at once. Another
process's commits are seen by a poller that runs only while someone here waits: every
`poll_interval` it reads `PRAGMA data_version` (which changes when another connection
committed; no disk read) and, when it changed, wakes the waiters and reads the `signals` table
for signals raised elsewhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from proxy.store.base import (
    Entry,
    Op,
    Stats,
    Store,
    StoreError,
)
from proxy.store.sqlite_writes import SCHEMA, Applied, apply_ops, sweep_expired
from proxy.store.waiters import Waiters

_T = TypeVar("_T")


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether `exc` is lock contention (SQLITE_BUSY / SQLITE_LOCKED and their extended codes)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class SqliteStore(Store):
    """The embedded backend (module docstring). `open()` before use."""

    kind = "sqlite"

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = 0,
        clock: Callable[[], float] = time.time,
        poll_interval: float = 0.02,
        busy_timeout: float = 5.0,
    ) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._clock = clock
        self._poll_interval = poll_interval
        self._busy_timeout = busy_timeout
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store")
        self._db: sqlite3.Connection | None = None
        self._waiters = Waiters()
        self._poller: asyncio.Task[None] | None = None
        self._data_version = -1
        self._signal_seq: int | None = None  # None: nobody listens for signals yet
        self._own_signals: set[int] = set()
        self._signals: list[tuple[str, str]] = []
        self._signalled = asyncio.Event()
        self._closed = False

    # -- plumbing -------------------------------------------------------------------------------

    async def open(self) -> SqliteStore:
        await self._run(self._open)
        return self

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Switching a file to WAL can fail at once with SQLITE_BUSY, without waiting on the busy
        # handler, while another process opens or closes the same file (workers starting
        # together); that contention lasts microseconds, so the open is retried until the
        # busy timeout.
        deadline = time.monotonic() + self._busy_timeout
        delay = 0.002
        while True:
            try:
                self._db = self._connect()
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(
            self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=True
        )
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            # One transaction: processes starting together create the schema once.
            db.executescript(f"BEGIN IMMEDIATE; {SCHEMA} COMMIT;")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            db.close()
            raise
        return db

    async def _run(self, work: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise StoreError("the store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, partial(work, *args))
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"embedded store ({self.path}): {exc}") from exc

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError("the store is not open")
        return self._db

    # -- writes ---------------------------------------------------------------------------------

    async def apply(self, ops: Sequence[Op]) -> int:
        applied = await self._run(self._apply, list(ops))
        for key in applied.woken:
            self._waiters.wake(key)
        if applied.signals and self._signal_seq is not None:
            self._signals.extend(applied.signals)
            self._signalled.set()
        return applied.evicted

    def _apply(self, ops: list[Op]) -> Applied:
        applied = apply_ops(self._conn, ops, self._max_bytes)
        self._own_signals.update(applied.signal_rows)
        return applied

    # -- reads ----------------------------------------------------------------------------------

    async def get_many(self, scope: str, keys: Sequence[str]) -> list[Entry | None]:
        if not keys:
            return []
        return await self._run(self._get_many, scope, list(keys))

    def _get_many(self, scope: str, keys: list[str]) -> list[Entry | None]:
        found: dict[str, Entry] = {}
        now = self._clock()
        for start in range(0, len(keys), 500):  # SQLite's bound-parameter limit
            chunk = keys[start : start + 500]
            rows = self._conn.execute(
                "SELECT key, scope, doc, created, expires, lease, signals FROM entries"
                f" WHERE key IN ({','.join('?' * len(chunk))}) AND scope = ? AND expires > ?",
                (*chunk, scope, now),
            ).fetchall()
            for key, owner, doc, created, expires, lease, signals in rows:
                found[key] = Entry(
                    key,
                    owner,
                    bytes(doc),
                    created,
                    expires,
                    lease,
                    frozenset(signals.split(",")) if signals else frozenset(),
                )
        return [found.get(key) for key in keys]

    async def read_log(self, key: str, after: int = -1) -> list[tuple[int, bytes]]:
        return await self._run(self._read_log, key, after)

    def _read_log(self, key: str, after: int) -> list[tuple[int, bytes]]:
        rows = self._conn.execute(
            "SELECT mark, data FROM log WHERE key = ? AND mark > ? ORDER BY mark", (key, after)
        ).fetchall()
        return [(int(mark), bytes(data)) for mark, data in rows]

    async def wait_log(self, key: str, after: int, timeout: float) -> list[tuple[int, bytes]]:
        return await self._waiters.wait_for(
            key, lambda: self.read_log(key, after), timeout, watch=self._ensure_poller
        )

    async def resolve(self, scope: str, alias: str) -> str | None:
        return await self._run(self._resolve, scope, alias)

    def _resolve(self, scope: str, alias: str) -> str | None:
        row = self._conn.execute(
            "SELECT a.key FROM aliases a JOIN entries e ON e.key = a.key"
            " WHERE a.scope = ? AND a.alias = ? AND e.expires > ?",
            (scope, alias, self._clock()),
        ).fetchone()
        return None if row is None else str(row[0])

    # -- signals and the poller -----------------------------------------------------------------

    async def next_signals(self, timeout: float) -> list[tuple[str, str]]:
        if self._signal_seq is None:
            self._signal_seq = await self._run(self._max_signal)
        self._ensure_poller()
        if not self._signals:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._signalled.wait()
        signals, self._signals = self._signals, []
        self._signalled.clear()
        return signals

    def _max_signal(self) -> int:
        (seq,) = self._conn.execute("SELECT coalesce(max(seq), 0) FROM signals").fetchone()
        return int(seq)

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        """Watch for other processes' commits while anyone here waits (module docstring)."""
        while not self._closed and (len(self._waiters) or self._signal_seq is not None):
            await asyncio.sleep(self._poll_interval)
            try:
                changed, signals = await self._run(self._changes)
            except StoreError:
                continue  # the waits time out and their callers see the error on next read
            if changed:
                self._waiters.wake_all()
            if signals:
                self._signals.extend(signals)
                self._signalled.set()

    def _changes(self) -> tuple[bool, list[tuple[str, str]]]:
        db = self._conn
        (version,) = db.execute("PRAGMA data_version").fetchone()
        if version == self._data_version:
            return False, []
        self._data_version = version
        if self._signal_seq is None:
            return True, []
        rows = db.execute(
            "SELECT seq, key, name FROM signals WHERE seq > ? ORDER BY seq", (self._signal_seq,)
        ).fetchall()
        signals = []
        for seq, key, name in rows:
            self._signal_seq = max(self._signal_seq, int(seq))
            if seq in self._own_signals:
                self._own_signals.discard(seq)
            else:
                signals.append((str(key), str(name)))
        return True, signals

    # -- housekeeping ---------------------------------------------------------------------------

    async def sweep(self, now: float) -> int:
        gone = await self._run(self._sweep, now)
        for key in gone:
            self._waiters.wake(key)
        return len(gone)

    def _sweep(self, now: float) -> set[str]:
        return sweep_expired(self._conn, now)

    async def stats(self) -> Stats:
        return await self._run(self._stats)

    def _stats(self) -> Stats:
        db = self._conn
        (count,) = db.execute("SELECT count(*) FROM entries").fetchone()
        (size,) = db.execute("SELECT value FROM totals WHERE name = 'bytes'").fetchone()
        return Stats(int(count), int(size))

    async def ping(self) -> None:
        await self._run(lambda: self._conn.execute("SELECT 1").fetchone())

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._waiters.wake_all()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        loop = asyncio.get_running_loop()
        if self._db is not None:
            db, self._db = self._db, None
            await loop.run_in_executor(self._executor, db.close)
        self._executor.shutdown(wait=False)
