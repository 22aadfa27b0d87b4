"""Core throughput: tokens per second through `ResponseStream` on one core.

    .venv/bin/python bench/core_throughput.py [--repeats 15] [--tokens 300 3000] [--before DIR]

Feeds a synthetic gpt-oss response (reasoning then answer, with unicode) at 1 and 20 tokens per
chunk, as the proxy does (`account()` after every chunk), with the recovery accounting off, on
(what the proxy runs: read from the core's own parse) and, where the core has it, with
the full model of the unpatched upstream beside it ("full": the older accounting),
and prints the median and p99 over repeated runs. `--before DIR` measures the core of another
checkout too, in a child process, interleaved configuration by configuration (its "on" is
whatever that checkout's accounting was). Target: ≥ 100,000 tokens/s at 20 per chunk
for a 3,000-token response. Run on an idle machine; quote numbers from one run.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from openai_harmony import HarmonyEncoding

from proxy import vocab
from proxy.harmony.response import ResponseContext, random_id
from proxy.harmony.stream.repair import ResponseStream

PARAGRAPH = (
    "The shipment left the warehouse on Monday; tracking shows it in transit through the "
    "regional hub, with delivery expected Thursday. Überprüfung läuft — 配送状況を確認中 🚚. "
)
ACCOUNTING = ("off", "on", "full")


def response_ids(encoding: HarmonyEncoding, n_tokens: int, paragraph: str = PARAGRAPH) -> list[int]:
    """A Harmony completion of about `n_tokens` of `paragraph` repeated: one third reasoning, the
    rest the answer."""
    per_paragraph = len(encoding.encode(paragraph))
    body = paragraph * (n_tokens // per_paragraph + 1)
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


def _stream(encoding: HarmonyEncoding, ctx: ResponseContext, accounting: str) -> Any:
    if accounting == "full":
        return ResponseStream(encoding, ctx, random_id, derive_unpatched=False)
    return ResponseStream(encoding, ctx, random_id, compare_unpatched=accounting == "on")


def run_once(encoding: HarmonyEncoding, ids: list[int], chunk: int, accounting: str) -> float:
    ctx = ResponseContext(response_id="resp_bench", created_at=0.0, model="gpt-oss")
    chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
    start = time.perf_counter()
    stream = _stream(encoding, ctx, accounting)
    stream.start()
    for part in chunks:
        stream.feed(part)
        stream.account()  # as the shell does, after each frame's events are out
    stream.finish("stop")
    stream.record()
    return time.perf_counter() - start


def measure(fn: Callable[[], float], repeats: int) -> tuple[float, float]:
    fn()  # warm-up
    times = sorted(fn() for _ in range(repeats))
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return statistics.median(times), p99


def supports_full() -> bool:
    """Whether this checkout's core can run the full model beside its own accounting."""
    return "derive_unpatched" in inspect.signature(ResponseStream).parameters


def child(args: argparse.Namespace) -> None:
    """Measure one configuration here and print it as JSON (for `--before`)."""
    encoding = vocab.load_encoding(vocab.ensure_vocab(os.environ))
    ids = response_ids(encoding, args.tokens[0])
    median, p99 = measure(
        functools.partial(run_once, encoding, ids, args.chunk, args.accounting), args.repeats
    )
    print(json.dumps({"tokens": len(ids), "median": median, "p99": p99}))


def in_checkout(root: str, n_tokens: int, chunk: int, accounting: str, repeats: int) -> Any:
    """This script run against the `proxy` of checkout `root` (first on the path)."""
    result = subprocess.run(
        [
            *(sys.executable, __file__, "--child", "--tokens", str(n_tokens)),
            *("--chunk", str(chunk), "--accounting", accounting, "--repeats", str(repeats)),
        ],
        env={**os.environ, "PYTHONPATH": root},
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tokens", type=int, nargs="+", default=[300, 3000])
    parser.add_argument("--before", help="another checkout whose core to measure alongside")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--accounting", default="on", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    if args.child:
        child(args)
        return
    encoding = vocab.load_encoding(vocab.ensure_vocab(os.environ))
    accountings = ACCOUNTING if supports_full() else ACCOUNTING[:2]
    build = f" {'build':>6}" if args.before else ""
    print(
        f"{'tokens':>7} {'per chunk':>9} {'accounting':>10}{build} "
        f"{'median tok/s':>13} {'p99 tok/s':>10} {'µs/token':>9}"
    )
    for n_tokens in args.tokens:
        ids = response_ids(encoding, n_tokens)
        for chunk in (1, 20):
            for accounting in accountings:
                median, p99 = measure(
                    functools.partial(run_once, encoding, ids, chunk, accounting), args.repeats
                )
                rows = [("now", len(ids), median, p99)]
                if args.before and accounting != "full":
                    then = in_checkout(args.before, n_tokens, chunk, accounting, args.repeats)
                    rows.append(("before", then["tokens"], then["median"], then["p99"]))
                for name, count, med, worst in rows:
                    label = f" {name:>6}" if args.before else ""
                    print(
                        f"{count:>7} {chunk:>9} {accounting:>10}{label} "
                        f"{count / med:>13,.0f} {count / worst:>10,.0f} "
                        f"{med / count * 1e6:>9.2f}"
                    )


if __name__ == "__main__":
    main()
