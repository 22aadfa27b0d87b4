"""The embedded store's writes as SQL on one connection (sqlite.py runs them on its thread).

Each `apply_ops` is one `BEGIN IMMEDIATE` transaction: the writes in order, the byte total
kept in `totals`, then the oldest entries evicted while over the bound. An entry's row counts
its document and aliases; its log's bytes are added up when it is deleted (an append does not
rewrite the entry's row: one page less in the WAL per append, BENCHMARKS.md section 6).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from proxy.store.base import Append, Create, Lease, Op, Push, Remove, Signal, Update, entry_size

SCHEMA = """
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
ALIAS_SEP = "\n"  # ids never hold a newline
#: Signal rows kept for pollers of other processes (each signal is wanted for seconds).
SIGNALS_KEPT = 10_000


@dataclass
class Applied:
    """What one transaction did, for the waiters and signal listeners of this process."""

    evicted: int = 0
    woken: set[str] = field(default_factory=set)
    signals: list[tuple[str, str]] = field(default_factory=list)
    #: `signals` rows this process wrote (its poller skips them: delivered locally already).
    signal_rows: list[int] = field(default_factory=list)


def apply_ops(db: sqlite3.Connection, ops: list[Op], max_bytes: int) -> Applied:
    """Apply `ops` in one transaction (module docstring)."""
    applied = Applied()
    db.execute("BEGIN IMMEDIATE")
    try:
        grown = 0
        for op in ops:
            grown += _one(db, op, applied)
        if grown:
            db.execute("UPDATE totals SET value = value + ? WHERE name = 'bytes'", (grown,))
        applied.evicted = _evict(db, max_bytes, applied)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return applied


def _one(db: sqlite3.Connection, op: Op, applied: Applied) -> int:
    """Apply one write; returns how many bytes it added (negative: freed)."""
    if isinstance(op, Create):
        freed = delete_entry(db, op.key)
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
                ALIAS_SEP.join(op.aliases),
                size,
            ),
        )
        db.executemany(
            "INSERT OR REPLACE INTO aliases VALUES (?, ?, ?)",
            [(op.scope, alias, op.key) for alias in op.aliases],
        )
        applied.woken.add(op.key)
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
            aliases = ALIAS_SEP.join(filter(None, [aliases, *op.aliases]))
            db.executemany(
                "INSERT OR REPLACE INTO aliases VALUES (?, ?, ?)",
                [(scope, alias, op.key) for alias in op.aliases],
            )
        db.execute(
            "UPDATE entries SET doc = ?, size = size + ?, lease = coalesce(?, lease),"
            " aliases = ? WHERE key = ?",
            (op.doc, grow, op.lease, aliases, op.key),
        )
        applied.woken.add(op.key)
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
        applied.woken.add(op.key)
        return len(op.data)
    if isinstance(op, Push):
        return _push(db, op, applied)
    if isinstance(op, Remove):
        row = db.execute(
            "SELECT length(data) FROM log WHERE key = ? AND mark = ?", (op.key, op.mark)
        ).fetchone()
        if row is None:
            return 0
        db.execute("DELETE FROM log WHERE key = ? AND mark = ?", (op.key, op.mark))
        applied.woken.add(op.key)
        return -int(row[0])
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
            applied.signal_rows.append(cursor.lastrowid)
        applied.signals.append((op.key, op.name))
        return 0
    if isinstance(op, Lease):
        db.execute("UPDATE entries SET lease = ? WHERE key = ?", (op.until, op.key))
        return 0
    freed = delete_entry(db, op.key)
    if freed:
        applied.woken.add(op.key)
    return -freed


def _push(db: sqlite3.Connection, op: Push, applied: Applied) -> int:
    """Number `op.data` after the entry's last mark (inside the transaction: no other writer
    can take the same marks) and insert them."""
    if (
        not op.data
        or db.execute("SELECT 1 FROM entries WHERE key = ?", (op.key,)).fetchone() is None
    ):
        return 0
    (top,) = db.execute(
        "SELECT coalesce(max(mark), -1) FROM log WHERE key = ?", (op.key,)
    ).fetchone()
    db.executemany(
        "INSERT INTO log (key, mark, data) VALUES (?, ?, ?)",
        [(op.key, int(top) + 1 + index, data) for index, data in enumerate(op.data)],
    )
    applied.woken.add(op.key)
    return sum(len(data) for data in op.data)


def delete_entry(db: sqlite3.Connection, key: str) -> int:
    """Remove an entry, its log and its aliases; returns the bytes it held."""
    row = db.execute("SELECT scope, aliases, size FROM entries WHERE key = ?", (key,)).fetchone()
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
            [(scope, alias, key) for alias in aliases.split(ALIAS_SEP)],
        )
    return int(size) + int(logged)


def _evict(db: sqlite3.Connection, max_bytes: int, applied: Applied) -> int:
    if not max_bytes:
        return 0
    (total,) = db.execute("SELECT value FROM totals WHERE name = 'bytes'").fetchone()
    evicted = 0
    while total > max_bytes:
        oldest = db.execute("SELECT key FROM entries ORDER BY created, key LIMIT 16").fetchall()
        if not oldest:
            break
        for (key,) in oldest:
            if total <= max_bytes:
                break
            freed = delete_entry(db, key)
            total -= freed
            evicted += 1
            applied.woken.add(key)
    db.execute("UPDATE totals SET value = ? WHERE name = 'bytes'", (total,))
    return evicted


def sweep_expired(db: sqlite3.Connection, now: float) -> set[str]:
    """Delete what expired by `now` (and old `signals` rows); returns the keys that went."""
    db.execute("BEGIN IMMEDIATE")
    try:
        keys = [
            str(key) for (key,) in db.execute("SELECT key FROM entries WHERE expires <= ?", (now,))
        ]
        freed = sum(delete_entry(db, key) for key in keys)
        if freed:
            db.execute("UPDATE totals SET value = value - ? WHERE name = 'bytes'", (freed,))
        db.execute(
            "DELETE FROM signals WHERE seq <= (SELECT max(seq) FROM signals) - ?",
            (SIGNALS_KEPT,),
        )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return set(keys)
