"""Benchmark 3, capacity: the proxy's CPU seconds per 1,000 generated tokens and its resident
memory at 1, 64, 256 and 1,000 concurrent streams, and how its cost grows with response length.

    .venv/bin/python bench/capacity.py [--concurrency 1 64 256 1000] [--tokens 1000]
                                       [--lengths 100 300 1000 3000] [--repeats 3]
                                       [--before DIR] [--setting NAME=VALUE ...]

The proxy (`python -m proxy serve`, production settings: JSON request log at info level) runs
alone on core 0; the simulator (2 ms per token, `stream_interval` 20: 20 tokens per frame) and
the load generator share core 1. Each configuration is run `--repeats` times with a fresh proxy;
the table gives the median (and the worst run after a slash where it matters). A stream counts
only when it ends in `response.completed` with the simulator's token count.

- CPU s / 1k tok: the proxy's user+system CPU (from /proc, with any process it started) per
  1,000 generated tokens; its inverse is what one core sustains ("tok/s per core"); "µs /
  token" is the same figure per generated token.
- peak RSS, per stream: the proxy's resident memory at its peak, and (peak - idle) / the most
  streams open at once.
- generator CPU: the benchmark process's CPU share (simulator + client). Below ~90 %, the
  generator was not what limited the aggregate rate.

Targets: one core sustains ≥ 20,000 tokens/s at 20 tokens per frame, with under 100 KB per open
stream; cost linear in response length; CPU per generated token ≤ 8 µs at 20 tokens
per frame with the recovery accounting on, as the proxy runs by default, printed
against every row. `--before DIR` runs the proxy of another checkout (e.g. `git worktree add DIR
main`) in the same run, interleaved run by run, for a before/after in one table. `--setting
store_url=off` (any proxy setting, repeatable) runs both proxies with it: the response store
(on by default) has its own cost, shown apart this way.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator


@dataclass
class Run:
    concurrency: int
    tokens: int = 0
    completed: int = 0
    errors: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    generator_cpu: float = 0.0
    idle_rss_kb: int = 0
    peak_rss_kb: int = 0
    after_rss_kb: int = 0
    max_open: int = 0
    rss_at_max_open_kb: int = 0
    per_request_tokens: list[int] = field(default_factory=list)

    @property
    def cpu_per_1k(self) -> float:
        return self.cpu / self.tokens * 1000 if self.tokens else float("nan")

    @property
    def kb_per_stream(self) -> float:
        if not self.max_open:
            return float("nan")
        return (self.rss_at_max_open_kb - self.idle_rss_kb) / self.max_open


#: End-to-end CPU per generated token at 20 tokens per frame, accounting on.
TARGET_US_PER_TOKEN = 8.0


async def one_run(
    sim_url: str,
    concurrency: int,
    tokens: int,
    streams: int,
    root: Path = harness.ROOT,
    settings: dict[str, str] | None = None,
) -> Run:
    """`streams` requests of about `tokens` tokens, `concurrency` at a time, fresh proxy."""
    proxy = await harness.start_proxy(sim_url, root=root, **(settings or {}))
    body = orjson.dumps({"model": harness.MODEL, "input": "Where is my order?", "stream": True})
    payload = harness.request_bytes("/v1/responses", body, {"x-sim-tokens": str(tokens)})
    run = Run(concurrency)
    try:
        for _ in range(4):  # warm up: imports, the connection pool, caches
            await harness.stream(proxy.port, payload, keep_reads=False)
        await asyncio.sleep(0.3)
        run.idle_rss_kb = proxy.rss_kb()
        open_now = 0
        semaphore = asyncio.Semaphore(concurrency)

        def opened() -> None:
            nonlocal open_now
            open_now += 1

        async def client() -> None:
            nonlocal open_now
            async with semaphore:
                answer = await harness.stream(proxy.port, payload, keep_reads=False, on_head=opened)
                open_now -= 1
            terminal = answer.terminal() if answer.status == 200 else None
            if terminal is None or terminal["type"] != "response.completed":
                run.errors += 1
                return
            run.completed += 1
            count = terminal["response"]["usage"]["output_tokens"]
            run.tokens += count
            run.per_request_tokens.append(count)

        done = asyncio.Event()

        async def sampler() -> None:
            while not done.is_set():
                rss = proxy.rss_kb()
                run.peak_rss_kb = max(run.peak_rss_kb, rss)
                if open_now >= run.max_open:
                    run.max_open = open_now
                    run.rss_at_max_open_kb = max(run.rss_at_max_open_kb, rss)
                await asyncio.sleep(0.05)

        watcher = asyncio.ensure_future(sampler())
        cpu0, gen0, wall0 = proxy.cpu_seconds(), harness.self_cpu_seconds(), time.monotonic()
        await asyncio.gather(*(client() for _ in range(streams)))
        run.wall = time.monotonic() - wall0
        run.cpu = proxy.cpu_seconds() - cpu0
        run.generator_cpu = harness.self_cpu_seconds() - gen0
        done.set()
        await watcher
        await asyncio.sleep(1.0)
        run.after_rss_kb = proxy.rss_kb()
    finally:
        proxy.stop()
    return run


def _per_second(cpu_per_1k: float) -> str:
    """Tokens per CPU second; a run too short for /proc's clock to tick shows n/a."""
    return f"{1000 / cpu_per_1k:,.0f}" if cpu_per_1k > 0 else "n/a"


