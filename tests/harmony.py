"""Helpers for core tests: Harmony text → ids, chunkings, running a stream, normalising events."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from proxy.harmony.response import CountingIds, ResponseContext
from proxy.harmony.stream.repair import ResponseStream
from proxy.harmony.tokens import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START

MODEL = "openai/gpt-oss-120b"


def ids_of(encoding: HarmonyEncoding, text: str) -> list[int]:
    return list(encoding.encode(text, allowed_special="all"))


def context(**overrides: Any) -> ResponseContext:
    values: dict[str, Any] = {
        "response_id": "resp_test",
        "created_at": 1767225600,
        "model": MODEL,
        "input_tokens": 10,
    }
    values.update(overrides)
    return ResponseContext(**values)


def chunks_of(ids: Sequence[int], sizes: Iterable[int]) -> list[list[int]]:
    """Split `ids` by `sizes` (cycled); a size of 0 gives an empty chunk."""
    out: list[list[int]] = []
    position = 0
    for size in itertools.cycle(sizes):
        if position >= len(ids):
            break
        out.append(list(ids[position : position + size]))
        position += size
    return out


def run(
    encoding: HarmonyEncoding,
    chunks: Iterable[Sequence[int]],
    finish: str = "stop",
    *,
    ctx: ResponseContext | None = None,
    compare_unpatched: bool = True,
) -> tuple[list[dict[str, Any]], ResponseStream]:
    stream = ResponseStream(
        encoding, ctx or context(), CountingIds(), compare_unpatched=compare_unpatched
    )
    events = stream.start()
    for chunk in chunks:
        events += stream.feed(chunk)
    events += stream.finish(finish, None)
    return events, stream


def coalesced(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events with consecutive deltas of one item merged and sequence numbers dropped: equal for
    every chunking of the same tokens."""
    out: list[dict[str, Any]] = []
    for event in events:
        event = {k: v for k, v in event.items() if k != "sequence_number"}
        previous = out[-1] if out else None
        if (
            previous is not None
            and event["type"].endswith(".delta")
            and previous["type"] == event["type"]
            and previous["item_id"] == event["item_id"]
        ):
            previous["delta"] += event["delta"]
            continue
        out.append(event)
    return out


def semantic(items: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What an output item says, without ids, statuses, phases or upstream's Python-named keys."""
    out = []
    for item in items:
        kind = item["type"]
        if kind == "function_call":
            out.append((kind, item["name"], item.get("namespace"), item["arguments"]))
        elif kind == "web_search_call":
            out.append((kind, item["action"]))
        elif kind == "message":
            text = "".join(part["text"] for part in item["content"])
            out.append((kind, item["role"], text))
        else:
            text = "".join(part["text"] for part in item.get("content") or [])
            out.append((kind, text))
    return out


# -- engine outputs, malformed ones included (Hypothesis) ----------------------------------

HEADERS = [
    "<|channel|>analysis<|message|>",
    "<|channel|>final<|message|>",
    "<|start|>assistant<|channel|>analysis<|message|>",
    "<|start|>assistant<|channel|>final<|message|>",
    "<|start|>assistant<|channel|>commentary<|message|>",
    "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>",
    "<|start|>assistant to=python<|channel|>analysis<|message|>",
    "<|start|>assistant<|channel|>commentary to=browser.search<|message|>",  # JSON or a 400
    "<|start|>assistant<|channel|>commentary to=container.exec<|message|>",  # unknown recipient
    "<|start|>assistant<|channel|>other<|message|>",  # unknown channel
    "<|start|>user<|message|>",
    "<|start|>user<|channel|>final<|message|>",  # another author on a streamed channel
    "<|start|>assistant<|message|>",
    "<|start|>foo<|message|>",  # rejected header: unknown role
    "<|start|>assistant<|channel|><|message|>",  # rejected header: empty channel
]
TEXTS = [" Some text,", " more", "😀 é 中文", '{"a": 1}', '{"query": "q"}', "final"]
SPECIALS = [START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN, 94, 4103, 10**9]


@st.composite
def engine_outputs(draw: st.DrawFn, encoding: HarmonyEncoding) -> list[list[int]]:
    """Harmony messages (some malformed) and stray ids, cut into outputs of 0 to 6 ids."""
    text = st.one_of(
        st.sampled_from(TEXTS).map(lambda text: ids_of(encoding, text)),
        st.lists(st.integers(0, 201_088), min_size=1, max_size=2),
        st.sampled_from(SPECIALS).map(lambda token: [token]),
    )
    message = st.tuples(
        st.sampled_from(HEADERS).map(lambda text: ids_of(encoding, text)),
        st.lists(text, max_size=4),
        st.sampled_from([[END], [CALL], [RETURN], []]),
    ).map(lambda parts: parts[0] + [token for piece in parts[1] for token in piece] + parts[2])
    stray = st.sampled_from(SPECIALS).map(lambda token: [token])
    pieces = draw(st.lists(st.one_of(message, message, message, stray), max_size=6))
    ids = [token for piece in pieces for token in piece]
    sizes = draw(st.lists(st.integers(0, 6), min_size=1, max_size=8))
    outputs: list[list[int]] = []
    position, turn = 0, 0
    while position < len(ids) or not outputs:
        size = sizes[turn % len(sizes)]
        outputs.append(ids[position : position + size])
        position, turn = position + size, turn + 1
        if turn > 4 * len(ids) + 4:
            outputs.append(ids[position:])
            break
    return outputs
