"""Benchmark: aggregate tokens/s and CPU per token with 1 and 2 worker processes,
with the proxy on one core and on both, the load generator measured.

    .venv/bin/python bench/workers.py [--streams 1000] [--concurrency 1000] [--tokens 1000]
                                      [--repeats 3] [--upstreams simulator replay]
                                      [--before DIR] [--setting NAME=VALUE ...]

`--setting store_url=off` (any proxy setting, repeatable) runs every proxy with it: the
embedded response store is one SQLite file that all the workers write.
`--compare store_url=off` adds the same layouts again with that setting, interleaved with
the others (a store-on/store-off pair in one run). `--layouts 1x2 2x2` runs only those
layouts (workers by the cores of the proxy).
`--before DIR` adds the same layouts for the proxy of another checkout (e.g. `git archive main |
tar -x -C DIR`), interleaved with the others: a before/after in one run.

Each row is a fresh `python -m proxy serve --workers N` (production settings, JSON log at info
level), its process tree (supervisor, workers, render workers) pinned to the listed cores; the
benchmark process — upstream and load generator, on uvloop — on the other core, or on both when
the proxy has both. Rows run interleaved, `--repeats` rounds, medians (and the worst run).

Two upstreams, the same answers: `simulator` is the trtllm-serve simulator (2 ms per token,
`stream_interval` 20: 20 tokens per frame), as bench/capacity.py uses it; `replay`
(bench/replay_upstream.py) replays the simulator's recorded answer with its pacing at a small
fraction of its CPU, so that what limits two workers on a 2-core machine is the proxy, not the
generator sharing its cores.

Columns: aggregate tok/s (every stream's tokens / wall time); proxy CPU % (the whole process
tree, from /proc, 100 % = one core) and µs of it per token; generator CPU % (this process:
load generator and upstream) and µs of it per token; machine busy % (both cores, from
/proc/stat, 100 % = both, other engineers' runs included);
proxy PSS (MB; proportional set size of the process tree: shared pages split, so it adds up)
after the warm-up and the most sampled every 0.5 s under load, and idle per worker (the
supervisor's left out); errors (a stream that did not end `response.completed` with the
expected text and token count); metrics (the `/metrics` delta of completed requests and of
tokens equals what the clients got: the sum over the workers is right). Under each table: the
rates the measured per-token costs allow at 2 workers, on 2 cores of the proxy's own and on
these 2 cores shared with the generator (what limits the ratio on a 2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson
import uvloop
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.replay_upstream import ReplayUpstream
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator


@dataclass(frozen=True)
class Layout:
    workers: int
    proxy_cores: tuple[int, ...]
    #: Another checkout's proxy (`--before`).
    root: Path | None = None
    #: Settings of this layout's proxy on top of `--setting` (`--compare`).
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        cores = ",".join(map(str, self.proxy_cores))
        extra = "".join(f", {name}={value}" for name, value in self.extra)
        plural = "s" if self.workers > 1 else ""
        before = "before: " if self.root is not None else ""
        return f"{before}{self.workers} worker{plural}, proxy on core {cores}{extra}"


@dataclass
class Run:
    tokens: int = 0
    completed: int = 0
    errors: int = 0
    wall: float = 0.0
    proxy_cpu: float = 0.0
    generator_cpu: float = 0.0
    machine_busy: float = 0.0
    metrics_ok: bool = False
    error_kinds: Counter[str] = field(default_factory=Counter)
    #: PSS (MB) of the proxy's process tree after the warm-up, and the most seen under load.
    idle_mb: float = 0.0
    peak_mb: float = 0.0
    #: Idle PSS (MB) of the process `serve` started (with workers: the supervisor).
    root_mb: float = 0.0
    #: CPU seconds under load by role (`Process.cpu_by_role`: loop or other threads of each
    #: kind of process).
    roles: dict[str, float] = field(default_factory=dict)
    #: Per completed stream, seconds: request written → head read; → last read; and the gap
    #: between its last two reads (the terminal event waits for the store's commit).
    heads: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    tails: list[float] = field(default_factory=list)


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


async def scrape(port: int) -> dict[str, float]:
    """Completed requests and tokens in one scrape of `/metrics`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    raw = await reader.read()
    writer.close()
    text = raw.split(b"\r\n\r\n", 1)[1].decode()
    found = {"completed": 0.0, "tokens": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "proxy_requests_total" and sample.labels["outcome"] == "completed":
                found["completed"] += sample.value
            elif sample.name == "proxy_tokens_total":
                found["tokens"] += sample.value
    return found


async def settled(port: int) -> dict[str, float]:
    """A scrape once the warm-up's last requests are counted (each is counted just after its
    terminal event): two scrapes 50 ms apart that agree."""
    last = await scrape(port)
    for _ in range(40):
        await asyncio.sleep(0.05)
        now = await scrape(port)
        if now == last:
            return now
        last = now
    return last


async def metrics_add_up(port: int, before: dict[str, float], run: Run) -> bool:
    """The `/metrics` deltas of completed requests and tokens equal what the clients got (the
    tokens of streams that did not complete are counted too: then at least what they got).

    A stream's request is counted just after its terminal event is written (repair.py
    `_finish`), so the last clients can see their terminal event a moment before their worker
    counts it: scrape again for up to 5 s (the deltas only grow) before calling it wrong."""
    deadline = time.monotonic() + 5
    while True:
        after = await scrape(port)
        got = (after["completed"] - before["completed"], after["tokens"] - before["tokens"])
        if got == (run.completed, run.tokens) or (
            run.errors and got[0] == run.completed and got[1] >= run.tokens
        ):
            return True
        if time.monotonic() > deadline:
            print(f"metrics: {got} counted, clients got {(run.completed, run.tokens)}")
            return False
        await asyncio.sleep(0.05)


async def ready_everywhere(port: int, count: int) -> None:
    """/readyz on `count` new connections in a row answers 200: every worker is up."""
    streak = 0
    deadline = time.monotonic() + 60
    while streak < count and time.monotonic() < deadline:
        try:
            status = await harness._get_status(port, "/readyz")
        except OSError:
            status = 0
        streak = streak + 1 if status == 200 else 0
        if status != 200:
            await asyncio.sleep(0.1)


def _pin(cores: tuple[int, ...]) -> None:
    if set(cores) <= set(harness.cores()):
        os.sched_setaffinity(0, set(cores))


async def one_run(upstream: str, layout: Layout, args: argparse.Namespace) -> Run:
    all_cores = tuple(harness.cores())
    alone = len(layout.proxy_cores) == 1 and len(all_cores) > 1
    generator_cores = tuple(c for c in all_cores if c not in layout.proxy_cores) if alone else ()
    _pin(generator_cores or all_cores)
    core = layout.proxy_cores[0] if alone else None
    settings = dict(args.setting) | dict(layout.extra)
    proxy = await harness.start_proxy(
        upstream,
        core=core,
        root=layout.root or harness.ROOT,
        workers=str(layout.workers),
        **settings,
    )
    body = orjson.dumps({"model": harness.MODEL, "input": "Where is my order?", "stream": True})
    payload = harness.request_bytes("/v1/responses", body, {"x-sim-tokens": str(args.tokens)})
    run = Run()
    try:
        await ready_everywhere(proxy.port, 8 * layout.workers)
        for _ in range(4 * layout.workers):  # warm-up: imports, pools, caches, in every worker
            await harness.stream(proxy.port, payload, keep_reads=False)
        reference = await harness.stream(proxy.port, payload, keep_reads=False)
        expected = _outcome(reference)
        before = await settled(proxy.port)
        semaphore = asyncio.Semaphore(args.concurrency)

        async def client() -> None:
            async with semaphore:
                answer = await harness.stream(proxy.port, payload, keep_reads=False)
            got = _outcome(answer)
            if got is None or got != expected:
                run.errors += 1
                run.error_kinds[_error_kind(answer, got)] += 1
                return
            run.completed += 1
            run.tokens += got[0]
            run.heads.append(answer.head_at - answer.sent_at)
            run.ends.append(answer.reads[-1][0] - answer.sent_at)
            if len(answer.reads) > 1:
                run.tails.append(answer.reads[-1][0] - answer.reads[-2][0])

        idle = proxy.tree_pss_kb()
        run.idle_mb = run.peak_mb = sum(idle.values()) / 1024
        run.root_mb = idle.get(proxy.pid, 0) / 1024

        async def sample_memory() -> None:
            while True:
                await asyncio.sleep(0.5)
                run.peak_mb = max(run.peak_mb, sum(proxy.tree_pss_kb().values()) / 1024)

        sampler = asyncio.ensure_future(sample_memory())
        cpu0, gen0 = proxy.cpu_seconds(), harness.self_cpu_seconds()
        roles0 = proxy.cpu_by_role()
        busy0, total0 = machine_ticks()
        wall0 = time.monotonic()
        await asyncio.gather(*(client() for _ in range(args.streams)))
        run.wall = time.monotonic() - wall0
        sampler.cancel()
        run.proxy_cpu = proxy.cpu_seconds() - cpu0
        roles1 = proxy.cpu_by_role()
        run.roles = {k: v - roles0.get(k, 0.0) for k, v in roles1.items()}
        run.generator_cpu = harness.self_cpu_seconds() - gen0
        busy1, total1 = machine_ticks()
        run.machine_busy = (busy1 - busy0) / max(1, total1 - total0)
        run.metrics_ok = await metrics_add_up(proxy.port, before, run)
    finally:
        proxy.stop()
    return run


def _error_kind(answer: harness.Answer, got: tuple[int, bytes] | None) -> str:
    """What went wrong with one stream, for the line under the table."""
    if got is not None:
        return "wrong answer"
    if answer.error:
        return answer.error
    if answer.status != 200:
        return f"HTTP {answer.status}"
    terminal = answer.terminal()
    if terminal is None:
        return "no terminal event"
    error = (terminal["response"].get("error") or {}).get("code")
    return f"{terminal['type']} {error or ''}".strip()


def _outcome(answer: harness.Answer) -> tuple[int, bytes] | None:
    """(output tokens, the output items' text) of a completed stream, else None."""
    terminal = answer.terminal() if answer.status == 200 else None
    if terminal is None or terminal["type"] != "response.completed":
        return None
    response = terminal["response"]
    text = b"|".join(
        part.get("text", "").encode()
        for item in response["output"]
        for part in item.get("content", [])
    )
    return int(response["usage"]["output_tokens"]), text


def per_worker_mb(layout: Layout, run: Run) -> float:
    """Idle PSS per worker process with its render worker (the supervisor left out)."""
    if layout.workers == 1:
        return run.idle_mb
    return (run.idle_mb - run.root_mb) / layout.workers


def proxy_per_token(run: Run) -> float:
    return run.proxy_cpu / max(run.tokens, 1) * 1e6


def generator_per_token(run: Run) -> float:
    """CPU µs of this process (load generator and upstream) per token it received."""
    return run.generator_cpu / max(run.tokens, 1) * 1e6


def ceilings(runs: dict[Layout, list[Run]], baseline: float) -> str:
    """What the measured costs allow: (1) the proxy's two workers on two cores of their own
    (the generator elsewhere): 2 cores / proxy µs per token; (2) everything on these 2 cores:
    2 cores / (proxy + generator µs per token). As a ratio to the 1-worker, 1-core row."""
    med = harness.median
    two = [layout for layout in runs if layout.workers == 2 and len(layout.proxy_cores) == 2]
    if not two or not baseline:
        return ""
    measured = runs[two[0]]
    proxy = med([proxy_per_token(r) for r in measured])
    generator = med([generator_per_token(r) for r in measured])
    alone, shared = 2e6 / proxy, 2e6 / (proxy + generator)
    return (
        f"at 2 workers' costs ({proxy:.1f} µs proxy + {generator:.1f} µs generator per token): "
        f"2 cores of the proxy's own carry {alone:,.0f} tok/s ({alone / baseline:.2f}× the "
        f"1-worker, 1-core row); these 2 cores, shared with the generator, "
        f"{shared:,.0f} tok/s ({shared / baseline:.2f}×)"
    )


def timeline_rows(runs: dict[Layout, list[Run]]) -> str:
    """Where a stream's time went, p50 / max over every stream of every round."""
    rows = []
    for layout, found in runs.items():
        cells = [f"timeline, {layout.name}"]
        for name in ("heads", "ends", "tails"):
            values = [v for r in found for v in getattr(r, name)]
            cells.append(f"{harness.median(values):.3f} / {max(values, default=0.0):.3f}")
        cells.append(f"{harness.median([r.wall for r in found]):.2f}")
        rows.append(cells)
    headers = ["s, p50 / max", "to head", "to the end", "last gap", "wall (median run)"]
    return harness.table(headers, rows)


def role_rows(runs: dict[Layout, list[Run]]) -> str:
    """µs of CPU per token and context switches per 1,000 tokens by role (the whole tree's,
    summed over its processes), medians."""
    names = sorted({name for found in runs.values() for r in found for name in r.roles})
    rows = []
    for layout, found in runs.items():
        cells = [f"CPU by role, {layout.name}"]
        for name in names:
            # µs of CPU per token; context switches per 1,000 tokens
            scale = 1e3 if name.endswith("switches") else 1e6
            per_token = [r.roles.get(name, 0.0) / max(r.tokens, 1) * scale for r in found]
            cells.append(f"{harness.median(per_token):.2f}")
        rows.append(cells)
    return harness.table(["µs CPU per token; switches per 1k tokens", *names], rows)


def _baseline(layout: Layout, runs: dict[Layout, list[Run]]) -> float:
    """The median tok/s of the first layout with the same settings (the `vs` column)."""
    first = next(o for o in runs if o.root == layout.root and o.extra == layout.extra)
    return harness.median([r.tokens / r.wall for r in runs[first]])


def _row(layout: Layout, runs: list[Run], baseline: float) -> list[str]:
    med = harness.median
    rate = [r.tokens / r.wall for r in runs]
    per_token = [proxy_per_token(r) for r in runs]
    return [
        layout.name,
        str(runs[0].completed + runs[0].errors),
        f"{med(rate):,.0f} / {min(rate):,.0f}",
        f"{med(rate) / baseline:.2f}×" if baseline else "-",
        f"{med([r.proxy_cpu / r.wall * 100 for r in runs]):.0f}",
        f"{med(per_token):.1f} / {max(per_token):.1f}",
        f"{med([r.generator_cpu / r.wall * 100 for r in runs]):.0f}",
        f"{med([generator_per_token(r) for r in runs]):.1f}",
        f"{med([r.machine_busy * 100 for r in runs]):.0f}",
        f"{med([r.idle_mb for r in runs]):.0f} / {med([r.peak_mb for r in runs]):.0f}",
        f"{med([per_worker_mb(layout, r) for r in runs]):.0f}",
        str(sum(r.errors for r in runs)),
        "ok" if all(r.metrics_ok for r in runs) else "WRONG",
    ]


async def run_all(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    harness.raise_fd_limit()
    config = SimulatorConfig(
        token_seconds=0.002, first_token_seconds=0.02, stream_interval=20, record_limit=100
    )
    sim = await start_simulator(config, encoding, app=create_simulator_app(config, encoding))
    replay = await ReplayUpstream("127.0.0.1", sim.port).start()
    upstreams = {"simulator": sim.url, "replay": replay.url}
    two = tuple(harness.cores()[:2])
    every = {"1x1": Layout(1, two[:1]), "2x1": Layout(2, two[:1])}
    every |= {"1x2": Layout(1, two), "2x2": Layout(2, two)}
    layouts = [every[name] for name in args.layouts]
    if args.compare is not None:  # the same layouts again, with one more setting
        name, value = args.compare
        layouts += [replace(layout, extra=((name, value),)) for layout in layouts]
    if args.before is not None:  # the same layouts for the other checkout, interleaved
        layouts += [replace(layout, root=args.before.resolve()) for layout in layouts]
    print(f"# bench/workers.py — {harness.machine()}")
    print(
        f"# {args.streams} streams of ~{args.tokens} tokens, {args.concurrency} at a time; "
        "2 ms/token, stream_interval 20 (20 tokens per frame); "
        f"{args.repeats} rounds, layouts interleaved; median / worst"
    )
    if args.setting:
        print("# proxy settings: " + ", ".join(f"{k}={v}" for k, v in args.setting))
    try:
        for name in args.upstreams:
            runs: dict[Layout, list[Run]] = {layout: [] for layout in layouts}
            for _ in range(args.repeats):
                for layout in layouts:
                    runs[layout].append(await one_run(upstreams[name], layout, args))
            first = layouts[0]
            baseline = harness.median([r.tokens / r.wall for r in runs[first]])
            print()
            print(f"## upstream: {name}")
            print(
                harness.table(
                    [
                        "layout",
                        "streams",
                        "aggregate tok/s",
                        "vs the first layout (same settings)",
                        "proxy CPU %",
                        "proxy µs / token",
                        "generator CPU %",
                        "generator µs / token",
                        "machine busy %",
                        "proxy PSS MB idle / peak",
                        "idle MB per worker",
                        "errors",
                        "metrics",
                    ],
                    [_row(layout, runs[layout], _baseline(layout, runs)) for layout in layouts],
                )
            )
            print(ceilings(runs, baseline))
            print()
            print(role_rows(runs))
            print()
            print(timeline_rows(runs))
            for layout in layouts:
                kinds = sum((r.error_kinds for r in runs[layout]), Counter[str]())
                if kinds:
                    print(f"errors of {layout.name}: {dict(kinds)}")
    finally:
        _pin(tuple(harness.cores()))
        await replay.close()
        await sim.stop()
    if len(harness.cores()) < 2:
        print("note: fewer than 2 cores: the one-core and two-core layouts are the same")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--upstreams", nargs="*", choices=["simulator", "replay"], default=["simulator", "replay"]
    )
    parser.add_argument("--before", type=Path, help="a checkout whose proxy is the 'before' row")
    parser.add_argument(
        "--compare",
        type=harness.settings_arg,
        metavar="NAME=VALUE",
        help="the layouts again with this setting, interleaved (e.g. store_url=off)",
    )
    parser.add_argument(
        "--layouts",
        nargs="*",
        choices=["1x1", "2x1", "1x2", "2x2"],
        default=["1x1", "2x1", "1x2", "2x2"],
        help="workers x cores of the proxy (default: all four)",
    )
    parser.add_argument(
        "--setting", type=harness.settings_arg, action="append", default=[], metavar="NAME=VALUE"
    )
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run_all(args))


if __name__ == "__main__":
    main()
