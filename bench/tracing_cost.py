"""Benchmark: what OpenTelemetry tracing costs — the proxy's CPU per generated token with tracing
off (against another checkout, e.g. main, in the same run) and on at 100 % sampling, exporting
over OTLP/HTTP to a receiver in this process.

    .venv/bin/python bench/tracing_cost.py [--before DIR] [--concurrency 64] [--tokens 1000]
                                           [--streams 256] [--repeats 5]

The runs are those of bench/capacity.py (`one_run`: a fresh `serve` process alone on core 0,
the simulator at 20 tokens per frame and the load generator on core 1), interleaved build by
build, repeat by repeat: `before` (the checkout at DIR, tracing unknown to it), `off` (this
checkout, no endpoint) and `on` (this checkout, `otel_traces_endpoint` at the receiver, every
trace sampled; the SDK's batch processor exporting every 5 s and at exit). The receiver counts
what it is sent and answers 200 at once, as a collector would. Medians, and each build's ratio
to `before` (to `off` without it); target: tracing on costs < 10 % more CPU per token.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.capacity import Run, one_run
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator

#: Tracing on at 100 % sampling may cost at most this much more CPU per token.
TARGET_RATIO = 1.10


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP endpoint that counts requests and bytes and answers 200."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.exports = 0
        self.bytes = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.exports += 1
        self.server.bytes += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def run_all(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    pinned = harness.pin_self(harness.BENCH_CORE)
    harness.raise_fd_limit()
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    config = SimulatorConfig(
        token_seconds=0.002, first_token_seconds=0.02, stream_interval=20, record_limit=100
    )
    sim = await start_simulator(config, encoding, app=create_simulator_app(config, encoding))
    builds: dict[str, tuple[Path, dict[str, str]]] = {}
    if args.before:
        builds["before"] = (Path(args.before), {})
    builds["off"] = (harness.ROOT, {})
    builds["on"] = (harness.ROOT, {"otel_traces_endpoint": receiver.url})
    print(f"# bench/tracing_cost.py — {harness.machine()}")
    print(
        f"# {args.streams} streams of ~{args.tokens} tokens, {args.concurrency} at a time; "
        f"simulator 2 ms/token, 20 tokens per frame; {args.repeats} runs per build, interleaved"
    )
    runs: dict[str, list[Run]] = {build: [] for build in builds}
    try:
        for _ in range(args.repeats):
            for build, (root, settings) in builds.items():
                runs[build].append(
                    await one_run(
                        sim.url, args.concurrency, args.tokens, args.streams, root, settings
                    )
                )
    finally:
        await sim.stop()
        receiver.shutdown()
    base = "before" if "before" in builds else "off"
    base_us = harness.median([r.cpu_per_1k for r in runs[base]]) * 1000
    rows = []
    for build, done in runs.items():
        per_token = [r.cpu_per_1k * 1000 for r in done]
        us = harness.median(per_token)
        rows.append(
            [
                build,
                sum(r.completed for r in done),
                f"{us:.2f}",
                f"{min(per_token):.2f} – {max(per_token):.2f}",
                # CPU is read in clock ticks: a tiny run can measure none at all
                f"{us / base_us:.3f}" if base_us else "n/a",
                f"{harness.median([r.peak_rss_kb for r in done]) / 1024:.1f}",
                sum(r.errors for r in done),
            ]
        )
    print()
    print(f"## CPU per generated token, tracing off and on (ratio to {base})")
    print(
        harness.table(
            ["build", "streams", "µs / token", "range", f"vs {base}", "peak RSS MB", "errors"],
            rows,
        )
    )
    print()
    print(f"OTLP exports received: {receiver.exports} ({receiver.bytes / 1024:.0f} KiB)")
    on = harness.median([r.cpu_per_1k for r in runs["on"]]) * 1000
    off = harness.median([r.cpu_per_1k for r in runs["off"]]) * 1000
    if off and base_us:
        ratio = on / off
        verdict = "met" if ratio < TARGET_RATIO else "MISSED"
        print(
            f"tracing on (100 % sampled) vs off: {ratio:.3f} × CPU per token, "
            f"target < {TARGET_RATIO:.2f}: {verdict}"
        )
        if "before" in builds:
            print(f"tracing off vs before: {off / base_us:.3f} × CPU per token")
    else:
        print("too little CPU measured for a ratio (CPU is read in clock ticks): run longer")
    if not pinned:
        print("note: fewer than 2 cores: processes were not pinned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="another checkout (e.g. main) run alongside")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    asyncio.run(run_all(parser.parse_args()))


if __name__ == "__main__":
    main()
