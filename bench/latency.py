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

"Added" is a path's median minus the direct median. Targets: the
proxy's added time to `response.created` ≤ 1.5 ms p50 and its added per-frame latency ≤ 0.5 ms
p50; both are printed against them. The relays are shown for scale (what any proxy on this
stack adds without doing anything per frame), no longer as a target. `--before DIR` adds a
"proxy-before" path: the proxy of another checkout (e.g. `git worktree add DIR main`), measured
in the same round robin, for a before/after in one run; a change by more than a tenth of the
target counts as a regression (less is run-to-run noise on this machine). `--setting NAME=VALUE`
(repeatable) runs both proxies with a setting, e.g. `store_url=off`; `--before-setting` the
"proxy-before" one only (with `--before .`: one checkout, two settings, side by side).
The first frame carries one token (`<|channel|>`), which has no text: on every path the first
text arrives with the second frame, so "first content" is not a like-for-like comparison; the
per-frame figures are.

- time to the first generated-token event: request written → the first event that carries
  generated tokens (the proxy: the first reasoning, text or arguments delta; the direct path and
  the relays: the first frame with token ids), less the simulator's own time between its first
  token frame and the frame that caused that read (the proxy cannot show a delta before the
  frame with the first text). So every path is measured from the same engine output: what the
  path adds before a client sees its first token, request side and first frame included.
  Target (the sidecar issue): the proxy's added p50 ≤ the lean relay's + 0.3 ms; and to
  `response.created` ≤ the lean relay's + 0.5 ms and ≤ 1.5 ms.
- `--phases`: the proxy runs with timers (bench/phases.py) and a table says where its time
  before `response.created` goes, phase by phase, beside the direct path's.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness, phases
from proxy.harmony.request.prepare import prepare_request
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator

PATHS = ("direct", "relay", "relay-lean", "proxy")
BEFORE = "proxy-before"
#: The targets for the proxy, p50, added over direct: to `response.created`, per frame.
TARGET_FIRST_EVENT_MS = 1.5
TARGET_PER_FRAME_MS = 0.5
#: The sidecar issue's targets, p50, against the lean relay's added time in the same run: to
#: `response.created`, and to the first generated-token event.
TARGET_CREATED_OVER_LEAN_MS = 0.5
TARGET_TOKEN_OVER_LEAN_MS = 0.3
#: A change by more than this share of a target counts as a regression (less is run-to-run noise).
REGRESSION_SHARE = 0.1


@dataclass
class Samples:
    first_event: list[float] = field(default_factory=list)
    first_sse: list[float] = field(default_factory=list)
    first_content: list[float] = field(default_factory=list)
    #: request written → the first generated-token event (proxy: the first reasoning, text or
    #: arguments delta; direct: the first frame with token ids), less the simulator's time
    #: between its first token frame and the frame that caused that read (module docstring).
    first_token: list[float] = field(default_factory=list)
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
            # the frames before the one that caused this read held no generated text (the
            # first holds `<|channel|>` alone): their time is the simulator's, not the path's
            out.first_token.append(at - answer.sent_at - (token_sends[index] - token_sends[0]))
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
    stamps_file = Path(tempfile.mkdtemp(prefix="bench-phases-")) / "stamps.jsonl"
    if args.phases:  # the proxy with timers (bench/phases.py)
        os.environ["BENCH_PHASES_FILE"] = str(stamps_file)
    entry = (str(Path(__file__).parent / "phases.py"),) if args.phases else ("-m", "proxy")
    try:
        proxy = await harness.start_proxy(sim.url, entry=entry, **settings)
        before = (
            await harness.start_proxy(
                sim.url, root=Path(args.before), **{**settings, **dict(args.before_setting)}
            )
            if args.before
            else None
        )
    except BaseException:  # a proxy that did not start: the relays started so far end too
        relay.stop()
        lean.stop()
        await sim.stop()
        raise
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
    #: The client's stamps of each measured request (`sent`, `created`), by request id.
    clients: dict[str, dict[str, float]] = {}
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
                clients[rid] = _client_stamps(path, answer)
    finally:
        proxy.stop()
        if before:
            before.stop()
        relay.stop()
        lean.stop()
        await sim.stop()
    report(samples, args, pinned)
    if args.phases:
        print()
        print_phases(recorder, clients, phases.read_stamps(stamps_file), args.repeats)
    shutil.rmtree(stamps_file.parent, ignore_errors=True)


