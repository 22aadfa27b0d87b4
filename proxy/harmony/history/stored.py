"""A stored response as data: its record, its event log, and what a reader makes of them
(`GET /v1/responses/{id}`, its replay, `previous_response_id`). Sans-IO: the shell moves the
bytes, these functions only read and build.

The record (`StoredResponse`, the store entry's document) holds the response object as last
written — at its start (`in_progress`, or `queued` for background) and at its end (the terminal
snapshot) — with the request's input items as listed, the chain of earlier responses it
continues (`previous_response_id`, oldest first) and whether it runs in the background. Its
events are the entry's log: batches as JSON arrays, each tagged with its last
`sequence_number`.

While a response runs, the record still says `in_progress`; `as_it_stands` replays its events
over it to show the output so far (`GET /v1/responses/{id}` "as it stands while in
progress"). `ended_events` ends a response whose runner is gone (its lease ran out: the
process died) so that readers and resumed streams see one terminal event, as always.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.harmony.stream import events as ev

#: Event types that end a stream (a cancelled response ends with `response.failed` whose
#: response has status `cancelled`: OpenAI's event set has no `response.cancelled`).
#: Statuses of a response that has not ended yet.
RUNNING = frozenset({"queued", "in_progress"})


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """The record of one stored response (module docstring)."""

    response: dict[str, Any]
    input: list[dict[str, Any]] = field(default_factory=list)
    chain: tuple[str, ...] = ()
    background: bool = False

    @property
    def status(self) -> str:
        return str(self.response["status"])

    def encode(self) -> bytes:
        return _kept(
            orjson.dumps(
                {
                    "response": self.response,
                    "input": self.input,
                    "chain": self.chain,
                    "background": self.background,
                }
            )
        )

    def rest(self) -> bytes:
        """The record without its response, encoded: what stays the same from the response's
        start to its end (`encode_record`)."""
        return _kept(
            orjson.dumps({"input": self.input, "chain": self.chain, "background": self.background})
        )

    @classmethod
    def decode(cls, doc: bytes) -> StoredResponse:
        data = orjson.loads(doc)
        return cls(data["response"], data["input"], tuple(data["chain"]), data["background"])


def encode_record(response: dict[str, Any], rest: bytes) -> bytes:
    """`StoredResponse(response, …).encode()` from `rest` (`StoredResponse.rest`) as decoded
    alike: a running response's recorder keeps its input as these bytes, not as objects."""
    return b'{"response":' + orjson.dumps(response) + b"," + rest[1:]


def encode_events(events: Sequence[dict[str, Any]]) -> tuple[int, bytes]:
    """A batch of events as one log entry: (mark = last sequence number, data)."""
    return events[-1]["sequence_number"], _kept(orjson.dumps(events))


def _kept(data: bytes) -> bytes:
    """`data` in a buffer of its own size. orjson's output keeps the buffer it reserved while
    encoding (4 KB at the least, and several times the output for long strings: orjson 3.12
    and later), so bytes that wait in a recorder or a store batch are copied once:
    bench/stream_memory.py measured 24 KB per open stored stream of such slack."""
    return bytes(memoryview(data))


def decode_events(entries: Iterable[tuple[int, bytes]], after: int = -1) -> list[dict[str, Any]]:
    """The events of log entries with a sequence number above `after`, in order."""
    events: list[dict[str, Any]] = []
    for _, data in entries:
        events += [e for e in orjson.loads(data) if e["sequence_number"] > after]
    return events


def as_it_stands(response: dict[str, Any], events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The response object after `events`: the terminal event's snapshot when there is one,
    else `response` with the items closed so far and the open one with its text so far."""
    items: dict[int, dict[str, Any]] = {}
    for event in events:
        kind = event["type"]
        if kind in ev.TERMINAL_EVENTS:
            ended: dict[str, Any] = event["response"]
            return ended
        if kind in ev.OPENING_EVENTS:
            response = event["response"]
        elif kind in ("response.output_item.added", "response.output_item.done"):
            items[event["output_index"]] = copy.deepcopy(event["item"])
        elif kind.endswith(".delta") and event.get("output_index") in items:
            _add_text(items[event["output_index"]], kind, event["delta"])
    return {**response, "output": [items[index] for index in sorted(items)]}


def _add_text(item: dict[str, Any], kind: str, delta: str) -> None:
    if kind == "response.function_call_arguments.delta":
        item["arguments"] = item.get("arguments", "") + delta
        return
    part_type = "reasoning_text" if kind == "response.reasoning_text.delta" else "output_text"
    content = item.setdefault("content", [])
    if not content:
        part: dict[str, Any] = {"type": part_type, "text": ""}
        if part_type == "output_text":
            part.update(annotations=[], logprobs=[])
        content.append(part)
    content[0]["text"] += delta


def ended_events(
    response: dict[str, Any], next_sequence: int, code: str, message: str
) -> list[dict[str, Any]]:
    """The events that end a stored response that can no longer end by itself (its runner is
    gone): the open item closed as incomplete with its done events, then `error` and
    `response.failed`, numbered from `next_sequence` (every stream ends with exactly one terminal
    event)."""
    closing: list[dict[str, Any]] = []
    output = []
    for index, item in enumerate(response.get("output", [])):
        if item.get("status") == "in_progress":
            item = {**item, "status": "incomplete"}
            closing += _closing(index, item)
        output.append(item)
    failed = {
        **response,
        "status": "failed",
        "output": output,
        "error": {"code": "server_error", "message": message},
        # What its runner counted died with it; a terminal response carries usage (zeros).
        "usage": response.get("usage") or _NO_USAGE,
    }
    events = [*closing, ev.error_event(code, message), ev.response_event("response.failed", failed)]
    for number, event in enumerate(events, start=next_sequence):
        event["sequence_number"] = number
    return events


_NO_USAGE = {
    "input_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens": 0,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 0,
}


def _closing(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The done events of an item closed where it stands (`as_it_stands` gave its text)."""
    kind = item["type"]
    if kind == ev.FUNCTION_CALL:
        done = ev.text_done(kind, index, item["id"], item.get("arguments", ""))
        return [done, ev.item_done(index, item)]
    if kind not in (ev.MESSAGE, ev.REASONING):
        return [ev.item_done(index, item)]
    content = item.get("content") or []
    text = content[0]["text"] if content else ""
    part = ev.output_text_part(text) if kind == ev.MESSAGE else ev.reasoning_text_part(text)
    item["content"] = [part]
    return [
        ev.text_done(kind, index, item["id"], text),
        ev.part_done(index, item["id"], part),
        ev.item_done(index, item),
    ]
