"""The embedded store alone at 1 and 2 processes: what the SQLite file costs each worker.

    .venv/bin/python bench/store_workers.py [--streams 300] [--frames 50] [--pace-ms 40]
                                            [--repeats 3] [--before DIR]

Each row starts 1 or 2 child processes (the workers of `serve --workers N`); each runs one event
loop with the store the proxy uses (`SqliteStore` behind a `StoreWriter`, one file shared by
all) and writes what a stored stream writes through the proxy's `Recorder`: a `Create` (a 2 KB
record), one `Append` per upstream frame (20 delta events of a 1,000-token answer, JSON-encoded
in `take()` as the recorder does), and at the end an `Update` (a 12 KB terminal record) that
the stream waits for (`flush`, read-your-writes). `--streams` streams in all, split between the
processes, all at once; a frame every `--pace-ms` (2 ms per token, 20 tokens per frame).
Nothing else runs in the children: their CPU is the store's (SQL on its thread, the encoding,
the writer task), per 1,000 tokens of the streams they carry.

Columns: wall time; store CPU per 1k tokens summed over the processes, and vs the 1-process row
(the figure that must not grow with workers); `BEGIN IMMEDIATE` waits (the file's one write
lock: the time the other process held it), summed over the processes; SQL time (the store
thread's `apply_ops`, p50 / p99 per transaction); transactions; the stream ends' flush waits
p50 / p99. `--before DIR`: the same rows with the store of another checkout (`proxy/store`
imported from DIR), interleaved, for a before/after in one run. `--pace-ms 0`: no pacing, every
stream writes its frames as fast as the store takes them (aggregate tokens/s is then the figure).
`--no-store`: rows with the writer and the encoding but no SQLite (what SQLite's thread adds);
the loop lag column is how late a 5 ms timer fires on the children's loops (p99 / max).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKENS_PER_FRAME = 20
#: The proxy writes a frame's tokens as one delta per item they touch (~500 bytes per frame:
#: BENCHMARKS.md measured 35 KB stored per 1,000-token response).
EVENTS_PER_FRAME = 2


# -- the child: one worker's store traffic -------------------------------------------------------


def _child(args: argparse.Namespace) -> None:
    """Run in a child process: the store of `args.root`, `args.streams` streams."""
    sys.path.insert(0, str(args.root))
    import orjson

    from proxy.store import Append, Create, Update
    from proxy.store import sqlite_writes as writes
    from proxy.store.sqlite import SqliteStore
    from proxy.store.writer import StoreWriter

    sql: list[float] = []
    waits: list[float] = []
    apply_ops = writes.apply_ops

    def timed_apply(db: Any, ops: Any, max_bytes: int) -> Any:
        # The lock wait is the `BEGIN IMMEDIATE` itself: time it apart from the SQL after it.
        execute = db.execute
        began = time.perf_counter()
        result = apply_ops(_BeginTimer(db, waits), ops, max_bytes)
        sql.append(time.perf_counter() - began)
        del execute
        return result

    import proxy.store.sqlite as sqlite_module

    sqlite_module.apply_ops = timed_apply  # type: ignore[attr-defined]

    delta = {
        "type": "response.output_text.delta",
        "item_id": "msg_" + "a" * 48,
        "output_index": 1,
        "content_index": 0,
        "delta": " word" * (TOKENS_PER_FRAME // EVENTS_PER_FRAME),
        "logprobs": [],
    }
    record = orjson.dumps({"response": {"id": "x", "instructions": "i" * 1500}, "input": []})
    final = orjson.dumps({"response": {"id": "x", "output": ["t" * 7000]}, "input": []})

    class Stream:
        def __init__(self, key: str) -> None:
            self.key = key
            self.created = False
            self.pending: list[dict[str, Any]] = []
            self.done = False
            self.seq = 0

        def take(self) -> list[Any]:
            ops: list[Any] = []
            now = time.time()
            if not self.created:
                self.created = True
                ops.append(
                    Create(self.key, "s", record, now, now + 3600, aliases=("a" + self.key,))
                )
            if self.pending:
                events, self.pending = self.pending, []
                ops.append(Append(self.key, events[-1]["sequence_number"], orjson.dumps(events)))
            if self.done:
                ops.append(Update(self.key, final, lease=0.0, aliases=("o" + self.key,)))
            return ops

    async def main() -> dict[str, Any]:
        store: Any = await SqliteStore(Path(args.file)).open() if args.mode == "sqlite" else None
        writer = StoreWriter(store or _NoStore(), lambda error, count, dropped: None)
        writer.start()
        flushes: list[float] = []
        pace = args.pace_ms / 1000

        async def one(number: int) -> None:
            stream = Stream(f"resp_{os.getpid()}_{number}")
            for _ in range(args.frames):
                if pace:
                    await asyncio.sleep(pace)
                for _ in range(EVENTS_PER_FRAME):
                    stream.seq += 1
                    stream.pending.append({**delta, "sequence_number": stream.seq})
                writer.schedule(stream)
                if not pace:
                    await asyncio.sleep(0)
            stream.done = True
            began = time.perf_counter()
            await writer.flush(stream)
            flushes.append(time.perf_counter() - began)

        # the parent starts every child's streams at the same moment
        await asyncio.sleep(max(0.0, args.start_at - time.time()))
        lags: list[float] = []

        async def ticker() -> None:
            # how late the loop runs a 5 ms timer: the loop held up (by the store thread's
            # share of the GIL, or the writer's work on the loop)
            while True:
                began = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append(time.perf_counter() - began - 0.005)

        tick = asyncio.ensure_future(ticker())
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        wall0 = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(args.streams)))
        wall = time.perf_counter() - wall0
        tick.cancel()
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        await writer.aclose()
        if store is not None:
            await store.aclose()
        cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
        return {
            "wall": wall,
            "cpu": cpu,
            "tokens": args.streams * args.frames * TOKENS_PER_FRAME,
            "sql": sql,
            "waits": waits,
            "flushes": flushes,
            "lags": lags,
        }

    print(json.dumps(asyncio.run(main())))


class _NoStore:
    """A store that keeps nothing: the writer and the recorder's encoding without SQLite."""

    async def apply(self, ops: Any) -> int:
        return 0


