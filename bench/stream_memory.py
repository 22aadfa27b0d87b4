"""Memory per open stream: the proxy's whole process tree, with the store on and off.

    .venv/bin/python bench/stream_memory.py [--streams 400] [--tokens 1000] [--repeats 3]
                                            [--before DIR] [--setting NAME=VALUE ...]

Each row is a fresh `python -m proxy serve` (production settings) against the simulator (this
process; 4 ms per token, `stream_interval` 20, so a 1,000-token answer stays open 4 s): warmed
up, its idle PSS read (proportional set size of the process and its render worker: shared pages
split, so it adds up), then `--streams` streams opened at once and the tree's PSS sampled every
0.1 s until they end. Per open stream: (PSS at its most while every stream was open - idle) /
streams, the figure the pod's memory limit must hold per concurrent stream; after: the tree's
PSS once they all ended (what stays). Rows: the default embedded store ("store on"), and
`store_url=off`; with `--before DIR`, both again for another checkout's proxy; interleaved,
`--repeats` rounds, medians (and the most).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout's proxy, measured alike")
    parser.add_argument(
        "--setting", type=harness.settings_arg, action="append", default=[], metavar="NAME=VALUE"
    )
    asyncio.run(run_all(parser.parse_args()))


if __name__ == "__main__":
    main()
