"""A CPU profile of the proxy's event loop under load, with the store on and off.

    .venv/bin/python bench/profile_proxy.py [--streams 300] [--tokens 1000] [--top 25]
                                            [--setting NAME=VALUE ...] [--only on|off]

Run as `profile_proxy.py --serve ARGS…` it is `python -m proxy ARGS…` with `cProfile` on the
main thread (the event loop: where a worker spends ~90 % of its CPU), writing the stats to
`BENCH_PROFILE_FILE` when it exits. Run plainly, it starts that proxy once with the default
embedded store and once with `store_url=off` against the simulator (this process), sends
`--streams` streams of `--tokens` tokens at once to each (after a warm-up), stops it, and prints
for each: the functions with the most own time, and the time spent under the proxy's store code
(the recorder, the writer, the store, the stored events' encoding) as a share of all. cProfile
slows every Python call, so read shares and differences, not absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Where the store's own work is (file name fragments in the profile's function keys).
STORE_CODE = ("proxy/store/", "stateful/recording.py", "harmony/stored.py", "stateful/state.py")


def _serve(argv: list[str]) -> int:
    from proxy.cli import main

    target = os.environ["BENCH_PROFILE_FILE"]
    if os.environ.get("BENCH_PROFILE_MODE") == "gc":
        return _serve_gc(argv, target)
    profile = cProfile.Profile()
    profile.enable()
    try:
        return main(argv)
    finally:
        profile.disable()
        profile.dump_stats(target)


def _serve_gc(argv: list[str], target: str) -> int:
    """The proxy with the cyclic garbage collector's pauses timed (`gc.callbacks`): count,
    seconds and the longest pause per generation, and the objects it tracked at the end."""
    import gc
    import json
    import time

    from proxy.cli import main

    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    began = [0.0]

    def timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - began[0])

    gc.callbacks.append(timer)
    try:
        return main(argv)
    finally:
        gc.callbacks.remove(timer)
        Path(target).write_text(json.dumps({"pauses": pauses, "tracked": len(gc.get_objects())}))


async def _load(settings: dict[str, str], args: argparse.Namespace, stats: Path) -> None:
    from bench import harness
    from proxy.simulator import SimulatorConfig, start_simulator

    encoding = harness.encoding()
    config = SimulatorConfig(token_seconds=0.002, first_token_seconds=0.02, stream_interval=20)
    sim = await start_simulator(config, encoding)
    os.environ["BENCH_PROFILE_FILE"] = str(stats)
    entry = (str(Path(__file__).resolve()), "--serve")
    proxy = await harness.start_proxy(sim.url, entry=entry, **settings)
    body = orjson.dumps({"model": harness.MODEL, "input": "Where is my order?", "stream": True})
    payload = harness.request_bytes("/v1/responses", body, {"x-sim-tokens": str(args.tokens)})
    try:
        for _ in range(4):
            await harness.stream(proxy.port, payload, keep_reads=False)
        answers = await asyncio.gather(
            *(harness.stream(proxy.port, payload, keep_reads=False) for _ in range(args.streams))
        )
        bad = sum(1 for a in answers if a.status != 200 or a.terminal() is None)
        if bad:
            print(f"{bad} streams failed")
    finally:
        proxy.stop()
        await sim.stop()


def _store_share(stats: pstats.Stats) -> tuple[float, float]:
    """(seconds of own time in the store's code, all seconds of own time)."""
    own = total = 0.0
    for (file, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        total += tottime
        if any(fragment in file for fragment in STORE_CODE):
            own += tottime
    return own, total


def _print_gc(name: str, found: dict[str, Any]) -> None:
    from bench import harness

    rows = []
    for generation, pauses in found["pauses"].items():
        rows.append(
            [
                f"{name}, generation {generation}",
                str(len(pauses)),
                f"{sum(pauses):.3f}",
                f"{harness.median(pauses) * 1000:.2f}",
                f"{max(pauses, default=0.0) * 1000:.1f}",
            ]
        )
    print()
    print(f"## {name}: the cyclic GC's pauses ({found['tracked']:,} objects tracked at exit)")
    print(harness.table(["collections", "count", "seconds", "p50 ms", "max ms"], rows))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        sys.exit(_serve(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--only", choices=["on", "off"])
    parser.add_argument("--gc", action="store_true", help="time the GC's pauses, no cProfile")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    from bench import harness

    harness.raise_fd_limit()
    base = dict(harness.settings_arg(text) for text in args.setting)
    print(f"# bench/profile_proxy.py — {harness.machine()}")
    print(f"# {args.streams} streams of ~{args.tokens} tokens at once; cProfile, main thread")
    folder = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    for name, settings in (("store on", base), ("store off", {**base, "store_url": "off"})):
        if args.only and not name.endswith(args.only):
            continue
        target = folder / f"{name.replace(' ', '-')}.pstats"
        if args.gc:
            os.environ["BENCH_PROFILE_MODE"] = "gc"
            asyncio.run(_load(settings, args, target))
            _print_gc(name, json.loads(target.read_text()))
            target.unlink()
            continue
        asyncio.run(_load(settings, args, target))
        stats = pstats.Stats(str(target))
        own, total = _store_share(stats)
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(args.top)
        print()
        print(f"## {name}: the most own time")
        print("\n".join(out.getvalue().splitlines()[6:]))
        print(
            f"{name}: own time in the store's code {own:.3f} s of {total:.3f} s "
            f"({100 * own / max(total, 1e-9):.1f} %)"
        )
        target.unlink()
    folder.rmdir()


if __name__ == "__main__":
    main()
