"""Cost per token of the model of the unpatched upstream (`proxy.harmony.unpatched.emitter`).

    .venv/bin/python bench/unpatched_cost.py [--repeats 9] [--tokens 3000]

Feeds a synthetic gpt-oss response (reasoning then answer) at 1 and 20 tokens per chunk and
prints the median µs per token of: the bare `StreamableParser.process` loop (the floor), the
model (`start` + `feed` + `finish`, the snapshot included), and upstream's own algorithm, which
reads `parser.state` and `parser.messages` on every output (O(n) each). Run on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from openai_harmony import HarmonyEncoding, Role, StreamableParser, StreamState

from proxy import vocab
from proxy.harmony.response import CountingIds, ResponseContext
from proxy.harmony.unpatched.emitter import UnpatchedStream

SENTENCE = "The shipment left the warehouse on Monday and should arrive on Thursday."


def response_ids(encoding: HarmonyEncoding, n_tokens: int) -> list[int]:
    """About `n_tokens` ids: half reasoning, half answer, ending in <|return|>."""
    body = " ".join([SENTENCE] * (n_tokens // 12 + 1))
    half = len(body) // 2
    text = (
        f"<|channel|>analysis<|message|>{body[:half]}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{body[half:]}"
    )
    return [*encoding.encode(text, allowed_special="all")[: n_tokens - 1], 200002]


def parser_only(encoding: HarmonyEncoding, chunks: list[list[int]]) -> None:
    parser = StreamableParser(encoding, role=Role.ASSISTANT)
    for chunk in chunks:
        for token in chunk:
            parser.process(token)


def model(encoding: HarmonyEncoding, chunks: list[list[int]]) -> None:
    ctx = ResponseContext(response_id="resp_bench", created_at=0.0, model="gpt-oss")
    stream = UnpatchedStream(encoding, ctx, CountingIds())
    stream.start()
    for chunk in chunks:
        stream.feed(chunk)
    stream.finish("stop", None)


def upstream_reads(encoding: HarmonyEncoding, chunks: list[list[int]]) -> None:
    parser = StreamableParser(encoding, role=Role.ASSISTANT)
    for chunk in chunks:
        for token in chunk:
            parser.process(token)
        messages = parser.messages  # what upstream reads per output, besides the deltas
        if parser.state == StreamState.EXPECT_START and messages:
            _ = messages[-1].content[0]


def median_us_per_token(
    run: Callable[[HarmonyEncoding, list[list[int]]], None],
    encoding: HarmonyEncoding,
    ids: list[int],
    chunk: int,
    repeats: int,
) -> float:
    chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(encoding, chunks)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / len(ids) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=3000)
    args = parser.parse_args()
    encoding = vocab.load_encoding(vocab.ensure_vocab(os.environ))
    ids = response_ids(encoding, args.tokens)
    print(f"{len(ids)} tokens, median of {args.repeats} runs, µs per token")
    for chunk in (1, 20):
        row = [
            f"{name} {median_us_per_token(run, encoding, ids, chunk, args.repeats):6.2f}"
            for name, run in (
                ("parser only", parser_only),
                ("model", model),
                ("upstream's reads", upstream_reads),
            )
        ]
        print(f"{chunk:>2} per chunk: " + " | ".join(row))


if __name__ == "__main__":
    main()
