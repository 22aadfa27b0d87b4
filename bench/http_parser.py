"""The lean upstream client's HTTP/1.1 response parser: llhttp (httptools) against the
hand-written parser it replaced and h11, per frame and per head; and, with
`--baseline`, the proxy's per-frame latency before and after, in one run.

    .venv/bin/python bench/http_parser.py [--repeats 7] [--frames 2000]
    .venv/bin/python bench/http_parser.py --baseline a54ddc9 [--requests 30] [--tokens 300]

Parsers. Each reads a trtllm-serve head (~150 bytes) and then chunked SSE frames of 20 token
ids (~330 bytes, one chunk per read, as uvicorn writes them), one `feed` per frame, as
`proxy.upstream.stream` does in `data_received`. Figures are medians over `--repeats` runs of
`--frames` frames (per frame) or of as many heads (per head). `--baseline REV` adds the parser
of `proxy/upstream/http1.py` at git revision REV (read with `git show`, loaded as a module).

Latency (with `--baseline`). The simulator paced like a fast GPU (bench/latency.py's setting:
2 ms per token, `stream_interval` 20) serves two proxies — this checkout's and REV's (exported
with `git archive`) — one at a time, round robin; per-frame latency is measured as in
bench/latency.py (the simulator's send of an engine output to the client's read of its events).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import h11
import orjson

from bench import harness, latency
from proxy.harmony.request.prepare import prepare_request
from proxy.simulator import SimulatorConfig, create_simulator_app, start_simulator
from proxy.upstream import http1

HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Mon, 01 Jun 2026 12:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)
_IDS = [200005, 35644, 200008, 976, 1825, 382, 6960, 1078, 290, 2569, 13, 1416, 1309, 1757]


def sse_frame(number: int) -> bytes:
    """One trtllm-serve frame of 20 token ids (CompletionStreamResponse), as one chunk."""
    choice = {
        "index": 0,
        "text": "",
        "token_ids": [(_IDS[i % len(_IDS)] + number) % 200000 for i in range(20)],
        "logprobs": None,
        "finish_reason": None,
        "stop_reason": None,
        "avg_decoded_tokens_per_iter": None,
    }
    payload = {
        "id": "cmpl-3f9c0a1e",
        "object": "text_completion",
        "created": 1780000000,
        "model": "openai/gpt-oss-120b",
        "choices": [choice],
        "usage": None,
    }
    data = b"data: " + orjson.dumps(payload) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


#: A reader: made fresh per response; `feed(bytes) -> body bytes`.
Feed = Callable[[bytes], object]


def llhttp_reader() -> Feed:
    return http1.ResponseReader().feed


def module_reader(module: types.ModuleType) -> Callable[[], Feed]:
    def make() -> Feed:
        return module.ResponseReader().feed  # type: ignore[no-any-return]

    return make


def h11_reader() -> Feed:
    connection = h11.Connection(h11.CLIENT)
    connection.send(h11.Request(method="POST", target="/", headers=[("host", "x")]))

    def feed(data: bytes) -> object:
        connection.receive_data(data)
        out = []
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return out
            if isinstance(event, h11.Data):
                out.append(event.data)

    return feed


def baseline_parser(revision: str) -> types.ModuleType:
    source = subprocess.run(
        ["git", "show", f"{revision}:proxy/upstream/http1.py"],
        cwd=harness.ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType(f"http1_{revision}")
    # dataclasses look their module up in sys.modules while the class body runs
    sys.modules[module.__name__] = module
    exec(compile(source, f"{revision}:proxy/upstream/http1.py", "exec"), module.__dict__)
    return module


def per_frame(make: Callable[[], Feed], frames: list[bytes], repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        feed = make()
        feed(HEAD)
        start = time.perf_counter()
        for frame in frames:
            feed(frame)
        runs.append((time.perf_counter() - start) / len(frames))
    return statistics.median(runs)


def per_head(make: Callable[[], Feed], count: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(count):
            make()(HEAD)
        runs.append((time.perf_counter() - start) / count)
    return statistics.median(runs)


def parsers(args: argparse.Namespace) -> None:
    candidates: dict[str, Callable[[], Feed]] = {"llhttp (httptools)": llhttp_reader}
    if args.baseline:
        candidates[f"http1.py at {args.baseline}"] = module_reader(baseline_parser(args.baseline))
    candidates["h11"] = h11_reader
    frames = [sse_frame(number) for number in range(args.frames)]
    for make in candidates.values():  # the same bytes come out of every parser
        feed = make()
        feed(HEAD)
        assert b"".join(_bytes(feed(frame)) for frame in frames[:3]) == b"".join(
            frame.split(b"\r\n", 1)[1][:-2] for frame in frames[:3]
        )
    rows = []
    for name, make in candidates.items():
        rows.append(
            [
                name,
                f"{per_frame(make, frames, args.repeats) * 1e6:.2f}",
                f"{per_head(make, args.frames, args.repeats) * 1e6:.2f}",
            ]
        )
    print(f"# bench/http_parser.py — {harness.machine()}")
    print(
        f"# {len(frames[0])}-byte chunked frames of 20 token ids, one feed each; a "
        f"{len(HEAD)}-byte head; medians of {args.repeats} runs"
    )
    print(harness.table(["parser", "per frame µs", "per head µs"], rows))


def _bytes(body: object) -> bytes:
    if isinstance(body, list):
        return b"".join(body)
    assert isinstance(body, bytes)
    return body


async def before_after(args: argparse.Namespace) -> None:
    encoding = harness.encoding()
    pinned = harness.pin_self(harness.BENCH_CORE)
    config = SimulatorConfig(
        token_seconds=0.002, first_token_seconds=0.02, stream_interval=20, record_limit=100_000
    )
    recorder = harness.SendRecorder(create_simulator_app(config, encoding))
    sim = await start_simulator(config, encoding, app=recorder)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(
            ["git", "archive", args.baseline, "proxy"],
            cwd=harness.ROOT,
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        before = await harness.start_proxy(sim.url, root=Path(tree))
        after = await harness.start_proxy(sim.url)
        proxies = {f"proxy at {args.baseline}": before, "proxy (this checkout)": after}
        samples = {name: latency.Samples() for name in proxies}
        body = {"model": harness.MODEL, "input": "Where is my order #W2378156?", "stream": True}
        prepare_request(body, encoding)  # fail early if the request cannot be rendered
        payload = orjson.dumps(body)
        headers = {"x-sim-tokens": str(args.tokens)}
        try:
            for which, proxy in enumerate(proxies.values()):  # warm up (connections, caches)
                for number in range(3):
                    request = harness.request_bytes(
                        "/v1/responses", payload, {**headers, "x-request-id": f"w{which}-{number}"}
                    )
                    await harness.stream(proxy.port, request)
            names = list(proxies)
            for repeat in range(args.requests):
                for name in names[repeat % 2 :] + names[: repeat % 2]:
                    rid = f"b-{repeat}-{names.index(name)}"  # a sane id: the proxy passes it on
                    request = harness.request_bytes(
                        "/v1/responses", payload, {**headers, "x-request-id": rid}
                    )
                    answer = await harness.stream(proxies[name].port, request)
                    latency.analyse("proxy", answer, recorder.sends.get(rid, []), samples[name])
        finally:
            before.stop()
            after.stop()
            await sim.stop()
    rows = [
        [
            name,
            len(s.per_frame),
            f"{harness.median(s.per_frame) * 1000:.3f}",
            f"{harness.pct(s.per_frame, 0.99) * 1000:.3f}",
            f"{harness.median(s.first_event) * 1000:.3f}",
            s.errors,
        ]
        for name, s in samples.items()
    ]
    print()
    print(
        f"# per-frame latency through the proxy, {args.requests} requests each of "
        f"~{args.tokens} tokens (2 ms/token, stream_interval 20), round robin"
    )
    print(
        harness.table(
            ["proxy", "frames", "per-frame p50 ms", "p99 ms", "first event p50 ms", "errors"],
            rows,
        )
    )
    if not pinned:
        print("note: fewer than 2 cores: processes were not pinned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--baseline", help="git revision whose parser and proxy to compare")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=300)
    args = parser.parse_args()
    parsers(args)
    if args.baseline:
        asyncio.run(before_after(args))


if __name__ == "__main__":
    main()
