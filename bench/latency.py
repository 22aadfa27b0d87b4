"""Benchmark 2, added latency: direct from the simulator's /v1/completions, through a plain byte
relay on the same stack (bench/byte_relay.py: on httpx, as the pass-through, and on the lean
client of the repaired streams), and through the proxy's /v1/responses.

    .venv/bin/python bench/latency.py [--repeats 40] [--tokens 300] [--before DIR]
                                      [--setting NAME=VALUE ...]

The simulator is paced like a fast GPU (2 ms per token, `stream_interval` 20, 20 ms to the first
token) and runs in this process on core 1 with the load generator; the relay and the proxy run
as their own processes on core 0, one at a time in use. Requests go round-robin (direct, relay,
relay-lean, proxy), so drift hits all alike; the same prompt ids reach the simulator on every
path.

- time to first event: request written → the first thing the client can act on: the answer's
  head for /v1/completions (the simulator sends it at once), `response.created` for the proxy
  (which it sends as soon as upstream accepted the request). The strict reading; the table also
  gives the first SSE event read (upstream's first token frame, the proxy's response.created),
  where the proxy is ahead: it announces the response before the first token exists.
- per-frame latency: for every read that carries content (a token frame; a delta or the final
  events), the time since the simulator handed the engine output that caused it to its server
  (stamped by an ASGI wrapper; `time.monotonic` is one clock for all processes on Linux).

"Added" is a path's median minus the direct median. Targets (issue 17, restating issue 7's): the
proxy's added time to `response.created` ≤ 1.5 ms p50 and its added per-frame latency ≤ 0.5 ms
p50; both are printed against them. The relays are shown for scale (what any proxy on this
stack adds without doing anything per frame), no longer as a target. `--before DIR` adds a
"proxy-before" path: the proxy of another checkout (e.g. `git worktree add DIR main`), measured
in the same round robin, for a before/after in one run; a change by more than a tenth of the
target counts as a regression (less is run-to-run noise on this machine). `--setting NAME=VALUE`
(repeatable) runs both proxies with a setting, e.g. `store_url=off`.
The first frame carries one token (`<|channel|>`), which has no text: on every path the first
text arrives with the second frame, so "first content" is not a like-for-like comparison; the
per-frame figures are.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import sys
from dataclasses import dataclass, field
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from proxy.harmony.request.prepare import prepare_request
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator

PATHS = ("direct", "relay", "relay-lean", "proxy")
BEFORE = "proxy-before"
#: Issue 17's targets for the proxy, p50, added over direct: to `response.created`, per frame.
TARGET_FIRST_EVENT_MS = 1.5
TARGET_PER_FRAME_MS = 0.5
#: A change by more than this share of a target counts as a regression (less is run-to-run noise).
REGRESSION_SHARE = 0.1


@dataclass
class Samples:
    first_event: list[float] = field(default_factory=list)
    first_sse: list[float] = field(default_factory=list)
    first_content: list[float] = field(default_factory=list)
    per_frame: list[float] = field(default_factory=list)
    errors: int = 0


def _is_proxy(path: str) -> bool:
    return path.startswith("proxy")


def _content_read(path: str, data: bytes) -> bool:
    if _is_proxy(path):
        return b'.delta"' in data or b'.done"' in data or b"response.completed" in data
    return b'"token_ids":[' in data and b'"token_ids":[]' not in data


def analyse(
    path: str, answer: harness.Answer, sends: list[tuple[float, bool]], out: Samples
) -> None:
    if answer.status != 200 or answer.error:
        out.errors += 1
        return
    token_sends = [t for t, tokens in sends if tokens]
    if _is_proxy(path):
        created = next((t for t, d in answer.reads if b"response.created" in d), None)
        if created is None:
            out.errors += 1
            return
        out.first_event.append(max(created, answer.head_at) - answer.sent_at)
        out.first_sse.append(max(created, answer.head_at) - answer.sent_at)
    else:
        out.first_event.append(answer.head_at - answer.sent_at)
        sse = next((t for t, d in answer.reads if b"data: " in d), None)
        if sse is not None:
            out.first_sse.append(sse - answer.sent_at)
    first = True
    for at, data in answer.reads:
        if not _content_read(path, data):
            continue
        index = bisect.bisect_right(token_sends, at) - 1
        if index < 0:
            continue
        if first and (not _is_proxy(path) or b'.delta"' in data):
            out.first_content.append(at - answer.sent_at)
            first = False
        out.per_frame.append(at - token_sends[index])


async def run(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    pinned = harness.pin_self(harness.BENCH_CORE)
    harness.raise_fd_limit()
    config = SimulatorConfig(
        token_seconds=0.002,
        first_token_seconds=0.02,
        stream_interval=20,
        record_limit=100_000,
    )
    recorder = harness.SendRecorder(create_simulator_app(config, encoding))
    sim = await start_simulator(config, encoding, app=recorder)  # type: ignore[arg-type]
    relay = await harness.start_relay(sim.url)
    lean = await harness.start_relay(sim.url, client="lean")
    settings = dict(args.setting)
    proxy = await harness.start_proxy(sim.url, **settings)
    before = (
        await harness.start_proxy(sim.url, root=Path(args.before), **settings)
        if args.before
        else None
    )
    paths = PATHS + ((BEFORE,) if before else ())
    body = {"model": harness.MODEL, "input": "Where is my order #W2378156?", "stream": True}
    completion = orjson.dumps(prepare_request(body, encoding).completion_body)
    responses = orjson.dumps(body)
    ports = {"direct": sim.port, "relay": relay.port, "relay-lean": lean.port, "proxy": proxy.port}
    if before:
        ports[BEFORE] = before.port
    targets = {path: "/v1/responses" if _is_proxy(path) else "/v1/completions" for path in paths}
    payloads = {path: responses if _is_proxy(path) else completion for path in paths}
    samples = {path: Samples() for path in paths}
    sim_headers = {"x-sim-tokens": str(args.tokens)}
    try:
        for path in paths:  # warm up every path (connections, caches)
            for number in range(3):
                payload = harness.request_bytes(
                    targets[path],
                    payloads[path],
                    {**sim_headers, "x-request-id": f"w{path}{number}"},
                )
                await harness.stream(ports[path], payload)
        for repeat in range(args.repeats):
            shift = repeat % len(paths)
            order = paths[shift:] + paths[:shift]
            for path in order:
                rid = f"b-{path}-{repeat}"
                payload = harness.request_bytes(
                    targets[path], payloads[path], {**sim_headers, "x-request-id": rid}
                )
                answer = await harness.stream(ports[path], payload)
                analyse(path, answer, recorder.sends.get(rid, []), samples[path])
    finally:
        proxy.stop()
        if before:
            before.stop()
        relay.stop()
        lean.stop()
        await sim.stop()
    report(samples, args, pinned)


def report(samples: dict[str, Samples], args: argparse.Namespace, pinned: bool) -> None:
    ms = 1000.0
    direct = samples["direct"]
    print(f"# bench/latency.py — {harness.machine()}")
    print(
        f"# simulator: 2 ms/token, first token 20 ms, stream_interval 20, ~{args.tokens} tokens; "
        f"{args.repeats} requests per path"
    )
    if args.setting:
        print(f"# proxy settings: {', '.join(f'{k}={v}' for k, v in args.setting)}")

    def added(values: list[float], reference: list[float]) -> float:
        return (harness.median(values) - harness.median(reference)) * ms

    rows = []
    for path, s in samples.items():
        rows.append(
            [
                path,
                len(s.first_event),
                f"{harness.median(s.first_event) * ms:.3f}",
                f"{harness.pct(s.first_event, 0.99) * ms:.3f}",
                f"{added(s.first_event, direct.first_event):+.3f}",
                f"{harness.median(s.first_sse) * ms:.3f}",
                f"{harness.median(s.first_content) * ms:.2f}",
                len(s.per_frame),
                f"{harness.median(s.per_frame) * ms:.3f}",
                f"{harness.pct(s.per_frame, 0.99) * ms:.3f}",
                f"{added(s.per_frame, direct.per_frame):+.3f}",
                s.errors,
            ]
        )
    print(
        harness.table(
            [
                "path",
                "requests",
                "first event p50 ms",
                "p99 ms",
                "added p50 ms",
                "first SSE event p50 ms",
                "first content p50 ms",
                "frames",
                "per-frame p50 ms",
                "p99 ms",
                "added p50 ms",
                "errors",
            ],
            rows,
        )
    )
    print()
    for path in [p for p in samples if _is_proxy(p)]:
        first = added(samples[path].first_event, direct.first_event)
        frame = added(samples[path].per_frame, direct.per_frame)
        print(
            f"{path}: added time to response.created (p50) {first:.3f} ms, target ≤ "
            f"{TARGET_FIRST_EVENT_MS} ms: {'met' if first <= TARGET_FIRST_EVENT_MS else 'MISSED'}"
        )
        print(
            f"{path}: added per-frame latency (p50) {frame:.3f} ms, target ≤ "
            f"{TARGET_PER_FRAME_MS} ms: {'met' if frame <= TARGET_PER_FRAME_MS else 'MISSED'}"
        )
    if BEFORE in samples:
        checks = (
            ("response.created", "first_event", TARGET_FIRST_EVENT_MS),
            ("per frame", "per_frame", TARGET_PER_FRAME_MS),
        )
        for name, attribute, target in checks:
            change = added(
                getattr(samples["proxy"], attribute), getattr(samples[BEFORE], attribute)
            )
            # within a tenth of the target is noise on this machine, not a regression
            verdict = "REGRESSION" if change > target * REGRESSION_SHARE else "no regression"
            print(f"proxy vs proxy-before, {name}: {change:+.3f} ms p50 ({verdict})")
    added_sse = added(samples["proxy"].first_sse, direct.first_sse)
    print(
        f"as the first SSE event a client reads (upstream's first token frame vs the proxy's "
        f"response.created): {added_sse:+.3f} ms"
    )
    for relay in ("relay", "relay-lean"):
        first = added(samples[relay].first_event, direct.first_event)
        frame = added(samples[relay].per_frame, direct.per_frame)
        print(
            f"for scale, the {relay} adds {first:.3f} ms to the first event, {frame:.3f} per frame"
        )
    if not pinned:
        print("note: fewer than 2 cores: processes were not pinned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--before", help="another checkout whose proxy to measure alongside")
    parser.add_argument(
        "--setting", type=harness.settings_arg, action="append", default=[], metavar="NAME=VALUE"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
