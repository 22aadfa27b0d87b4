"""Core throughput: tokens per second through `ResponseStream` on one core.

    .venv/bin/python bench/core_throughput.py [--repeats 15] [--tokens 3000]

Feeds a synthetic gpt-oss response (reasoning then answer, with unicode) at 1 and 20 tokens per
chunk, with and without the model of the unpatched upstream (the recovery accounting), and
prints the median and p99 over repeated runs. Target (issue 2): ≥ 100,000 tokens/s at 20 per
chunk for a 3,000-token response. Run on an idle machine; quote numbers from one run.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

from openai_harmony import HarmonyEncoding

from proxy import vocab
from proxy.harmony.response import ResponseContext, random_id
from proxy.harmony.stream import ResponseStream

PARAGRAPH = (
    "The shipment left the warehouse on Monday; tracking shows it in transit through the "
    "regional hub, with delivery expected Thursday. Überprüfung läuft — 配送状況を確認中 🚚. "
)


def response_ids(encoding: HarmonyEncoding, n_tokens: int) -> list[int]:
    """A Harmony completion of about `n_tokens`: one third reasoning, the rest the answer."""
    per_paragraph = len(encoding.encode(PARAGRAPH))
    body = PARAGRAPH * (n_tokens // per_paragraph + 1)
    words = body.split(" ")
    third = len(words) // 3
    text = (
        "<|channel|>analysis<|message|>"
        + " ".join(words[:third])
        + "<|end|><|start|>assistant<|channel|>final<|message|>"
        + " ".join(words[third:])
    )
    ids = list(encoding.encode(text, allowed_special="all"))[: n_tokens - 1]
    return [*ids, 200002]


def run_once(encoding: HarmonyEncoding, ids: list[int], chunk: int, compare: bool) -> float:
    ctx = ResponseContext(response_id="resp_bench", created_at=0.0, model="gpt-oss")
    chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
    start = time.perf_counter()
    stream = ResponseStream(encoding, ctx, random_id, compare_unpatched=compare)
    stream.start()
    for part in chunks:
        stream.feed(part)
    stream.finish("stop")
    stream.record()
    return time.perf_counter() - start


def measure(fn: Callable[[], float], repeats: int) -> tuple[float, float]:
    fn()  # warm-up
    times = sorted(fn() for _ in range(repeats))
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return statistics.median(times), p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tokens", type=int, nargs="+", default=[300, 3000])
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    encoding = vocab.load_encoding(vocab.ensure_vocab(os.environ))
    print(
        f"{'tokens':>7} {'per chunk':>9} {'unpatched model':>15} "
        f"{'median tok/s':>13} {'p99 tok/s':>10} {'µs/token':>9}"
    )
    for n_tokens in args.tokens:
        ids = response_ids(encoding, n_tokens)
        for chunk in (1, 20):
            for compare in (False, True):
                median, p99 = measure(
                    functools.partial(run_once, encoding, ids, chunk, compare), args.repeats
                )
                print(
                    f"{len(ids):>7} {chunk:>9} {'on' if compare else 'off':>15} "
                    f"{len(ids) / median:>13,.0f} {len(ids) / p99:>10,.0f} "
                    f"{median / len(ids) * 1e6:>9.2f}"
                )


if __name__ == "__main__":
    main()
