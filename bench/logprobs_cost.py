"""Logprobs cost: the proxy's CPU per 1,000 generated tokens with token logprobs off
and on, side by side in one run.

    .venv/bin/python bench/logprobs_cost.py [--tokens 3000] [--chunk 20] [--repeats 15]

What runs is the proxy's whole per-frame path, in-process on one core, with upstream's real
frame bytes: the simulator's `CompletionWriter` makes the `/v1/completions` frames the proxy
would read (20 tokens per frame; with `logprobs: max(1, top_logprobs)` when asked, as the proxy
asks), then per frame `parse_frame` (upstream's JSON, logprobs checked), `ResponseStream.feed`
(the repair core: entries built per content token) and `sse.encode_all` (the bytes the client
gets), with the recovery accounting on, as the proxy runs by default. A synthetic gpt-oss
answer (one third reasoning, unicode with characters split across tokens) is fed.

Rows: `off` (no include: nothing asked of upstream, frames without logprobs), `top 0` (the
include: `logprobs: 1` upstream, no alternatives out), `top 5`, `top 20`; and `top 5 before`,
`top 20 before`: the same frames through the entries as they were built before they were
ranked (upstream's order cut at N, wrong whenever the sampled token is not the most likely),
to show what ranking the alternatives costs. Upstream's frames list the sampled token first and
then the N best, as the simulator sends them. Columns: the median and p90 CPU µs per token over
`--repeats` runs, CPU s per 1k tokens, the SSE bytes per token sent to the client, and the ratio
to `off`. Run on an idle machine; quote figures from one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openai_harmony import HarmonyEncoding

from bench import harness
from bench.core_throughput import response_ids
from proxy import sse
from proxy.harmony.response import ResponseContext, random_id
from proxy.harmony.stream.logprobs import Entry, Logprobs
from proxy.harmony.stream.parser import TokenTable
from proxy.harmony.stream.repair import ResponseStream
from proxy.simulator.completion_frames import CompletionWriter
from proxy.simulator.completion_request import read_completion_request
from proxy.simulator.engine import EngineOutput
from proxy.upstream.completions import parse_frame

PARAGRAPH = (
    "The shipment left the warehouse on Monday; tracking shows it in transit through the "
    "regional hub 🫠, delivery expected Thursday. Überprüfung läuft — 配送状況を確認中 𝔘𝔫𝔦. "
)
#: Row name → the request's `top_logprobs` (None: no include), and whether the entries are
#: built as before they were ranked.
CONFIGS = {
    "off": (None, False),
    "top 0": (0, False),
    "top 5 before": (5, True),
    "top 5": (5, False),
    "top 20 before": (20, True),
    "top 20": (20, False),
}


class InUpstreamOrder(Logprobs):
    """The entries as they were built before the alternatives were ranked: upstream's order,
    cut at N. Wrong (the sampled token comes first, and may push the N-th best out); measured
    only beside the ranked ones."""

    def entry(self, token: int, value: float, top: Mapping[str, float] | None) -> Entry:
        text, data = self.token(token)
        alternatives: list[Entry] = []
        if top and self.top:
            strings = self._strings
            for alternative, logprob in top.items():
                encoded = strings.get(alternative)
                if encoded is None:
                    encoded = strings[alternative] = list(alternative.encode())
                alternatives.append({"token": alternative, "logprob": logprob, "bytes": encoded})
                if len(alternatives) == self.top:
                    break
        return {"token": text, "logprob": value, "bytes": data, "top_logprobs": alternatives}


def frames(encoding: HarmonyEncoding, ids: list[int], chunk: int, top: int | None) -> list[str]:
    """The `data:` payloads upstream sends for `ids`, `chunk` per frame."""
    body: dict[str, object] = {"model": "m", "prompt": [1], "stream": True, "detokenize": False}
    if top is not None:
        body["logprobs"] = max(1, top)
    writer = CompletionWriter(
        encoding,
        read_completion_request(body),
        engine_id=0,
        created=0,
        prompt_tokens=1,
        prompt_text=None,
    )
    out = []
    for start in range(0, len(ids), chunk):
        last = start + chunk >= len(ids)
        output = EngineOutput(tuple(ids[start : start + chunk]), "stop" if last else None)
        out.append(writer.chunk(output).decode()[len("data: ") : -2])
    return out


def run_once(
    encoding: HarmonyEncoding,
    table: TokenTable,
    data: list[str],
    top: int | None,
    before: bool = False,
) -> tuple[float, int]:
    """CPU seconds for one response through the per-frame path, and the SSE bytes it wrote;
    `before`: with the entries built in upstream's order (`InUpstreamOrder`)."""
    ctx = ResponseContext(response_id="resp_bench", created_at=0.0, model="m", top_logprobs=top)
    asked = top is not None
    written = 0
    start = time.process_time()
    stream = ResponseStream(encoding, ctx, random_id, table=table)
    if before and top is not None:
        # The core makes its own `Logprobs`; the old entries go in its place, nothing else.
        stream._logprobs = InUpstreamOrder(table, top)
    written += len(sse.encode_all(stream.start()))
    for payload in data:
        frame = parse_frame(payload, logprobs=asked)
        events = stream.feed(frame.token_ids, frame.logprobs, frame.top_logprobs)
        if frame.finish_reason is not None:
            events += stream.finish(frame.finish_reason, frame.stop_reason)
        written += len(sse.encode_all(events))
        stream.account()
    return time.process_time() - start, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    harness.pin_self(harness.cores()[0])
    encoding = harness.encoding()
    table = TokenTable(encoding)
    ids = response_ids(encoding, args.tokens, PARAGRAPH)
    data = {name: frames(encoding, ids, args.chunk, top) for name, (top, _) in CONFIGS.items()}
    for name, (top, before) in CONFIGS.items():  # warm the caches, as a running proxy has them
        run_once(encoding, table, data[name], top, before)
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    sizes: dict[str, int] = {}
    for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits all rows
        for name, (top, before) in CONFIGS.items():
            seconds, written = run_once(encoding, table, data[name], top, before)
            times[name].append(seconds / len(ids))
            sizes[name] = written
    base = harness.median(times["off"])
    rows = []
    for name in CONFIGS:
        per_token = harness.median(times[name])
        rows.append(
            [
                name,
                f"{per_token * 1e6:.2f}",
                f"{harness.pct(times[name], 0.9) * 1e6:.2f}",
                f"{per_token * 1000:.4f}",
                f"{sizes[name] / len(ids):.0f}",
                f"{per_token / base:.2f}x",
            ]
        )
    print(harness.machine())
    print(
        f"{len(ids)} tokens, {args.chunk} per frame, {args.repeats} runs per row (median, p90); "
        "parse_frame + ResponseStream.feed + sse.encode_all, accounting on\n"
    )
    headers = ["logprobs", "µs/token", "p90", "CPU s / 1k tok", "SSE B/token", "vs off"]
    print(harness.table(headers, rows))


if __name__ == "__main__":
    main()
