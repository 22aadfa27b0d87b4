"""Helpers for core tests: Harmony text → ids, chunkings, running a stream, normalising events."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from openai_harmony import HarmonyEncoding

from proxy.harmony.response import CountingIds, ResponseContext
from proxy.harmony.stream import ResponseStream

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