class _BeginTimer:
    """A connection whose `BEGIN IMMEDIATE` is timed (the wait for the file's write lock)."""

    def __init__(self, db: Any, waits: list[float]) -> None:
        self._db = db
        self._waits = waits

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "BEGIN IMMEDIATE":
            began = time.perf_counter()
            result = self._db.execute(sql, *args)
            self._waits.append(time.perf_counter() - began)
            return result
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


# -- the parent ----------------------------------------------------------------------------------


def one_row(root: Path, processes: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-store-"))
    file = folder / "store.sqlite3"
    start_at = time.time() + 1.5  # time for the children to import and open the file
    children = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                *("--root", str(root), "--file", str(file), "--start-at", str(start_at)),
                *("--streams", str(args.streams // processes), "--frames", str(args.frames)),
                *("--pace-ms", str(args.pace_ms), "--mode", mode),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    results = []
    for child in children:
        out, _ = child.communicate(timeout=600)
        if child.returncode:
            raise RuntimeError(f"a child exited with {child.returncode}")
        results.append(json.loads(out))
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    merged: dict[str, Any] = {
        "wall": max(r["wall"] for r in results),
        "cpu": sum(r["cpu"] for r in results),
        "tokens": sum(r["tokens"] for r in results),
    }
    for key in ("sql", "waits", "flushes", "lags"):
        merged[key] = [v for r in results for v in r[key]]
    return merged


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _median(values: list[float]) -> float:
    return _pct(values, 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--pace-ms", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout whose store to measure alongside")
    parser.add_argument(
        "--no-store",
        action="store_true",
        help="rows without SQLite too: the writer and the encoding alone (what the store adds)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="sqlite", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    sys.path.insert(0, str(ROOT))
    from bench import harness

    roots = [("", ROOT, "sqlite")]
    if args.before:
        roots.append(("before, ", args.before.resolve(), "sqlite"))
    if args.no_store:
        roots.append(("no store, ", ROOT, "none"))
    rows = [(label, root, mode, n) for label, root, mode in roots for n in (1, 2)]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {(r[0], r[3]): [] for r in rows}
    busy0 = _machine_ticks()
    for repeat in range(args.repeats):
        shift = repeat % len(rows)
        for label, root, mode, processes in rows[shift:] + rows[:shift]:
            runs[(label, processes)].append(one_row(root, processes, mode, args))
    busy1 = _machine_ticks()
    print(f"# bench/store_workers.py — {harness.machine()}")
    print(
        f"# {args.streams} streams of {args.frames} frames × {TOKENS_PER_FRAME} tokens, all at "
        f"once, a frame every {args.pace_ms:g} ms; {args.repeats} rounds, rows interleaved; "
        f"medians; machine busy {100 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]):.0f} %"
    )
    table = []
    for label, _, _, processes in rows:
        found = runs[(label, processes)]
        cpu = [1000 * r["cpu"] / r["tokens"] for r in found]
        base = _median([1000 * r["cpu"] / r["tokens"] for r in runs[(label, 1)]])
        rate = [r["tokens"] / r["wall"] for r in found]
        base_rate = _median([r["tokens"] / r["wall"] for r in runs[(label, 1)]])
        sql = [v for r in found for v in r["sql"]]
        flushes = [v for r in found for v in r["flushes"]]
        lags = [v for r in found for v in r["lags"]]
        table.append(
            [
                f"{label}{processes} process{'es' if processes > 1 else ''}",
                f"{_median([r['wall'] for r in found]):.2f}",
                f"{_median(rate):,.0f}",
                f"{_median(rate) / base_rate:.2f}×",
                f"{_median(cpu) * 1000:.2f}",
                f"{_median(cpu) / base:.2f}×",
                f"{_median([sum(r['waits']) for r in found]):.3f}",
                f"{_median(sql) * 1000:.2f} / {_pct(sql, 0.99) * 1000:.1f}",
                f"{_median([len(r['sql']) for r in found]):.0f}",
                f"{_median(flushes) * 1000:.1f} / {_pct(flushes, 0.99) * 1000:.1f}",
                f"{_pct(lags, 0.99) * 1000:.2f} / {max(lags, default=0.0) * 1000:.1f}",
            ]
        )
    print(
        harness.table(
            [
                "store",
                "wall s",
                "tok/s",
                "vs 1 process",
                "store CPU µs / token",
                "vs 1 process",
                "lock waits s",
                "SQL ms p50 / p99",
                "transactions",
                "end flush ms p50 / p99",
                "loop lag ms p99 / max",
            ],
            table,
        )
    )


def _machine_ticks() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


if __name__ == "__main__":
    main()
