"""What one response's repair did, as data: metrics and logs read it, the core never counts.

`Tally` counts while the stream runs (cheap: per item and per event, not per token);
`RepairRecord` is its frozen summary, including what the unpatched upstream would have lost
for the same chunks, defined as:

- `recovered_events[type]`: events of that type in the repaired stream counted at one delta per
  token, minus those the unpatched stream carries, floored at zero;
- `recovered_chars[channel]` / `recovered_tokens[channel]`: text characters / content tokens
  the repaired stream delivered that the unpatched stream's deltas did not;
- `unpatched_text_differs`: the unpatched stream's streamed reasoning or answer text differs
  from the text its own terminal snapshot carries (what made clients show the wrong answer).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.harmony.stream import events as ev
from proxy.harmony.stream.items import (
    CHANNELS,
    FINAL_CHANNEL,
    REASONING_CHANNEL,
    OpenItem,
)

#: Every kind of malformed model output the core counts (the keys of `RepairRecord.malformed`);
#: the metrics export each at zero from start-up, so alerts and rates never start from "no data".
MALFORMED_KINDS = (
    "missing_end",
    "token_outside_message",
    "invalid_header",
    "invalid_content_token",
    "invalid_token_id",
    "unexpected_role",
    "incomplete_header",
)

#: Which accounting channel the unpatched stream's deltas of each type carry.
_UNPATCHED_DELTA_CHANNEL = {
    "response.reasoning_text.delta": REASONING_CHANNEL,
    "response.output_text.delta": FINAL_CHANNEL,
}  # upstream streams no function-call arguments, preambles or tool input


@dataclass(frozen=True, slots=True)
class RepairRecord:
    """A frozen summary of one response (see the module docstring for the recovery fields)."""

    status: str
    finish_reason: str | None
    output_tokens: int
    frames: int
    reasoning_tokens: int
    items: Mapping[str, int]
    tokens: Mapping[str, int]
    content_tokens: Mapping[str, int]
    chars: Mapping[str, int]
    events: Mapping[str, int]
    malformed: Mapping[str, int]
    compared: bool = False
    recovered_events: Mapping[str, int] = field(default_factory=dict)
    recovered_chars: Mapping[str, int] = field(default_factory=dict)
    recovered_tokens: Mapping[str, int] = field(default_factory=dict)
    unpatched_text_differs: bool = False

    @property
    def items_unannounced(self) -> int:
        """Items the unpatched stream would never have announced (`output_item.added`)."""
        return self.recovered_events.get("response.output_item.added", 0)

    @property
    def items_unclosed(self) -> int:
        """Items the unpatched stream would never have closed (`output_item.done`)."""
        return self.recovered_events.get("response.output_item.done", 0)

    @property
    def repaired(self) -> bool:
        """True when the unpatched stream would have lost or garbled anything."""
        return self.unpatched_text_differs or any(self.recovered_events.values())


class _Digest:
    """CRC-32 and length of a text fed in pieces: equal digests, equal texts (for a metric)."""

    __slots__ = ("crc", "length")

    def __init__(self) -> None:
        self.crc = 0
        self.length = 0

    def add(self, text: str) -> None:
        data = text.encode("utf-8", "surrogatepass")
        self.crc = zlib.crc32(data, self.crc)
        self.length += len(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Digest) and (self.crc, self.length) == (other.crc, other.length)

    __hash__ = None  # type: ignore[assignment]


class Tally:
    """Running counts of one stream; `record()` freezes them."""

    __slots__ = (
        "chars",
        "content_tokens",
        "emitted_events",
        "frames",
        "items",
        "own_text",
        "per_token_deltas",
        "reasoning_tokens",
        "tokens",
        "tokens_by_channel",
        "unpatched_chars",
        "unpatched_events",
        "unpatched_text",
        "unpatched_tokens",
    )

    def __init__(self) -> None:
        self.tokens = 0
        self.frames = 0
        self.reasoning_tokens = 0
        self.items: Counter[str] = Counter()
        self.tokens_by_channel: Counter[str] = Counter()
        self.content_tokens: Counter[str] = Counter()
        self.chars: Counter[str] = Counter()
        self.emitted_events: Counter[str] = Counter()
        self.per_token_deltas: Counter[str] = Counter()
        # Texts compared as (CRC-32, length) of their UTF-8, fed incrementally: the unpatched
        # stream's deltas need not be kept (one small string per token would be).
        self.own_text = {REASONING_CHANNEL: _Digest(), FINAL_CHANNEL: _Digest()}
        self.unpatched_events: Counter[str] = Counter()
        self.unpatched_chars: Counter[str] = Counter()
        self.unpatched_tokens: Counter[str] = Counter()
        self.unpatched_text = {REASONING_CHANNEL: _Digest(), FINAL_CHANNEL: _Digest()}

    def emitted(self, event_type: str) -> None:
        self.emitted_events[event_type] += 1

    def closed(self, item: OpenItem) -> None:
        channel = item.channel
        text = item.text
        self.items[item.kind] += 1
        self.tokens_by_channel[channel] += item.tokens
        self.content_tokens[channel] += item.text_tokens  # one part per token that gave text
        self.chars[channel] += len(text)
        delta_type = ev.DELTA_TYPE.get(item.kind)
        if delta_type is not None:
            self.per_token_deltas[delta_type] += item.text_tokens
        if channel == REASONING_CHANNEL:
            self.reasoning_tokens += item.tokens
            self.own_text[channel].add(text)
        elif channel == FINAL_CHANNEL:
            self.own_text[channel].add(text)

    def unpatched(self, events: Iterable[ev.Event]) -> None:
        """Count events of the unpatched stream (the full model's, `unpatched/emitter.py`)."""
        for event in events:
            kind = event["type"]
            if kind in _UNPATCHED_DELTA_CHANNEL:
                self.unpatched_delta(kind, event["delta"])
            else:
                self.unpatched_events[kind] += 1

    def unpatched_kinds(self, kinds: Iterable[str]) -> None:
        """Count events of the unpatched stream that carry no text (by type, `recovery.py`)."""
        events = self.unpatched_events
        for kind in kinds:
            events[kind] += 1

    def unpatched_delta(self, kind: str, text: str) -> None:
        """Count one text delta of the unpatched stream (one per output: one token's text)."""
        channel = _UNPATCHED_DELTA_CHANNEL[kind]
        self.unpatched_events[kind] += 1
        self.unpatched_chars[channel] += len(text)
        self.unpatched_tokens[channel] += 1
        self.unpatched_text[channel].add(text)

    def record(
        self,
        *,
        status: str,
        finish_reason: str | None,
        output: Sequence[object],
        malformed: Mapping[str, int],
        compared: bool,
    ) -> RepairRecord:
        del output  # the tally already holds what it needs of the items
        base: dict[str, Any] = {
            "status": status,
            "finish_reason": finish_reason,
            "output_tokens": self.tokens,
            "frames": self.frames,
            "reasoning_tokens": self.reasoning_tokens,
            "items": dict(self.items),
            "tokens": dict(self.tokens_by_channel),
            "content_tokens": dict(self.content_tokens),
            "chars": dict(self.chars),
            "events": dict(self.emitted_events),
            "malformed": dict(malformed),
        }
        if not compared:
            return RepairRecord(**base)
        repaired = self.emitted_events.copy()
        for delta_type, count in self.per_token_deltas.items():
            repaired[delta_type] = count  # counted at one delta per token
        kinds = set(repaired) | set(self.unpatched_events)
        recovered_events = {
            kind: max(0, repaired[kind] - self.unpatched_events[kind]) for kind in sorted(kinds)
        }
        differs = self.unpatched_text != self.own_text
        return RepairRecord(
            **base,
            compared=True,
            recovered_events=recovered_events,
            recovered_chars={
                ch: max(0, self.chars[ch] - self.unpatched_chars[ch]) for ch in CHANNELS
            },
            recovered_tokens={
                ch: max(0, self.content_tokens[ch] - self.unpatched_tokens[ch]) for ch in CHANNELS
            },
            unpatched_text_differs=differs,
        )
