"""Hostile renders: what one client's costly bodies do to everybody else.

    .venv/bin/python bench/hostile_render.py [--chars 1000000] [--streams 8]

Runs the proxy twice as a `python -m proxy serve` process (core 0, with its render workers)
against the simulator (this process, core 1, paced: 10 ms per token, 5 tokens per frame):
*before* with `--render-workers 0` (every render on the event loop, as before render workers) and
*after* with the defaults (a render worker, `render_timeout` 20 s). In each run, `--streams`
clients keep streaming answers (a new request as soon as one ends) and a prober asks `/healthz`
every 50 ms on a new connection (as the kubelet does), first for a quiet baseline, then while one
client sends the worst inputs of the issue one after another: one unbroken run of `--chars`
letters, `--chars`/10 CJK characters, `--chars`/10 small input items; then realistic bodies
(words) of 500 KB (within gpt-oss's context: served) and of `--realistic-mib` (the body limit:
more tokens than the context, so upstream refuses it after the render — but it must render).

Per-frame latency: for every token frame the simulator sends (but the first, whose one token has
no text), the time until the client's first read after it (frames are 50 ms apart, so a stall
shows as the wait of every frame inside it).
Targets: `/healthz` within 100 ms p99 and the streams' per-frame p99 growing < 50 ms while the
hostile client sends, realistic bodies up to the limit rendered.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator

WORDS = "the quick brown fox jumps over the lazy dog; "
TURNS = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


def hostile_bodies(chars: int) -> list[tuple[str, bytes]]:
    model = harness.MODEL
    return [
        (f"run of {chars:,} letters", orjson.dumps({"model": model, "input": "a" * chars})),
        (
            f"{chars // 10:,} CJK chars",
            orjson.dumps({"model": model, "input": "中" * (chars // 10)}),
        ),
        (
            # user and assistant turns: plain user messages alone skip openai-harmony's
            # per-message render (request/prefix.py) and are no longer costly
            f"{chars // 10:,} input items",
            orjson.dumps({"model": model, "input": TURNS * (chars // 20)}),
        ),
    ]


def realistic(size: int) -> bytes:
    text = (WORDS * (size // len(WORDS) + 1))[: size - 100]
    return orjson.dumps({"model": harness.MODEL, "input": text, "stream": True})


class Phase:
    """Probe and stream figures of one phase (quiet or hostile)."""

    def __init__(self) -> None:
        self.health: list[float] = []
        self.health_failed = 0
        self.frames: list[float] = []
        self.errors = 0


async def probe(port: int, phase: Callable[[], Phase], stop: asyncio.Event) -> None:
    while not stop.is_set():
        sent = time.monotonic()
        try:
            async with asyncio.timeout(5):
                status = await harness._get_status(port, "/healthz")
        except (TimeoutError, OSError):
            status = 0
        took = time.monotonic() - sent
        phase().health.append(took)
        if status != 200 or took > 1.0:  # a liveness probe with timeoutSeconds 1 would fail
            phase().health_failed += 1
        await asyncio.sleep(0.05)


async def streamer(
    number: int,
    port: int,
    recorder: harness.SendRecorder,
    phase: Callable[[], Phase],
    stop: asyncio.Event,
    tokens: int,
    switch: list[float],
    hostile: Phase,
) -> None:
    """Stream answers until `stop`; a frame sent after `switch[0]` counts for `hostile`."""
    body = orjson.dumps({"model": harness.MODEL, "input": f"Story {number}", "stream": True})
    count = 0
    while not stop.is_set():
        key = f"s{number}-{count}"
        count += 1
        current = phase()
        answer = await harness.stream(
            port,
            harness.request_bytes(
                "/v1/responses", body, {"x-request-id": key, "x-sim-tokens": str(tokens)}
            ),
        )
        if answer.status != 200 or answer.error:
            current.errors += 1
            continue
        reads = [at for at, _ in answer.reads]
        # The first token frame (one token, `<|channel|>`) has no text: nothing is sent for it.
        frames = [sent for sent, tokens_in in recorder.sends.pop(key, []) if tokens_in][1:]
        for sent in frames:
            cut = bisect.bisect_left(reads, sent)
            if cut < len(reads):
                (hostile if sent >= switch[0] else current).frames.append(reads[cut] - sent)


async def send_one(port: int, payload: bytes) -> tuple[int, str, float]:
    started = time.monotonic()
    answer = await harness.stream(port, harness.request_bytes("/v1/responses", payload))
    took = time.monotonic() - started
    code = ""
    if answer.status >= 400:
        try:
            code = orjson.loads(answer.body)["error"]["code"] or ""
        except (orjson.JSONDecodeError, KeyError, TypeError):
            code = answer.body[:40].decode("utf-8", "replace")
    elif answer.status == 200 and answer.body.startswith(b"{"):
        code = orjson.loads(answer.body).get("status", "?")
    elif answer.status == 200:
        terminal = answer.terminal()
        code = terminal["response"]["status"] if terminal else "no terminal event"
    return answer.status, code, took


async def one_run(args: argparse.Namespace, label: str, **settings: str) -> dict[str, Any]:
    encoding = harness.encoding()
    config = SimulatorConfig(
        token_seconds=0.01, first_token_seconds=0.02, stream_interval=5, record_limit=100_000
    )
    recorder = harness.SendRecorder(create_simulator_app(config, encoding))
    sim = await start_simulator(config, encoding, app=recorder)  # type: ignore[arg-type]
    proxy = await harness.start_proxy(sim.url, **settings)
    quiet, hostile = Phase(), Phase()
    current = [Phase()]  # warm-up: connections, caches, the render worker's first render
    switch = [float("inf")]  # when the hostile client starts
    stop = asyncio.Event()
    results: dict[str, Any] = {"quiet": quiet, "hostile": hostile, "answers": []}
    try:
        tasks = [asyncio.ensure_future(probe(proxy.port, lambda: current[0], stop))]
        tasks += [
            asyncio.ensure_future(
                streamer(
                    n, proxy.port, recorder, lambda: current[0], stop, args.tokens, switch, hostile
                )
            )
            for n in range(args.streams)
        ]
        await asyncio.sleep(1.0)
        current[0] = quiet
        await asyncio.sleep(args.quiet)
        current[0] = hostile
        switch[0] = time.monotonic()
        bodies = hostile_bodies(args.chars)
        bodies += [("realistic 500 KB", realistic(500_000))]
        bodies += [
            (f"realistic {args.realistic_mib:g} MiB", realistic(int(args.realistic_mib * 2**20)))
        ]
        for name, payload in bodies:
            status, code, took = await send_one(proxy.port, payload)
            results["answers"].append((name, status, code, took))
            print(f"  {label}: {name}: {status} {code} in {took:.1f} s", file=sys.stderr)
        stop.set()
        await asyncio.gather(*tasks)
        results["rss_mb"] = proxy.rss_kb() / 1024
    finally:
        proxy.stop()
        await sim.stop()
    return results


def ms(value: float) -> str:
    return f"{value * 1000:.1f}"


async def run(args: argparse.Namespace) -> None:
    harness.pin_self(harness.BENCH_CORE)
    harness.raise_fd_limit()
    before = await one_run(args, "before", render_workers="0")
    after = await one_run(args, "after")
    rows: list[list[Any]] = []
    for name, pick in (
        ("/healthz p50 ms, quiet", lambda r: ms(harness.median(r["quiet"].health))),
        ("/healthz p99 ms, hostile", lambda r: ms(harness.pct(r["hostile"].health, 0.99))),
        ("/healthz max ms, hostile", lambda r: ms(max(r["hostile"].health, default=0))),
        ("/healthz probes failed (>1 s)", lambda r: r["hostile"].health_failed),
        ("frame p50 ms, quiet", lambda r: ms(harness.median(r["quiet"].frames))),
        ("frame p99 ms, quiet", lambda r: ms(harness.pct(r["quiet"].frames, 0.99))),
        ("frame p99 ms, hostile", lambda r: ms(harness.pct(r["hostile"].frames, 0.99))),
        (
            "frame p99 growth ms",
            lambda r: ms(
                harness.pct(r["hostile"].frames, 0.99) - harness.pct(r["quiet"].frames, 0.99)
            ),
        ),
        ("frame max ms, hostile", lambda r: ms(max(r["hostile"].frames, default=0))),
        (
            "frames timed (quiet / hostile)",
            lambda r: f"{len(r['quiet'].frames)} / {len(r['hostile'].frames)}",
        ),
        ("stream errors", lambda r: r["quiet"].errors + r["hostile"].errors),
    ):
        rows.append([name, pick(before), pick(after)])
    for index, (name, *_rest) in enumerate(before["answers"]):
        cells = []
        for result in (before, after):
            _, status, code, took = result["answers"][index]
            cells.append(f"{status} {code} ({took:.1f} s)")
        rows.append([name, *cells])
    print(harness.machine())
    print(
        f"{args.streams} streams of {args.tokens} tokens, paced 10 ms/token, 5 tokens/frame; "
        f"quiet phase {args.quiet:g} s"
    )
    print(harness.table(["", "before (inline)", "after (render worker)"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chars", type=int, default=1_000_000)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--quiet", type=float, default=5.0)
    parser.add_argument("--realistic-mib", type=float, default=15.9)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