def _mb(kb: float) -> str:
    return f"{kb / 1024:.1f}"


async def run_all(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    pinned = harness.pin_self(harness.BENCH_CORE)
    harness.raise_fd_limit()
    config = SimulatorConfig(
        token_seconds=0.002, first_token_seconds=0.02, stream_interval=20, record_limit=100
    )
    sim = await start_simulator(config, encoding, app=create_simulator_app(config, encoding))
    builds = {"now": harness.ROOT} | ({"before": Path(args.before)} if args.before else {})
    settings = dict(args.setting)
    print(f"# bench/capacity.py — {harness.machine()}")
    print(
        "# simulator: 2 ms/token, first token 20 ms, stream_interval 20 (20 tokens per frame); "
        f"{args.repeats} runs per row, fresh proxy each; median / worst"
    )
    if settings:
        print(f"# proxy settings: {', '.join(f'{k}={v}' for k, v in settings.items())}")

    async def runs_of(concurrency: int, tokens: int, streams: int) -> dict[str, list[Run]]:
        """`--repeats` runs per build, interleaved (drift on the machine hits all alike)."""
        runs: dict[str, list[Run]] = {build: [] for build in builds}
        for _ in range(args.repeats):
            for build, root in builds.items():
                runs[build].append(
                    await one_run(sim.url, concurrency, tokens, streams, root, settings)
                )
        return runs

    try:
        rows, verdicts = [], []
        for concurrency in args.concurrency:
            streams = max(concurrency, args.min_streams)
            for build, runs in (await runs_of(concurrency, args.tokens, streams)).items():
                rows.append(_row(runs, build if len(builds) > 1 else None))
                us = harness.median([r.cpu_per_1k for r in runs]) * 1000
                verdict = "met" if us <= TARGET_US_PER_TOKEN else "MISSED"
                verdicts.append(f"{concurrency} streams at once ({build}): {us:.2f} µs ({verdict})")
        if rows:
            print()
            print(f"## cost and memory by concurrency (~{args.tokens} tokens per response)")
            headers = ["streams at once", *(["build"] if len(builds) > 1 else [])]
            print(
                harness.table(
                    [
                        *headers,
                        "streams",
                        "tokens",
                        "wall s",
                        "aggregate tok/s",
                        "proxy CPU %",
                        "CPU s / 1k tok",
                        "µs / token",
                        "tok/s per core",
                        "idle RSS MB",
                        "peak RSS MB",
                        "after RSS MB",
                        "KB per open stream",
                        "generator CPU %",
                        "errors",
                    ],
                    rows,
                )
            )
            print()
            print(f"CPU per generated token, target ≤ {TARGET_US_PER_TOKEN:g} µs:")
            for line in verdicts:
                print(f"  {line}")
        length_rows = []
        fits: dict[str, list[tuple[float, float]]] = {build: [] for build in builds}
        for length in args.lengths:
            by_build = await runs_of(args.length_concurrency, length, args.length_concurrency)
            for build, runs in by_build.items():
                cpu_per_request = harness.median([r.cpu / max(r.completed, 1) for r in runs])
                mean_tokens = harness.median([r.tokens / max(r.completed, 1) for r in runs])
                fits[build].append((mean_tokens, cpu_per_request))
                per_1k = harness.median([r.cpu_per_1k for r in runs])
                length_rows.append(
                    [
                        length,
                        *([build] if len(builds) > 1 else []),
                        f"{mean_tokens:.0f}",
                        f"{cpu_per_request * 1000:.2f}",
                        f"{per_1k:.4f}",
                        f"{per_1k * 1000:.2f}",
                        _per_second(per_1k),
                        sum(r.errors for r in runs),
                    ]
                )
        if length_rows:
            print()
            print(f"## cost by response length ({args.length_concurrency} streams at once)")
            print(
                harness.table(
                    [
                        "X-Sim-Tokens",
                        *(["build"] if len(builds) > 1 else []),
                        "tokens per response",
                        "CPU ms per response",
                        "CPU s / 1k tok",
                        "µs / token",
                        "tok/s per core",
                        "errors",
                    ],
                    length_rows,
                )
            )
            print()
            for build, fit in fits.items():
                fixed, per_token, r2 = _linear(fit)
                label = f" ({build})" if len(builds) > 1 else ""
                print(
                    f"least squares{label}: CPU per response = {fixed * 1000:.2f} ms + "
                    f"{per_token * 1e6:.2f} µs × tokens (R² = {r2:.4f})"
                )
    finally:
        await sim.stop()
    if not pinned:
        print("note: fewer than 2 cores: processes were not pinned")


def _row(runs: list[Run], build: str | None) -> list[str]:
    med = harness.median

    def both(values: list[float], fmt: str, worst: float) -> str:
        return f"{fmt.format(med(values))} / {fmt.format(worst)}"

    cpu_per_1k = [r.cpu_per_1k for r in runs]
    return [
        str(runs[0].concurrency),
        *([build] if build else []),
        str(sum(r.completed for r in runs) // len(runs)),
        str(int(med([r.tokens for r in runs]))),
        f"{med([r.wall for r in runs]):.2f}",
        f"{med([r.tokens / r.wall for r in runs]):,.0f}",
        f"{med([r.cpu / r.wall * 100 for r in runs]):.0f}",
        both(cpu_per_1k, "{:.4f}", max(cpu_per_1k)),
        f"{med(cpu_per_1k) * 1000:.2f}",
        _per_second(med(cpu_per_1k)),
        _mb(med([r.idle_rss_kb for r in runs])),
        _mb(max(r.peak_rss_kb for r in runs)),
        _mb(med([r.after_rss_kb for r in runs])),
        both([r.kb_per_stream for r in runs], "{:.1f}", max(r.kb_per_stream for r in runs)),
        f"{med([r.generator_cpu / r.wall * 100 for r in runs]):.0f}",
        str(sum(r.errors for r in runs)),
    ]


def _linear(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    n = len(points)
    if n < 2:
        return float("nan"), float("nan"), float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for _, y in points)
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in points)
    return intercept, slope, 1 - ss_res / ss_tot if ss_tot else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 64, 256, 1000])
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--min-streams", type=int, default=16, help="streams per run at least")
    parser.add_argument("--lengths", type=int, nargs="*", default=[100, 300, 1000, 3000])
    parser.add_argument("--length-concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", help="another checkout whose proxy to run alongside")
    parser.add_argument(
        "--setting", type=harness.settings_arg, action="append", default=[], metavar="NAME=VALUE"
    )
    asyncio.run(run_all(parser.parse_args()))


if __name__ == "__main__":
    main()
