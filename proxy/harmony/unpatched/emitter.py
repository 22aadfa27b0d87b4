"""What an unpatched trtllm-serve `/v1/responses` stream sends for gpt-oss, defect and all.

Theory of operation
-------------------
This is a model of TensorRT-LLM's Harmony Responses path as recorded in
`tests/fixtures/trtllm-oracle/` (manifest: `responses_utils.py` with the Harmony streaming that
matches the published defect, `harmony_adapter.py` 38134b1, `postprocess_handlers.py` 01bf192,
openai 3.57.0). Upstream handles each engine output (`token_ids_diff`) like this:

1. `HarmonyStreamState.process_token_batch_to_messages` feeds the new ids, one by one, to the
   request's `StreamableParser(role=assistant)`. The first id the parser rejects ends the batch:
   the rest of the output is never parsed and the adapter returns `[]` instead of
   `parser.messages` (`stateful_stream_harmony_tokens_to_openai_messages` catches HarmonyError,
   UnicodeDecodeError and ValueError).
2. `_generate_streaming_event_harmony` then reads `parser.state` once. If it is EXPECT_START (the
   output's last parsed id closed a message, or nothing reopened one since) the output index is
   incremented *first*, the "item added" flag is cleared, and when the adapter returned messages
   the last one is closed: analysis → `reasoning_text.done` + `output_item.done` (never
   `content_part.done`); final → `output_text.done` + `content_part.done` + `output_item.done`;
   a message with a recipient (tool call) or on another channel (preamble) → nothing. So every
   done event carries an `output_index` one too high, and an output with no new ids after a
   message end repeats the done events, one index higher each time.
3. Then it reads `parser.last_content_delta` — the delta of the *last* id only — and, when it is
   truthy and the current message has no recipient, sends it as a text delta (final channel) or
   a reasoning delta (analysis channel), preceded by `output_item.added` +
   `content_part.added` when the flag is clear. An output with no new ids repeats the previous
   delta, because the parser still holds it.
4. `_send_event` numbers every event 0, 1, 2, …; `item_id` / item `id` is always `""` and
   `content_index` always 0 (the helper's tracker is never updated). With postprocess workers
   the two opening events come from the server process and the rest from the worker's copy of
   the processor, whose counter is still 0.
5. On the output that carries the finish, `responses_api_streaming_post_processor` appends
   `response.completed`, rebuilt by the non-streaming builder from *all* token ids
   (`unpatched/output.py`) with status `finish_reason_mapping(finish_reason)`: stop →
   completed, length → incomplete (no done events, `incomplete_details` null), timeout →
   failed, cancelled → cancelled, anything else → RuntimeError. `usage` is always null.
   If that builder raises, the post-processor call raises: the events of that last output and
   the terminal event are never sent and the HTTP stream breaks (`aborted`, `unsent_events`).

Upstream reads `parser.state` and `parser.messages` on every output; both re-serialise the whole
parser (O(n) per output, O(n²) per response). This model reads neither. It tracks the parser's
state from the ids it feeds (rules in `_parse`, from openai-harmony's `StreamableParser`), keeps
each message as it closes (role, channel and recipient read once from the cheap `current_*`
properties, text decoded from its content ids), and reads `last_content_delta` once per output.
Work per id is one `process` call and a few comparisons. The closing snapshot is built from the
kept messages, which is what upstream's re-parse of all ids gives whenever that re-parse can
succeed; when it cannot, the ids are parsed again for upstream's exact error.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, Final

from openai_harmony import HarmonyEncoding, HarmonyError, Role, StreamableParser, StreamState

from proxy.harmony.response import IdFactory, ResponseContext, response_object
from proxy.harmony.tokens import MESSAGE, MESSAGE_ENDS
from proxy.harmony.unpatched.output import (
    ParsedMessage,
    UpstreamOutputError,
    message_item,
    output_items,
    reasoning_item,
    reasoning_part,
    text_part,
    unpatched_output,
)

#: The parser states, as `parser.state` would report them.
_EXPECT_START: Final = StreamState.EXPECT_START
_HEADER: Final = StreamState.HEADER
_CONTENT: Final = StreamState.CONTENT

#: What upstream's adapter catches around the parser; anything else kills the stream.
_ADAPTER_ERRORS: Final = (HarmonyError, UnicodeDecodeError, ValueError)

#: `finish_reason_mapping`; any other finish reason raises RuntimeError upstream.
FINISH_STATUS: Final = {
    "stop": "completed",
    "length": "incomplete",
    "timeout": "failed",
    "cancelled": "cancelled",
}

# The event types of step 2 and 3, by the channel of the message they are about; shared with the
# recovery accounting (`stream/recovery.py`), which counts them without building the events.
#: The delta of the last id, by the current message's channel; other channels stream nothing.
DELTA_TYPES: Final = {
    "final": "response.output_text.delta",
    "analysis": "response.reasoning_text.delta",
}
#: What `start()` sends (`get_initial_responses`), and the terminal event of `finish()`.
START_TYPES: Final = ("response.created", "response.in_progress")
COMPLETED_TYPE: Final = "response.completed"
#: What goes before a delta when the "item added" flag is clear.
ADDED_TYPES: Final = ("response.output_item.added", "response.content_part.added")
#: The done events of the last closed message, by its channel; other channels get none.
DONE_TYPES: Final = {
    "analysis": ("response.reasoning_text.done", "response.output_item.done"),
    "final": (
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ),
}


class UnpatchedStream:
    """What an unpatched trtllm-serve /v1/responses stream sends for these engine outputs.

    `start()`, then `feed()` once per engine output (empty outputs included), then `finish()`.
    Malformed ids never raise; a stream upstream would have broken is reported in `aborted`
    (its error message) and `unsent_events` (how many of the last events returned were never
    sent, because upstream lost the whole last output).
    """

    def __init__(
        self,
        encoding: HarmonyEncoding,
        ctx: ResponseContext,
        ids: IdFactory,
        *,
        postprocess_workers: bool = False,
    ) -> None:
        self._encoding = encoding
        self._ctx = ctx
        self._ids = ids
        self._workers = postprocess_workers
        self._parser = StreamableParser(encoding, role=Role.ASSISTANT)
        # Given a role, the parser starts inside the first message's header.
        self._state = _HEADER
        # Ids as 4-byte machine words: a Python list of ints costs ~36 bytes per id, and a
        # proxy holds these for every open stream.
        self._content = array("I")  # content ids of the open message
        self._messages: list[ParsedMessage] = []  # parser.messages, kept as they close
        self._rejected = False  # the parser rejected an id at some point
        self._tokens = array("I")  # final_res.outputs[0].token_ids
        self._seq = 0
        self._output_index = 0
        self._item_added = False
        self._phase = "new"
        self._last_feed_events = 0
        self.aborted: str | None = None
        self.unsent_events = 0

    def start(self) -> list[dict[str, Any]]:
        """`response.created` and `response.in_progress` (`get_initial_responses`)."""
        self._advance("new", "started")
        snapshot = response_object(self._ctx, status="in_progress", output=[], usage=None)
        events = [self._event(type_, response=snapshot) for type_ in START_TYPES]
        if self._workers:
            self._seq = 0  # the worker's copy of the processor numbers from 0 again
        return events

    def feed(self, token_ids: Sequence[int]) -> list[dict[str, Any]]:
        """The events upstream sends for one engine output (`process_single_output`)."""
        self._advance("started", "started")
        if self.aborted is not None:
            return []
        try:
            self._tokens.extend(token_ids)
            rejected = self._parse(token_ids)
            events = self._emit(rejected)
        except (OverflowError, HarmonyError) as exc:
            # An id that is no u32 (OverflowError) is not among the errors the adapter catches:
            # process_single_output raises and the stream breaks.
            self.aborted = str(exc)
            return []
        self._last_feed_events = len(events)
        return events

    def finish(self, finish_reason: str | None, stop_reason: int | None) -> list[dict[str, Any]]:
        """What upstream sends after the output that carried the finish: `response.completed`.

        `stop_reason` does not matter upstream: the snapshot is rebuilt from the ids it got.
        """
        self._advance("started", "finished")
        if self.aborted is not None:
            return []
        try:
            output = self._snapshot_output()
            status = FINISH_STATUS.get(finish_reason or "")
            if status is None:
                raise UpstreamOutputError("Should never reach here!")
        except UpstreamOutputError as exc:
            self.aborted = str(exc)
            self.unsent_events = self._last_feed_events
            return []
        snapshot = response_object(self._ctx, status=status, output=output, usage=None)
        return [self._event(COMPLETED_TYPE, response=snapshot)]

    def _snapshot_output(self) -> list[dict[str, Any]]:
        """`unpatched_output(all ids)`, from the messages already parsed when that is exact."""
        if self._rejected or self._state is _HEADER:
            # Upstream's parse fails on these ids; parse them again for its exact error.
            return unpatched_output(self._encoding, self._tokens, self._ids)
        messages = self._messages
        if self._state is _CONTENT:  # the end of the ids closes the open message
            messages = [*messages, self._message(self._content)]
        return output_items(messages, self._ids)

    # -- parsing ---------------------------------------------------------------------------

    def _parse(self, token_ids: Sequence[int]) -> bool:
        """Feed the parser like the adapter does; True when it rejected an id (batch cut short).

        State rules of openai-harmony's StreamableParser: EXPECT_START accepts only <|start|>
        (anything else is rejected, state kept); HEADER collects ids until <|message|>, whose
        header parse either opens CONTENT or fails and leaves EXPECT_START; CONTENT collects
        ids until <|end|>/<|call|>/<|return|> closes the message (→ EXPECT_START).
        """
        process = self._parser.process
        for token in token_ids:
            state = self._state
            try:
                if state is not _CONTENT:
                    process(token)
                    if state is _EXPECT_START:  # it accepted <|start|>
                        self._state = _HEADER
                    elif token == MESSAGE:
                        self._state = _CONTENT
                        self._content = array("I")
                elif token not in MESSAGE_ENDS:
                    process(token)
                    self._content.append(token)
                else:
                    message = self._message(self._content)  # read before the parser resets
                    process(token)
                    self._messages.append(message)
                    self._state = _EXPECT_START
            except _ADAPTER_ERRORS:
                if state is _HEADER:
                    self._state = _EXPECT_START  # the header was rejected
                self._rejected = True
                return True
        return False

    def _message(self, content: Sequence[int]) -> ParsedMessage:
        """The open message as the parser will close it (one read per message)."""
        parser = self._parser
        assistant = parser.current_role == Role.ASSISTANT
        channel, recipient = parser.current_channel, parser.current_recipient
        return ParsedMessage(assistant, channel, recipient, self._decode(content))

    def _decode(self, content: Sequence[int]) -> str:
        """The text the parser gives a closed message (lossy UTF-8 of its content ids)."""
        try:
            return self._encoding.decode(content)
        except HarmonyError:
            # An id outside the vocab: the parser keeps the text before it, then U+FFFD.
            for end, token in enumerate(content):
                try:
                    self._encoding.decode([token])
                except HarmonyError:
                    return self._encoding.decode(content[:end]) + "\ufffd"
            raise  # pragma: no cover - decode failed, but no single id does

    # -- events ----------------------------------------------------------------------------

    def _emit(self, rejected: bool) -> list[dict[str, Any]]:
        """`_generate_streaming_event_harmony` for one output, after the ids were parsed."""
        events: list[dict[str, Any]] = []
        if self._state is _EXPECT_START:
            self._output_index += 1  # before the done events: they carry the next index
            self._item_added = False
            if not rejected and self._messages and self._messages[-1].recipient is None:
                events += self._done_events(self._messages[-1])
        parser = self._parser
        delta = parser.last_content_delta
        if not delta or parser.current_recipient is not None:
            return events
        channel = parser.current_channel
        delta_type = DELTA_TYPES.get(channel or "")
        if delta_type is None:
            return events
        final = channel == "final"
        if not self._item_added:
            if final:
                events += self._added_events(message_item("in_progress", []), text_part("", []))
            else:
                events += self._added_events(
                    reasoning_item("in_progress", None), reasoning_part("")
                )
        events.append(self._delta(delta_type, delta, logprobs=final))
        return events

    def _added_events(self, item: dict[str, Any], part: dict[str, Any]) -> list[dict[str, Any]]:
        self._item_added = True
        added, part_added = ADDED_TYPES
        return [
            self._event(added, item=item, output_index=self._output_index),
            self._event(part_added, **self._at(), part=part),
        ]

    def _done_events(self, closed: ParsedMessage) -> list[dict[str, Any]]:
        text, index = closed.text, self._output_index
        if closed.channel == "analysis":
            item = reasoning_item("completed", [reasoning_part(text)])
            return [
                self._event("response.reasoning_text.done", **self._at(), text=text),
                self._event("response.output_item.done", item=item, output_index=index),
            ]
        if closed.channel == "final":
            item = message_item("completed", [text_part(text, None)])
            return [
                self._event("response.output_text.done", **self._at(), text=text, logprobs=[]),
                self._event("response.content_part.done", **self._at(), part=text_part(text, None)),
                self._event("response.output_item.done", item=item, output_index=index),
            ]
        return []  # a preamble (commentary without recipient): closed, never announced

    def _delta(self, type_: str, delta: str, *, logprobs: bool) -> dict[str, Any]:
        """A delta event, built in key order (the hot path: one per output)."""
        event: dict[str, Any] = {"content_index": 0, "delta": delta, "item_id": ""}
        if logprobs:
            event["logprobs"] = []
        event.update(output_index=self._output_index, sequence_number=self._seq, type=type_)
        self._seq += 1
        return event

    def _at(self) -> dict[str, Any]:
        return {"content_index": 0, "item_id": "", "output_index": self._output_index}

    def _event(self, type_: str, **fields: Any) -> dict[str, Any]:
        # openai's event models declare their fields in alphabetical order.
        fields.update(sequence_number=self._seq, type=type_)
        self._seq += 1
        return dict(sorted(fields.items()))

    def _advance(self, expected: str, to: str) -> None:
        if self._phase != expected:
            raise RuntimeError(f"UnpatchedStream is {self._phase}, expected {expected}")
        self._phase = to
