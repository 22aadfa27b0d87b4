"""Memory per open stream: the proxy's whole process tree, with the store on and off.

    .venv/bin/python bench/stream_memory.py [--streams 400] [--tokens 1000] [--repeats 3]
                                            [--before DIR] [--setting NAME=VALUE ...]
    .venv/bin/python bench/stream_memory.py --trace [--streams 400] [--top 25]

Each row is a fresh `python -m proxy serve` (production settings) against the simulator (this
process; 4 ms per token, `stream_interval` 20, so a 1,000-token answer stays open 4 s): warmed
up, its idle PSS read (proportional set size of the process and its render worker: shared pages
split, so it adds up), then `--streams` streams opened at once and the tree's PSS sampled every
0.1 s until they end. Per open stream: (PSS at its most while every stream was open - idle) /
streams, the figure the pod's memory limit must hold per concurrent stream; after: the tree's
PSS once they all ended (what stays). Rows: the default embedded store ("store on"), and
`store_url=off`; with `--before DIR`, both again for another checkout's proxy; interleaved,
`--repeats` rounds, medians (and the most).

With `--trace`, what holds it, by file:line: the proxy (this checkout, store on then off) runs
under `tracemalloc` (`--serve`: `python -m proxy` with a thread that writes a snapshot when
asked), snapshots are taken idle, with every stream open (when the first ends), and after
they ended, and the lines whose traced bytes grew the most between idle and all open are printed
per open stream, with the traced totals (now and at their peak: the start burst) beside the
process's PSS. tracemalloc sees Python's allocations only, not C libraries' own (SQLite's page
cache, llhttp); the PSS beside it shows the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator


@dataclass
class Run:
    idle_kb: int = 0
    open_kb: int = 0
    after_kb: int = 0
    streams: int = 0
    errors: int = 0

    @property
    def per_stream_kb(self) -> float:
        return (self.open_kb - self.idle_kb) / max(1, self.streams)


async def one_run(url: str, root: Path, settings: dict[str, str], args: argparse.Namespace) -> Run:
    proxy = await harness.start_proxy(url, core=None, root=root, **settings)
    body = orjson.dumps({"model": harness.MODEL, "input": "Where is my order?", "stream": True})
    payload = harness.request_bytes("/v1/responses", body, {"x-sim-tokens": str(args.tokens)})
    warm = harness.request_bytes("/v1/responses", body, {"x-sim-tokens": "60"})
    run = Run(streams=args.streams)
    try:
        for _ in range(4):
            await harness.stream(proxy.port, warm, keep_reads=False)
        await asyncio.sleep(0.5)
        run.idle_kb = sum(proxy.tree_pss_kb().values())
        opened = 0

        def on_head() -> None:
            nonlocal opened
            opened += 1

        async def client() -> None:
            answer = await harness.stream(proxy.port, payload, keep_reads=False, on_head=on_head)
            terminal = answer.terminal()
            if answer.status != 200 or terminal is None or terminal["type"] != "response.completed":
                run.errors += 1

        async def sample() -> None:
            # every stream open: all heads read, none ended yet
            while True:
                await asyncio.sleep(0.1)
                if opened == args.streams and not finished:
                    run.open_kb = max(run.open_kb, sum(proxy.tree_pss_kb().values()))

        finished: list[None] = []
        sampler = asyncio.ensure_future(sample())
        tasks = [asyncio.ensure_future(client()) for _ in range(args.streams)]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finished.append(None)
        await asyncio.gather(*tasks)
        sampler.cancel()
        await asyncio.sleep(0.5)
        run.after_kb = sum(proxy.tree_pss_kb().values())
    finally:
        proxy.stop()
    return run


async def run_all(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    harness.raise_fd_limit()
    config = SimulatorConfig(
        token_seconds=0.004, first_token_seconds=0.02, stream_interval=20, record_limit=100
    )
    sim = await start_simulator(config, encoding, app=create_simulator_app(config, encoding))
    base = dict(args.setting)
    rows: list[tuple[str, Path, dict[str, str]]] = [
        ("store on", harness.ROOT, base),
        ("store off", harness.ROOT, {**base, "store_url": "off"}),
    ]
    if args.before:
        before = args.before.resolve()
        rows += [("before, store on", before, base)]
        rows += [("before, store off", before, {**base, "store_url": "off"})]
    runs: dict[str, list[Run]] = {name: [] for name, _, _ in rows}
    started = time.monotonic()
    try:
        for repeat in range(args.repeats):
            shift = repeat % len(rows)
            for name, root, settings in rows[shift:] + rows[:shift]:
                runs[name].append(await one_run(sim.url, root, settings, args))
    finally:
        await sim.stop()
    med = harness.median
    print(f"# bench/stream_memory.py — {harness.machine()}")
    print(
        f"# {args.streams} streams of ~{args.tokens} tokens open at once (4 ms/token, "
        f"stream_interval 20); {args.repeats} rounds, rows interleaved, medians / most; "
        f"{time.monotonic() - started:.0f} s"
    )
    table = []
    for name, found in runs.items():
        per = [r.per_stream_kb for r in found]
        table.append(
            [
                name,
                str(found[0].streams),
                f"{med([r.idle_kb for r in found]) / 1024:.1f}",
                f"{med([r.open_kb for r in found]) / 1024:.1f}",
                f"{med(per):.1f} / {max(per):.1f}",
                f"{med([r.after_kb for r in found]) / 1024:.1f}",
                str(sum(r.errors for r in found)),
            ]
        )
    print(
        harness.table(
            [
                "proxy",
                "streams",
                "idle PSS MB",
                "PSS MB, all open",
                "KB per open stream",
                "PSS MB after",
                "errors",
            ],
            table,
        )
    )


# -- --trace: what holds it, by file:line ------------------------------------------------------


def _serve_traced(argv: list[str]) -> int:
    """`python -m proxy ARGV` under tracemalloc; writing `NAME` to `BENCH_TRACE_DIR/ask` makes a
    thread write the snapshot `NAME.snap` and `NAME.json` (traced bytes now and at the peak, then
    the peak is reset)."""
    import json
    import threading
    import tracemalloc

    from proxy.cli import main

    folder = Path(os.environ["BENCH_TRACE_DIR"])
    tracemalloc.start(1)

    def answer() -> None:
        ask = folder / "ask"
        while True:
            time.sleep(0.02)
            if not ask.exists():
                continue
            name = ask.read_text().strip()
            now, peak = tracemalloc.get_traced_memory()
            tracemalloc.take_snapshot().dump(str(folder / f"{name}.snap"))
            tracemalloc.reset_peak()
            (folder / f"{name}.json").write_text(json.dumps({"now": now, "peak": peak}))
            ask.unlink()

    threading.Thread(target=answer, daemon=True).start()
    return main(argv)


async def _snapshot(folder: Path, name: str) -> dict[str, int]:
    import json

    (folder / "ask").write_text(name)
    while (folder / "ask").exists():
        await asyncio.sleep(0.05)
    found: dict[str, int] = json.loads((folder / f"{name}.json").read_text())
    return found


async def traced_run(url: str, settings: dict[str, str], args: argparse.Namespace) -> None:
    import tracemalloc

    folder = Path(tempfile.mkdtemp(prefix="bench-trace-"))
    os.environ["BENCH_TRACE_DIR"] = str(folder)
    entry = (str(Path(__file__).resolve()), "--serve")
    proxy = await harness.start_proxy(url, core=None, entry=entry, **settings)
    body = orjson.dumps({"model": harness.MODEL, "input": "Where is my order?", "stream": True})
    payload = harness.request_bytes("/v1/responses", body, {"x-sim-tokens": str(args.tokens)})
    warm = harness.request_bytes("/v1/responses", body, {"x-sim-tokens": "60"})
    totals: dict[str, dict[str, int]] = {}
    pss: dict[str, int] = {}
    opened = 0

    def on_head() -> None:
        nonlocal opened
        opened += 1

    try:
        for _ in range(4):
            await harness.stream(proxy.port, warm, keep_reads=False)
        await asyncio.sleep(0.5)
        totals["idle"] = await _snapshot(folder, "idle")
        pss["idle"] = proxy.tree_pss_kb()[proxy.pid]
        tasks = [
            asyncio.ensure_future(
                harness.stream(proxy.port, payload, keep_reads=False, on_head=on_head)
            )
            for _ in range(args.streams)
        ]
        # when the first stream ends: every stream at its largest (the PSS rows' peak)
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        pss["open"] = proxy.tree_pss_kb()[proxy.pid]
        totals["open"] = await _snapshot(folder, "open")
        if opened < args.streams:
            print(f"only {opened} of {args.streams} streams were open at once")
        answers = await asyncio.gather(*tasks)
        await asyncio.sleep(0.5)
        pss["after"] = proxy.tree_pss_kb()[proxy.pid]
        totals["after"] = await _snapshot(folder, "after")
        errors = sum(1 for a in answers if a.status != 200 or a.terminal() is None)
        idle = tracemalloc.Snapshot.load(str(folder / "idle.snap"))
        opened_snap = tracemalloc.Snapshot.load(str(folder / "open.snap"))
        after = tracemalloc.Snapshot.load(str(folder / "after.snap"))
    finally:
        proxy.stop()
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    name = "store off" if settings.get("store_url") == "off" else "store on"
    streams = args.streams
    print()
    print(f"## {name}: {streams} streams, {errors} errors; main process (KB per open stream)")
    rows = []
    for when in ("idle", "open", "after"):
        rows.append(
            [
                when,
                f"{pss[when] / 1024:.1f}",
                f"{totals[when]['now'] / 2**20:.1f}",
                f"{totals[when]['peak'] / 2**20:.1f}",
            ]
        )
    print(harness.table(["snapshot", "PSS MB", "traced MB", "traced MB at its peak since"], rows))
    per = lambda kb: f"{kb / streams:.2f}"  # noqa: E731
    print(
        f"per open stream: PSS {per(pss['open'] - pss['idle'])} KB, traced "
        f"{per((totals['open']['now'] - totals['idle']['now']) / 1024)} KB (peak "
        f"{per((totals['open']['peak'] - totals['idle']['now']) / 1024)}); after they ended: "
        f"PSS {per(pss['after'] - pss['idle'])}, traced "
        f"{per((totals['after']['now'] - totals['idle']['now']) / 1024)}"
    )
    lines = []
    for stat in opened_snap.compare_to(idle, "lineno")[: args.top]:
        frame = stat.traceback[0]
        where = f"{_short(frame.filename)}:{frame.lineno}"
        lines.append(
            [where, f"{stat.size_diff / 1024 / streams:.2f}", f"{stat.count_diff / streams:.1f}"]
        )
    print(
        harness.table(["file:line, all open − idle", "KB per stream", "blocks per stream"], lines)
    )
    kept = [
        [f"{_short(s.traceback[0].filename)}:{s.traceback[0].lineno}", f"{s.size_diff / 1024:.0f}"]
        for s in after.compare_to(idle, "lineno")[:8]
    ]
    print(harness.table(["file:line, after − idle", "KB in all"], kept))


def _short(filename: str) -> str:
    """`filename` from the package or checkout it is in."""
    for mark in ("/site-packages/", "/lib/python3."):
        if mark in filename:
            rest = filename.split(mark, 1)[1]
            return rest if mark == "/site-packages/" else rest.split("/", 1)[1]
    root = str(harness.ROOT) + "/"
    return filename.removeprefix(root)


async def trace_all(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    harness.raise_fd_limit()
    config = SimulatorConfig(
        token_seconds=0.004, first_token_seconds=0.02, stream_interval=20, record_limit=100
    )
    sim = await start_simulator(config, encoding, app=create_simulator_app(config, encoding))
    base = dict(args.setting)
    print(f"# bench/stream_memory.py --trace — {harness.machine()}")
    print(f"# {args.streams} streams of ~{args.tokens} tokens open at once; tracemalloc, 1 frame")
    try:
        for settings in (base, {**base, "store_url": "off"}):
            await traced_run(sim.url, settings, args)
    finally:
        await sim.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        sys.exit(_serve_traced(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout's proxy, measured alike")
    parser.add_argument(
        "--setting", type=harness.settings_arg, action="append", default=[], metavar="NAME=VALUE"
    )
    parser.add_argument("--trace", action="store_true", help="what holds it, by file:line")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    asyncio.run(trace_all(args) if args.trace else run_all(args))


if __name__ == "__main__":
    main()
