"""The repair core: gpt-oss token ids in, a correct Responses event stream out, at any chunking.

Theory of operation
-------------------
One `ResponseStream` per response. The shell calls `start()` once (`response.created`,
`response.in_progress`), `feed(ids)` for every upstream frame (any size, empty included), then
exactly one of `finish(finish_reason, stop_reason)` or `fail(code, message)`. Each call returns
the events to write, as plain dicts; `record()` returns what happened, as data.

Every token goes through `openai_harmony.StreamableParser` one at a time, so the parser's
grammar decides what is header and what is content. Message boundaries are read from the token
ids, never from `parser.state` (which re-serialises the parser, O(n) per read). We mirror the
parser's three states:

    HEADER ──<|message|>──▶ CONTENT ──<|end|>/<|call|>/<|return|>──▶ EXPECT_START
      ▲                                                                  │
      └──────────────────────────────<|start|>───────────────────────────┘

The first message starts in HEADER: upstream's prompt ends in `<|start|>assistant`.

At `<|message|>` the header is complete: channel, recipient and role are read once and the
message becomes an output item (contract rule 3: announced as soon as its header is complete):

    analysis, no recipient              → reasoning item (`reasoning_text` part)
    final / commentary, no recipient    → message (phase final_answer / commentary — a preamble)
    functions.NAME                      → function_call NAME
    NS.NAME, NS a declared namespace    → function_call NAME in namespace NS
    browser.search|open|find            → web_search_call (upstream's non-streaming item type)
    python, container.*, any other      → reasoning item (upstream's, where it does not fail)

Content tokens become deltas (`last_content_delta`: the parser holds back the bytes of a
multi-byte character until it is complete, so no delta carries a broken character). Within one
`feed` the deltas of an item are coalesced into one event unless `coalesce_deltas` is off. An
item's done text is the concatenation of its deltas, so they agree by construction (rule 5).

Malformed output is expected input (house-style principle 4). A token the parser rejects is
dropped and counted by kind in the record; a header the parser rejects leaves the parser waiting
for `<|start|>`, and we drop tokens until then without feeding them (no exception per token).
Nothing already parsed is lost, and every stream still ends with exactly one terminal event.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence
from enum import Enum
from typing import Any, cast

from openai_harmony import HarmonyEncoding, HarmonyError, Role, StreamableParser

from proxy.harmony import events as ev
from proxy.harmony import tokens as tk
from proxy.harmony.items import OpenItem, classify
from proxy.harmony.record import RepairRecord, Tally
from proxy.harmony.response import IdFactory, ResponseContext, random_id, response_object
from proxy.harmony.unpatched import UnpatchedStream

#: Stands for "not made yet" (see `warm_up`); typed as a parser so the hot path needs no check.
_NO_PARSER: StreamableParser = cast(StreamableParser, object())


class StreamStateError(RuntimeError):
    """The shell called the core out of order (our bug, never the model's): names state and call."""


class _Phase(Enum):
    NEW = "new"
    STREAMING = "streaming"
    ENDED = "ended"


class _Parse(Enum):
    HEADER = "header"
    CONTENT = "content"
    SKIP = "skip"  # content of a message we do not surface (not from the assistant)
    EXPECT_START = "expect_start"


_HEADER, _CONTENT, _SKIP, _EXPECT_START = _Parse  # locals for the per-token loop

#: Finish reasons that end a response normally; any other ends it as failed.
_LENGTH = "length"
_NORMAL_FINISHES = frozenset({"stop", _LENGTH})


class ResponseStream:
    """One response: token ids in (`feed`), Responses events out. See the module docstring."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        ctx: ResponseContext,
        ids: IdFactory = random_id,
        *,
        compare_unpatched: bool = True,
    ) -> None:
        self._ctx = ctx
        self._ids = ids
        self._encoding = encoding
        # Parsers cost ~170 µs each to make: `warm_up()` makes them, ideally while upstream is
        # thinking about the request (the shell schedules it); `feed` makes them if needed.
        self._parser: StreamableParser = _NO_PARSER
        self._log = ev.EventLog()
        self._phase = _Phase.NEW
        self._parse = _HEADER
        self._open: OpenItem | None = None
        self._output: list[ev.Item] = []
        self._message_tokens = 0  # tokens of the message being parsed, header included
        self._tally = Tally()
        self._malformed: Counter[str] = Counter()
        # The model of the unpatched upstream runs on the same chunks to account for what the
        # repair recovered (issue: "from it, the core reports what the unpatched stream lost").
        self._compare = compare_unpatched
        self._unpatched: UnpatchedStream | None = None
        # What it has not seen yet: fed by `account()`, which the shell calls after a frame's
        # events are written, so the comparison is never on the latency path.
        self._backlog: list[Sequence[int]] = []
        self._backlog_start = compare_unpatched
        self._backlog_end: tuple[str, int | None] | None = None
        self._status = "in_progress"
        self._finish_reason: str | None = None

    # -- public surface ------------------------------------------------------------------------

    def start(self) -> list[ev.Event]:
        """`response.created` and `response.in_progress`: send before the first token arrives."""
        self._require(_Phase.NEW, "start")
        self._phase = _Phase.STREAMING
        snapshot = self._snapshot()
        self._emit(ev.response_event("response.created", snapshot))
        self._emit(ev.response_event("response.in_progress", self._snapshot()))
        return self._log.take()

    def feed(self, token_ids: Sequence[int]) -> list[ev.Event]:
        """Parse one upstream frame's token ids; return the events they complete."""
        self._require(_Phase.STREAMING, "feed")
        if self._parser is _NO_PARSER:
            self.warm_up()
        self._tally.frames += 1
        for token in token_ids:
            self._token(token)
        if self._open is not None:
            self._flush(self._open)
        if self._compare:
            self._backlog.append(token_ids)  # a reference: callers pass frames they keep as is
        return self._log.take()

    def finish(
        self,
        finish_reason: str,
        stop_reason: int | str | None = None,
        *,
        output_tokens: int | None = None,
    ) -> list[ev.Event]:
        """End of generation: close what is open and send the one terminal event.

        Whether the stop token reached us or was cut from the ids does not matter: the open
        item is closed here either way (trtllm-serve.md §2: never depend on the terminator).
        `output_tokens` overrides our count with upstream's usage when the shell has it.
        """
        self._require(_Phase.STREAMING, "finish")
        self._finish_reason = finish_reason
        self._end_of_tokens()
        if finish_reason not in _NORMAL_FINISHES:
            return self._fail(
                "generation_ended",
                f"upstream ended generation with finish_reason {finish_reason!r}",
                output_tokens,
            )
        truncated = finish_reason == _LENGTH
        if self._open is not None:
            self._close(self._open, "incomplete" if truncated else "completed")
        if truncated:
            self._status = "incomplete"
            terminal = ev.response_event(
                "response.incomplete",
                self._snapshot(output_tokens, incomplete={"reason": "max_output_tokens"}),
            )
        else:
            self._status = "completed"
            terminal = ev.response_event("response.completed", self._snapshot(output_tokens))
        self._emit(terminal)
        if self._compare:
            self._backlog_end = (finish_reason, _as_int(stop_reason))
        self._phase = _Phase.ENDED
        return self._log.take()

    def fail(self, code: str, message: str) -> list[ev.Event]:
        """The stream cannot go on (upstream cut, bad frame, timeout, shutdown): close open items
        as incomplete, then `error` and `response.failed` (contract rule 8)."""
        self._require(_Phase.STREAMING, "fail")
        self._end_of_tokens()
        return self._fail(code, message, None)

    def cancel(self) -> list[ev.Event]:
        """The response was cancelled (`POST /v1/responses/{id}/cancel`, or its client went
        away): close open items as incomplete and end with `response.failed` carrying status
        `cancelled` — OpenAI's event set has no `response.cancelled` (issue 13)."""
        self._require(_Phase.STREAMING, "cancel")
        self._end_of_tokens()
        if self._open is not None:
            self._close(self._open, "incomplete")
        self._status = "cancelled"
        self._emit(ev.response_event("response.failed", self._snapshot()))
        self._phase = _Phase.ENDED
        return self._log.take()

    @property
    def ended(self) -> bool:
        return self._phase is _Phase.ENDED

    def warm_up(self) -> None:
        """Make the parsers now (idempotent): schedule it to overlap with upstream's latency."""
        if self._parser is _NO_PARSER:
            self._parser = StreamableParser(self._encoding, Role.ASSISTANT)
        if self._compare and self._unpatched is None:
            self._unpatched = UnpatchedStream(self._encoding, self._ctx, random_id)

    def account(self) -> None:
        """Bring the comparison with the unpatched upstream up to date (cheap when it is).

        The shell calls it after writing a frame's events; `record()` calls it too, so the
        accounting is complete whenever it is read.
        """
        if not self._compare:
            return
        self.warm_up()
        unpatched = self._unpatched
        assert unpatched is not None  # made by warm_up
        tally = self._tally
        if self._backlog_start:
            self._backlog_start = False
            tally.unpatched(unpatched.start())
        for chunk in self._backlog:
            tally.unpatched(unpatched.feed(chunk))
        self._backlog.clear()
        if self._backlog_end is not None:
            tally.unpatched(unpatched.finish(*self._backlog_end))
            self._backlog_end = None

    def record(self) -> RepairRecord:
        """What happened so far, as data for metrics and logs."""
        self.account()
        return self._tally.record(
            status=self._status,
            finish_reason=self._finish_reason,
            output=self._output,
            malformed=self._malformed,
            compared=self._compare,
        )

    # -- the per-token state machine -----------------------------------------------------------

    def _token(self, token: int) -> None:
        parse = self._parse
        self._tally.tokens += 1
        self._message_tokens += 1
        if parse is _CONTENT:
            item = self._open
            assert item is not None  # CONTENT always has an open item
            if token in tk.MESSAGE_ENDS:
                self._feed_parser(token)
                self._close(item, "completed")
                self._parse = _EXPECT_START
                return
            if token == tk.START:
                # The model began a new message without ending this one. The parser would take
                # `<|start|>assistant<|channel|>final…` as text of this item and the answer
                # would vanish into it; end the item for it instead, and carry on.
                self._malformed["missing_end"] += 1
                self._feed_parser(tk.END)
                self._message_tokens -= 1  # the <|start|> belongs to the next message
                self._close(item, "completed")
                self._parse = _EXPECT_START
                self._tally.tokens -= 1  # counted again by the call below
                self._token(token)
                return
            if self._feed_parser(token):
                delta = self._parser.last_content_delta
                if delta:
                    item.add(delta)
                    if not self._ctx.coalesce_deltas:
                        self._flush(item)
            return
        if parse is _EXPECT_START:
            if token != tk.START:
                # The parser would reject it ("expecting start token"); skip the exception.
                self._malformed["token_outside_message"] += 1
                return
            self._message_tokens = 1
            self._feed_parser(token)  # <|start|> is what the parser waits for: accepted
            self._parse = _HEADER
            return
        if parse is _SKIP:
            self._feed_parser(token)
            if token in tk.MESSAGE_ENDS:
                self._parse = _EXPECT_START
            return
        # HEADER
        accepted = self._feed_parser(token)
        if token == tk.MESSAGE:
            if accepted:
                self._open_item()
            else:
                # A rejected header leaves the parser waiting for <|start|> (its content is
                # lost to the parser as well; nothing of it reached the client).
                self._parse = _EXPECT_START

    def _feed_parser(self, token: int) -> bool:
        try:
            self._parser.process(token)
        except HarmonyError:
            self._malformed[_STATE_ERRORS[self._parse]] += 1
            return False
        except OverflowError:  # a token id that is no u32: not from this model
            self._malformed["invalid_token_id"] += 1
            return False
        return True

    def _open_item(self) -> None:
        parser = self._parser
        role = parser.current_role
        if role is not Role.ASSISTANT:
            # A hallucinated user/tool turn: never shown, like a stray header.
            self._malformed["unexpected_role"] += 1
            self._parse = _SKIP
            return
        item = classify(
            channel=parser.current_channel,
            recipient=parser.current_recipient,
            namespaces=self._ctx.namespaces,
            output_index=len(self._output),
            ids=self._ids,
            seal=self._ctx.seal,
        )
        item.tokens = self._message_tokens
        self._open = item
        self._parse = _CONTENT
        for event in item.opening_events():
            self._emit(event)

    def _flush(self, item: OpenItem) -> None:
        pending = item.take_pending()
        if pending:
            self._emit(item.delta_event(pending))

    def _close(self, item: OpenItem, status: str) -> None:
        self._flush(item)
        item.tokens = self._message_tokens
        for event in item.closing_events(status):
            self._emit(event)
        self._output.append(item.done_item)
        self._tally.closed(item)
        self._open = None

    def _end_of_tokens(self) -> None:
        if self._open is not None:
            self._flush(self._open)
        if self._parse is _HEADER and self._message_tokens and self._finish_reason != _LENGTH:
            self._malformed["incomplete_header"] += 1
        # EOS inside a header is the only case the parser rejects, and it is counted above.
        if self._parser is not _NO_PARSER:
            with contextlib.suppress(HarmonyError):
                self._parser.process_eos()

    def _fail(self, code: str, message: str, output_tokens: int | None) -> list[ev.Event]:
        if self._open is not None:
            self._close(self._open, "incomplete")
        self._status = "failed"
        self._emit(ev.error_event(code, message))
        # `response.error.code` is a closed set in openai-python's strict models; the specific
        # code travels in the `error` event, whose code is free-form.
        summary = "rate_limit_exceeded" if code == "rate_limit_exceeded" else "server_error"
        snapshot = self._snapshot(output_tokens, error={"code": summary, "message": message})
        self._emit(ev.response_event("response.failed", snapshot))
        self._phase = _Phase.ENDED
        return self._log.take()

    # -- helpers -------------------------------------------------------------------------------

    def _emit(self, event: ev.Event) -> None:
        self._log.add(event)
        self._tally.emitted(event["type"])

    def _snapshot(
        self,
        output_tokens: int | None = None,
        *,
        incomplete: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        ended = self._status != "in_progress"
        return response_object(
            self._ctx,
            status=self._status,
            output=list(self._output),
            usage=self._usage(output_tokens) if ended else None,
            error=error,
            incomplete_details=incomplete,
        )

    def _usage(self, output_tokens: int | None) -> dict[str, Any]:
        produced = self._tally.tokens if output_tokens is None else output_tokens
        input_tokens = self._ctx.input_tokens
        return {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": produced,
            "output_tokens_details": {"reasoning_tokens": self._tally.reasoning_tokens},
            "total_tokens": input_tokens + produced,
        }

    def _require(self, phase: _Phase, call: str) -> None:
        if self._phase is not phase:
            raise StreamStateError(f"{call}() called in phase {self._phase.value!r}")


_STATE_ERRORS = {
    _HEADER: "invalid_header",
    _CONTENT: "invalid_content_token",
    _SKIP: "invalid_content_token",
    _EXPECT_START: "token_outside_message",
}


def _as_int(value: int | str | None) -> int | None:
    return value if isinstance(value, int) else None