def _client_stamps(path: str, answer: harness.Answer) -> dict[str, float]:
    """When the request was written and its first event read (the proxy's response.created;
    the direct path's head)."""
    found = {"sent": answer.sent_at}
    if _is_proxy(path):
        created = next((t for t, d in answer.reads if b"response.created" in d), None)
        if created is not None:
            found["created"] = max(created, answer.head_at)
    else:
        found["created"] = answer.head_at
    return found


def print_phases(
    recorder: harness.SendRecorder,
    clients: dict[str, dict[str, float]],
    proxy_stamps: dict[str, dict[str, float]],
    repeats: int,
) -> None:
    """The per-phase table of the time before the first event (bench/phases.py)."""

    def merged(path: str) -> list[dict[str, float]]:
        found = []
        for number in range(repeats):
            rid = f"b-{path}-{number}"
            stamps = {**clients.get(rid, {}), **proxy_stamps.get(rid, {})}
            if rid in recorder.arrivals:
                stamps["sim_arrival"] = recorder.arrivals[rid]
                stamps["sim_head"] = recorder.heads.get(rid, stamps["sim_arrival"])
            # without the store there is no `Stateful.prepare`: its phase is empty
            stamps.setdefault("prepare", stamps.get("render", 0.0))
            stamps.setdefault("prepared", stamps.get("rendered", 0.0))
            found.append(stamps)
        return found

    headers = ["phase", "requests", "p50 ms", "p90 ms"]
    print("## where the time to the first event goes, proxy (bench/phases.py timers)")
    print(harness.table(headers, phases.phase_rows(merged("proxy"), phases.PHASES)))
    print()
    print("## the same for the direct path")
    print(harness.table(headers, phases.phase_rows(merged("direct"), phases.DIRECT_PHASES)))


def report(samples: dict[str, Samples], args: argparse.Namespace, pinned: bool) -> None:
    ms = 1000.0
    direct = samples["direct"]
    print(f"# bench/latency.py — {harness.machine()}")
    print(
        f"# simulator: 2 ms/token, first token 20 ms, stream_interval 20, ~{args.tokens} tokens; "
        f"{args.repeats} requests per path"
    )
    for name, pairs in (("proxy", args.setting), (BEFORE, args.before_setting)):
        if pairs:
            print(f"# {name} settings: {', '.join(f'{k}={v}' for k, v in pairs)}")

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
    print("## the first generated-token event (module docstring: like for like on every path)")
    token_rows = []
    for path, s in samples.items():
        token_rows.append(
            [
                f"{path}, first token",
                len(s.first_token),
                f"{harness.median(s.first_token) * ms:.3f}",
                f"{harness.pct(s.first_token, 0.99) * ms:.3f}",
                f"{added(s.first_token, direct.first_token):+.3f}",
            ]
        )
    headers = ["path", "requests", "first token event p50 ms", "p99 ms", "added p50 ms"]
    print(harness.table(headers, token_rows))
    print()
    lean = samples["relay-lean"]
    lean_created = added(lean.first_event, direct.first_event)
    lean_token = added(lean.first_token, direct.first_token)
    for path in [p for p in samples if _is_proxy(p)]:
        created = added(samples[path].first_event, direct.first_event)
        token = added(samples[path].first_token, direct.first_token)
        bound = min(lean_created + TARGET_CREATED_OVER_LEAN_MS, TARGET_FIRST_EVENT_MS)
        print(
            f"{path}: added time to response.created (p50) {created:.3f} ms, the lean relay's "
            f"{lean_created:.3f} ms; target ≤ lean relay + {TARGET_CREATED_OVER_LEAN_MS} ms and "
            f"≤ {TARGET_FIRST_EVENT_MS} ms: {'met' if created <= bound else 'MISSED'}"
        )
        print(
            f"{path}: added time to the first generated-token event (p50) {token:.3f} ms, the "
            f"lean relay's {lean_token:.3f} ms; target ≤ lean relay + "
            f"{TARGET_TOKEN_OVER_LEAN_MS} ms: "
            f"{'met' if token <= lean_token + TARGET_TOKEN_OVER_LEAN_MS else 'MISSED'}"
        )
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
        "--phases",
        action="store_true",
        help="run the proxy with timers (bench/phases.py) and print where the time before "
        "response.created goes",
    )
    for flag in ("--setting", "--before-setting"):  # both proxies; the --before one only
        parser.add_argument(flag, type=harness.settings_arg, action="append", default=[])
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
