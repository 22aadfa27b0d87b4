"""The response store: one small async interface (`base.py`), backends behind it.

    base.py          the interface: entries (doc, log, aliases, signals, lease), writes as data
    memory.py        `memory://` — unit tests only
    sqlite.py        the embedded default — SQLite in WAL mode in the data directory
    redis_store.py   `redis://…` — replicas behind one Service
    writer.py        batches the writes of every response in flight into one `apply`
    measured.py      metrics around any backend (latency, errors, evictions, size)

`open_store` picks the backend once, from the `store_url` setting; the app's lifespan owns it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from proxy.store.base import (
    CANCEL,
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
    StoreError,
    Update,
)

__all__ = [
    "CANCEL",
    "EMBEDDED",
    "OFF",
    "Append",
    "Create",
    "Delete",
    "Entry",
    "Lease",
    "Op",
    "Push",
    "Remove",
    "Signal",
    "Stats",
    "Store",
    "StoreError",
    "Update",
    "check_store_url",
    "open_store",
]

#: `store_url` values that are not URLs: the default (SQLite in `data_dir`) and no store at all.
EMBEDDED = "embedded"
OFF = "off"
#: The embedded store's file in the data directory.
EMBEDDED_FILE = "store.sqlite3"


def check_store_url(value: str) -> str:
    """Validate a `store_url` setting (config/settings.py); ValueError naming what is accepted."""
    if value in (EMBEDDED, OFF):
        return value
    parts = urlsplit(value)
    if parts.scheme in ("redis", "rediss", "unix") and (parts.netloc or parts.path):
        return value
    if parts.scheme == "sqlite" and parts.path not in ("", "/"):
        return value
    if parts.scheme == "memory":
        return value
    raise ValueError(
        "must be 'embedded' (SQLite in data_dir), 'off', sqlite:///PATH, redis://HOST:PORT/DB "
        "(or rediss://), or memory:// (tests only)"
    )


async def open_store(
    url: str,
    *,
    data_dir: Path,
    max_bytes: int,
    clock: Callable[[], float] = time.time,
) -> Store | None:
    """The backend `url` names, opened (None for `off`). Raises `StoreError` when it cannot be
    opened (an unwritable data directory); a Redis that is down is found on first use."""
    if url == OFF:
        return None
    parts = urlsplit(url)
    if url == EMBEDDED or parts.scheme == "sqlite":
        from proxy.store.sqlite import SqliteStore

        path = data_dir / EMBEDDED_FILE if url == EMBEDDED else Path(parts.path)
        return await SqliteStore(path, max_bytes=max_bytes, clock=clock).open()
    if parts.scheme == "memory":
        from proxy.store.memory import MemoryStore

        return MemoryStore(max_bytes=max_bytes, clock=clock)
    from proxy.store.redis_store import RedisStore

    # `?prefix=` is ours (several proxies on one Redis); the rest of the URL is redis-py's.
    query = parse_qs(parts.query)
    prefix = query.pop("prefix", ["rrp:"])[0]
    url = urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
    return RedisStore(url, max_bytes=max_bytes, prefix=prefix, clock=clock)
