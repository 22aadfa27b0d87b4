"""Opening the embedded store while other processes open and close the same file.

Worker processes start together and each opens the store; SQLite can answer the switch to WAL
with an immediate "database is locked" (no busy handler) while another connection opens or
closes the file. The open must wait that out, bounded by the busy timeout, and fail at once on
any other error.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from proxy.store import StoreError
from proxy.store.sqlite import SqliteStore

ROUNDS = 40
PROCESSES = 6


def _open_and_close(path: str, results: multiprocessing.Queue[str]) -> None:
    async def scenario() -> None:
        store = SqliteStore(Path(path))
        try:
            await store.open()
            results.put("ok")
        except StoreError as exc:
            results.put(str(exc))
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_processes_opening_one_new_file_together_all_succeed(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    failures: list[str] = []
    for round_ in range(ROUNDS):
        path = str(tmp_path / f"r{round_}" / "store.sqlite3")
        results: multiprocessing.Queue[str] = context.Queue()
        processes = [
            context.Process(target=_open_and_close, args=(path, results)) for _ in range(PROCESSES)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(30)
        failures += [r for r in (results.get(timeout=5) for _ in processes) if r != "ok"]
    assert failures == []


def _locked() -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode = sqlite3.SQLITE_BUSY
    return exc


def test_a_busy_open_is_retried_until_it_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "store.sqlite3")
    connect = store._connect
    attempts: list[float] = []

    def flaky() -> sqlite3.Connection:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise _locked()
        return connect()

    monkeypatch.setattr(store, "_connect", flaky)

    async def scenario() -> None:
        await store.open()
        assert await store.get("alice", "resp_none") is None
        await store.aclose()

    asyncio.run(scenario())
    assert len(attempts) == 3


def test_a_lock_that_outlasts_the_busy_timeout_fails_within_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "store.sqlite3", busy_timeout=0.2)
    attempts: list[float] = []

    def locked() -> sqlite3.Connection:
        attempts.append(time.monotonic())
        raise _locked()

    monkeypatch.setattr(store, "_connect", locked)

    async def scenario() -> None:
        started = time.monotonic()
        with pytest.raises(StoreError, match="database is locked"):
            await store.open()
        assert time.monotonic() - started < 1.0
        await store.aclose()

    asyncio.run(scenario())
    assert len(attempts) > 2


def test_a_file_that_is_not_a_database_fails_at_once(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    path.write_bytes(b"this is not an SQLite database, and never was" * 100)
    store = SqliteStore(path)

    async def scenario() -> None:
        started = time.monotonic()
        with pytest.raises(StoreError, match="not a database"):
            await store.open()
        assert time.monotonic() - started < 1.0
        await store.aclose()

    asyncio.run(scenario())
