"""What one frame's work costs when the CPU comes back to it after an idle gap, as on the
latency benchmark (a frame every 40 ms), versus back to back (as in bench/core_throughput.py).

    .venv/bin/python bench/cold_cache.py [--gap-ms 40] [--repeats 3]

For each piece of the proxy's per-frame path it prints the median time for one 20-token frame,
warm (no gap) and after sleeping `--gap-ms` before each frame, and the ratio. The pieces:
SSE-decoding and parsing the upstream frame (the floor of any proxy that reads token ids),
`StreamableParser.process` for 20 tokens (openai-harmony, the floor of any re-parse),
`ResponseStream.feed` (the whole core for the frame; the recovery accounting runs off the
clock, after the frame, as in the proxy), encoding one delta event (the floor of any proxy
that writes Responses events), and, for scale, a fixed pure-Python loop
and a `decode` of 20 tokens. Run pinned to one core (it pins itself to core 0 when it can).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
from openai_harmony import HarmonyEncoding, Role, StreamableParser

from bench.core_throughput import response_ids
from bench.harness import encoding as load_encoding
from bench.harness import table
from proxy import sse
from proxy.harmony.response import ResponseContext, random_id
from proxy.harmony.stream.repair import ResponseStream
from proxy.sse import SSEDecoder
from proxy.upstream.completions import parse_frame

FRAME = 20


def frames(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + FRAME] for i in range(0, len(ids), FRAME)]


def timed(
    make: Callable[[], Callable[[list[int]], object]], chunks: list[list[int]], gap: float
) -> float:
    """Median seconds per frame of a fresh `make()` fed every chunk, sleeping `gap` before each."""
    step = make()
    samples = []
    for chunk in chunks:
        if gap:
            time.sleep(gap)
        prepare = getattr(step, "prepare", None)
        arg = prepare(chunk) if prepare is not None else chunk
        start = time.perf_counter()
        step(arg)
        samples.append(time.perf_counter() - start)
        after = getattr(step, "after", None)
        if after is not None:
            after()  # off the clock, as in the proxy
    return statistics.median(samples)


def pieces(encoding: HarmonyEncoding) -> dict[str, Callable[[], Callable[[list[int]], object]]]:
    def parser() -> Callable[[list[int]], object]:
        p = StreamableParser(encoding, Role.ASSISTANT)

        def step(chunk: list[int]) -> None:
            for token in chunk:
                p.process(token)

        return step

    def core() -> Callable[[list[int]], object]:
        ctx = ResponseContext(response_id="resp_bench", created_at=0.0, model="gpt-oss")
        stream = ResponseStream(encoding, ctx, random_id)
        stream.start()

        def step(chunk: list[int]) -> None:
            stream.feed(chunk)

        step.after = stream.account  # type: ignore[attr-defined]  # the proxy runs it after the send
        return step

    def python_loop() -> Callable[[list[int]], object]:
        def step(chunk: list[int]) -> int:
            total = 0
            for number in range(2000):
                total += number
            return total

        return step

    def decode() -> Callable[[list[int]], object]:
        def step(chunk: list[int]) -> str:
            return encoding.decode([t for t in chunk if t < 200000])

        return step

    def frame_in() -> Callable[[list[int]], object]:
        # What every proxy that reads token ids does first: SSE-decode and parse the frame.
        decoder = SSEDecoder()

        def step(wire: bytes) -> object:
            return [parse_frame(message.data) for message in decoder.feed(wire)]

        def wire(chunk: list[int]) -> bytes:  # upstream's bytes, made before the clock starts
            choice = {"index": 0, "text": "", "token_ids": chunk, "finish_reason": None}
            payload = {"id": "cmpl-1", "choices": [choice], "usage": None}
            return b"data: " + orjson.dumps(payload) + b"\n\n"

        step.prepare = wire  # type: ignore[attr-defined]
        return step  # type: ignore[return-value]

    def events_out() -> Callable[[list[int]], object]:
        # What every proxy that writes Responses events does last: encode the frame's delta.
        def step(chunk: list[int]) -> bytes:
            return sse.encode_all(
                [
                    {
                        "type": "response.output_text.delta",
                        "item_id": "msg_0123456789abcdef",
                        "output_index": 1,
                        "content_index": 0,
                        "delta": "x" * 4 * len(chunk),
                        "logprobs": [],
                        "sequence_number": 42,
                    }
                ]
            )

        return step

    return {
        "SSE decode + parse_frame": frame_in,
        "StreamableParser.process × 20": parser,
        "ResponseStream.feed": core,
        "encoding.decode(20 tokens)": decode,
        "encode one delta event": events_out,
        "pure-Python loop (2,000 adds)": python_loop,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap-ms", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=600)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity") and 0 in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {0})
    encoding = load_encoding()
    chunks = frames(response_ids(encoding, args.tokens))
    rows = []
    for name, make in pieces(encoding).items():
        warm = statistics.median(timed(make, chunks, 0.0) for _ in range(args.repeats))
        cold = statistics.median(
            timed(make, chunks, args.gap_ms / 1000) for _ in range(args.repeats)
        )
        rows.append([name, f"{warm * 1e6:.1f}", f"{cold * 1e6:.1f}", f"{cold / warm:.1f}×"])
    print(f"# bench/cold_cache.py — {FRAME} tokens per frame, gap {args.gap_ms:g} ms")
    print(
        table(["per frame", "back to back µs", f"after {args.gap_ms:g} ms idle µs", "ratio"], rows)
    )


if __name__ == "__main__":
    main()
