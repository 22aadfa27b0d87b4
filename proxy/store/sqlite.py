"""The embedded store: SQLite in WAL mode in the data directory (the default `store_url`).

No server to run. It survives restarts (WAL with `synchronous=NORMAL`: a committed write
survives a crash of the process; only a power cut can lose the last commits), and every proxy
process on the host that opens the same file shares it — the worker processes of issue 17
included: a resume or a cancel may reach any of them.

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
    Append,
    Create,
    Entry,
    Lease,
    Op,
    Signal,
    Stats,
    Store,
    StoreError,
    Update,
    entry_size,
)
from proxy.store.waiters import Waiters

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    doc BLOB NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL,
    lease REAL NOT NULL DEFAULT 0,
    signals TEXT NOT NULL DEFAULT '',
    aliases TEXT NOT NULL DEFAULT '',
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_created ON entries (created);
CREATE INDEX IF NOT EXISTS entries_expires ON entries (expires);
CREATE TABLE IF NOT EXISTS log (
    key TEXT NOT NULL,
    mark INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (key, mark)
);
CREATE TABLE IF NOT EXISTS aliases (
    scope TEXT NOT NULL,
    alias TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (scope, alias)
);
CREATE TABLE IF NOT EXISTS signals (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    name TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS totals (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO totals VALUES ('bytes', 0);
"""
_ALIAS_SEP = "\n"  # ids never hold a newline
#: Signal rows kept for pollers of other processes (each signal is wanted for seconds).
_SIGNALS_KEPT = 10_000


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
        db = sqlite3.connect(
            self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=True
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        try:
            # One transaction: processes starting together create the schema once.
            db.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} COMMIT;")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            db.close()
            raise
        self._db = db

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
        evicted, woken, signals = await self._run(self._apply, list(ops))
        for key in woken:
            self._waiters.wake(key)
        if signals and self._signal_seq is not None:
            self._signals.extend(signals)
            self._signalled.set()
        return evicted

    def _apply(self, ops: list[Op]) -> tuple[int, set[str], list[tuple[str, str]]]:
        db = self._conn
        woken: set[str] = set()
        signals: list[tuple[str, str]] = []
        db.execute("BEGIN IMMEDIATE")
        try:
            grown = 0
            for op in ops:
                grown += self._one(db, op, woken, signals)
            if grown:
                db.execute("UPDATE totals SET value = value + ? WHERE name = 'bytes'", (grown,))
            evicted = self._evict(db, woken)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return evicted, woken, signals

    def _one(
        self, db: sqlite3.Connection, op: Op, woken: set[str], signals: list[tuple[str, str]]
    ) -> int:
        """Apply one write; returns how many bytes it added (negative: freed)."""
        if isinstance(op, Create):
            freed = self._delete(db, op.key)
            size = entry_size(op.doc, op.aliases)
            db.execute(
                "INSERT INTO entries (key, scope, doc, created, expires, lease, aliases, size)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    op.key,
                    op.scope,
                    op.doc,
                    op.created,
                    op.expires,
                    op.lease,
                    _ALIAS_SEP.join(op.aliases),
                    size,
                ),
            )
            db.executemany(
                "INSERT OR REPLACE INTO aliases VALUES (?, ?, ?)",
                [(op.scope, alias, op.key) for alias in op.aliases],
            )
            woken.add(op.key)
            return size - freed
        if isinstance(op, Update):
            row = db.execute(
                "SELECT length(doc), scope, aliases FROM entries WHERE key = ?", (op.key,)
            ).fetchone()
            if row is None:
                return 0
            old_size, scope, aliases = row
            grow = len(op.doc) - int(old_size) + entry_size(b"", op.aliases)
            if op.aliases:
                aliases = _ALIAS_SEP.join(filter(None, [aliases, *op.aliases]))
                db.executemany(
                    "INSERT OR REPLACE INTO aliases VALUES (?, ?, ?)",
                    [(scope, alias, op.key) for alias in op.aliases],
                )
            db.execute(
                "UPDATE entries SET doc = ?, size = size + ?, lease = coalesce(?, lease),"
                " aliases = ? WHERE key = ?",
                (op.doc, grow, op.lease, aliases, op.key),
            )
            woken.add(op.key)
            return grow
        if isinstance(op, Append):
            cursor = db.execute(
                "INSERT OR IGNORE INTO log (key, mark, data) SELECT ?, ?, ?"
                " WHERE EXISTS (SELECT 1 FROM entries WHERE key = ?)"
                " AND ? > coalesce((SELECT max(mark) FROM log WHERE key = ?), -1)",
                (op.key, op.mark, op.data, op.key, op.mark, op.key),
            )
            if not cursor.rowcount:
                return 0
            # The entry's row is not touched (its size counts the document only): one page
            # less written to the WAL per append. `_delete` adds the log's bytes back.
            woken.add(op.key)
            return len(op.data)
        if isinstance(op, Signal):
            row = db.execute("SELECT signals FROM entries WHERE key = ?", (op.key,)).fetchone()
            raised = set(row[0].split(",")) if row is not None and row[0] else set()
            if row is None or op.name in raised:
                return 0
            db.execute(
                "UPDATE entries SET signals = ? WHERE key = ?",
                (",".join(sorted(raised | {op.name})), op.key),
            )
            cursor = db.execute("INSERT INTO signals (key, name) VALUES (?, ?)", (op.key, op.name))
            if cursor.lastrowid is not None:
                self._own_signals.add(cursor.lastrowid)
            signals.append((op.key, op.name))
            return 0
        if isinstance(op, Lease):
            db.execute("UPDATE entries SET lease = ? WHERE key = ?", (op.until, op.key))
            return 0
        freed = self._delete(db, op.key)
        if freed:
            woken.add(op.key)
        return -freed

    @staticmethod
    def _delete(db: sqlite3.Connection, key: str) -> int:
        row = db.execute(
            "SELECT scope, aliases, size FROM entries WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return 0
        scope, aliases, size = row
        (logged,) = db.execute(
            "SELECT coalesce(sum(length(data)), 0) FROM log WHERE key = ?", (key,)
        ).fetchone()
        db.execute("DELETE FROM entries WHERE key = ?", (key,))
        db.execute("DELETE FROM log WHERE key = ?", (key,))
        if aliases:
            db.executemany(
                "DELETE FROM aliases WHERE scope = ? AND alias = ? AND key = ?",
                [(scope, alias, key) for alias in aliases.split(_ALIAS_SEP)],
            )
        return int(size) + int(logged)

    def _evict(self, db: sqlite3.Connection, woken: set[str]) -> int:
        if not self._max_bytes:
            return 0
        (total,) = db.execute("SELECT value FROM totals WHERE name = 'bytes'").fetchone()
        evicted = 0
        while total > self._max_bytes:
            oldest = db.execute("SELECT key FROM entries ORDER BY created, key LIMIT 16").fetchall()
            if not oldest:
                break
            for (key,) in oldest:
                if total <= self._max_bytes:
                    break
                freed = self._delete(db, key)
                total -= freed
                evicted += 1
                woken.add(key)
        db.execute("UPDATE totals SET value = ? WHERE name = 'bytes'", (total,))
        return evicted

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
        self._ensure_poller()
        return await self._waiters.wait_for(key, lambda: self.read_log(key, after), timeout)

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
        gone, woken = await self._run(self._sweep, now)
        for key in woken:
            self._waiters.wake(key)
        return gone

    def _sweep(self, now: float) -> tuple[int, set[str]]:
        db = self._conn
        db.execute("BEGIN IMMEDIATE")
        try:
            keys = [
                str(key)
                for (key,) in db.execute("SELECT key FROM entries WHERE expires <= ?", (now,))
            ]
            freed = sum(self._delete(db, key) for key in keys)
            if freed:
                db.execute("UPDATE totals SET value = value - ? WHERE name = 'bytes'", (freed,))
            db.execute(
                "DELETE FROM signals WHERE seq <= (SELECT max(seq) FROM signals) - ?",
                (_SIGNALS_KEPT,),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return len(keys), set(keys)

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
