"""The recovery accounting: what the unpatched upstream would have sent for the frames the core
parsed, counted from the core's own parse.

Theory of operation
-------------------
Upstream's emitter (`unpatched/emitter.py`, steps 1-3) feeds each engine output, id by id, to a
`StreamableParser` and then reads, once per output: whether the parser waits for `<|start|>`,
the channel and recipient of the last message it closed, and `last_content_delta` with the
current channel and recipient. The core feeds the very same ids, one by one, to a parser of its
own (`parser.HarmonyParser`, which answers as openai-harmony's does). As long as both parsers
saw the same ids the two are in the same state after every frame,
so this accounting reads those values from the core's parser (one to three property reads per
frame) and from the headers the core reads anyway — no second parser, no work per token:

    core parses frame ──▶ frame(ids, parser, expect_start) ──▶ (expect_start, done channel,
                                                              delta type, delta) kept
    account() (after the frame's events are sent) ──▶ the events upstream would have sent,
                                                     counted into the `Tally`

The two parsers part ways only where the core does not feed the parser what upstream's gets,
all of them malformed output: the parser rejects an id (upstream drops the rest of that output,
the core only that id), an id outside a message (the core skips it, upstream's parser rejects
it), a `<|start|>` inside content (the core ends the message, upstream's parser takes it as
text), an id that is no u32 (upstream's stream breaks). The core reports each with
`diverged()`; from then on the full model (`UnpatchedStream`) takes over: it is made, replays
the frames before and runs on every later frame, as the whole accounting did before. Until
then every id of every frame went to the parser, which logs them as 4-byte words for its own
replay: the frames' ids are read from that log (`HarmonyParser.share_log`), the first `_count`
of them, cut by the frames' sizes, not kept a second time.

`response.completed` is rebuilt upstream from all ids by a builder that may raise; whether it
does depends on the message headers alone except for browser calls (`unpatched_output.may_fail`),
and when the ids end inside a header. Only then are the logged ids parsed again, once, at the end.
Equality with the full model on every recorded stream and on random token streams is tested
(`tests/test_recovery.py`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from openai_harmony import HarmonyEncoding, HarmonyError

from proxy.harmony.response import ResponseContext, random_id
from proxy.harmony.stream.parser import HarmonyParser
from proxy.harmony.stream.record import Tally
from proxy.harmony.unpatched.emitter import (
    ADDED_TYPES,
    COMPLETED_TYPE,
    DELTA_TYPES,
    DONE_TYPES,
    FINISH_STATUS,
    START_TYPES,
    UnpatchedStream,
)
from proxy.harmony.unpatched.output import UpstreamOutputError, may_fail, unpatched_output

#: What one frame left for the emitter: (the parser waits for <|start|>, the done events'
#: channel, the delta's event type, the delta).
_Frame = tuple[bool, str | None, str | None, str | None]


class RecoveryAccounting:
    """Counts the unpatched upstream's events for the core's frames into a `Tally`.

    The core calls `start()`; `header()` at each accepted `<|message|>`, `closed()` at each
    accepted message end and `diverged()` where it fed its parser something upstream's would not
    have seen; `frame()` at the end of each `feed`; `finish()` on a normal finish; and
    `account()` whenever the counts must be up to date. `derive=False` runs the full model from
    the first frame (a second parser per token: the reference the derived counts are tested
    against, and a benchmark row).
    """

    __slots__ = (
        "_count",
        "_ctx",
        "_diverged",
        "_encoding",
        "_end",
        "_frames",
        "_full",
        "_full_frames",
        "_item_added",
        "_last_done",
        "_may_fail",
        "_open_done",
        "_parser",
        "_sizes",
        "_tally",
    )

    def __init__(
        self,
        encoding: HarmonyEncoding,
        ctx: ResponseContext,
        tally: Tally,
        parser: HarmonyParser,
        *,
        derive: bool = True,
    ) -> None:
        self._encoding = encoding
        self._ctx = ctx
        self._tally = tally
        self._parser = parser  # the core's: its log holds the frames' ids until a divergence
        parser.share_log(derive)
        self._full: UnpatchedStream | None = None
        self._diverged = not derive
        self._count = 0  # ids of the frames so far: the parser's log's first, until diverged
        self._sizes = array("I")  # ids per frame
        self._frames: list[_Frame] = []  # derived, not yet counted
        self._full_frames: list[Sequence[int]] = []  # for the full model, not yet fed
        self._open_done: str | None = None  # done channel of the open message (see closed())
        self._last_done: str | None = None  # … of the last closed message
        self._may_fail = False  # upstream's builder may raise on a message seen so far
        self._item_added = False
        self._end: tuple[str, int | None, bool] | None = None

    @property
    def full_model_used(self) -> bool:
        """Whether the full model had to run (the parses parted ways, or `derive=False`)."""
        return self._diverged

    # -- what the core reports -------------------------------------------------------------

    def start(self) -> None:
        self._tally.unpatched_kinds(START_TYPES)

    def header(self, assistant: bool, channel: str | None, recipient: str | None) -> None:
        """A message header the parser accepted (any role)."""
        # Upstream closes the last message with done events when it has no recipient, by its
        # channel and whatever its role (unpatched/emitter.py step 2).
        self._open_done = channel if recipient is None and channel in DONE_TYPES else None
        if may_fail(assistant, channel, recipient):
            self._may_fail = True

    def closed(self) -> None:
        """The open message ended (its end token was accepted)."""
        self._last_done = self._open_done

    def diverged(self) -> None:
        """The core's parser and upstream's part ways in the frame being fed."""
        self._diverged = True

    def frame(self, token_ids: Sequence[int], expect_start: bool) -> None:
        """The core parsed `token_ids` (one frame), every one through its parser unless it
        reported a divergence; `expect_start`: it waits for <|start|>."""
        if not self._diverged:
            parser = self._parser
            try:
                delta = parser.last_content_delta
                delta_type = None
                if delta and parser.current_recipient is None:
                    delta_type = DELTA_TYPES.get(parser.current_channel or "")
            except HarmonyError:  # never seen; the full model would have broken the stream
                self._diverged = True
            else:
                size = len(token_ids)
                self._count += size
                self._sizes.append(size)
                done = self._last_done if expect_start else None
                self._frames.append((expect_start, done, delta_type, delta if delta_type else None))
                return
        self._full_frames.append(token_ids)  # a reference: callers keep frames as they are

    def finish(self, finish_reason: str, stop_reason: int | None, in_header: bool) -> None:
        """Normal end of the ids; `in_header`: they end inside a message header."""
        self._end = (finish_reason, stop_reason, in_header)

    # -- counting --------------------------------------------------------------------------

    def account(self) -> None:
        """Count what has been reported so far (cheap when it is up to date)."""
        tally = self._tally
        if self._frames:
            item_added = self._item_added
            for expect_start, done, delta_type, delta in self._frames:
                if expect_start:
                    item_added = False
                    if done is not None:
                        tally.unpatched_kinds(DONE_TYPES[done])
                if delta_type is not None and delta is not None:
                    if not item_added:
                        tally.unpatched_kinds(ADDED_TYPES)
                        item_added = True
                    tally.unpatched_delta(delta_type, delta)
            self._item_added = item_added
            self._frames.clear()
        if self._diverged:
            full = self._full or self._replay()
            for token_ids in self._full_frames:
                tally.unpatched(full.feed(token_ids))
            self._full_frames.clear()
        end, self._end = self._end, None
        if end is None:
            return
        finish_reason, stop_reason, in_header = end
        if self._full is not None:
            tally.unpatched(self._full.finish(finish_reason, stop_reason))
        elif self._completes(finish_reason, in_header):
            tally.unpatched_kinds((COMPLETED_TYPE,))

    def _completes(self, finish_reason: str, in_header: bool) -> bool:
        """Whether upstream sends `response.completed` (its builder does not raise)."""
        if finish_reason not in FINISH_STATUS:
            return False
        if not (in_header or self._may_fail):
            return True
        try:
            unpatched_output(self._encoding, self._ids(), random_id)
        except UpstreamOutputError:
            return False
        return True

    def _replay(self) -> UnpatchedStream:
        """The full model, brought to where the derived accounting is (frame by frame)."""
        full = UnpatchedStream(self._encoding, self._ctx, random_id)
        full.start()  # counted by start()
        ids, position = self._ids(), 0
        for size in self._sizes:
            full.feed(ids[position : position + size])  # counted from the core's parse
            position += size
        self._sizes = array("I")
        self._parser.share_log(False)  # the full model keeps its own
        self._full = full
        return full

    def _ids(self) -> Sequence[int]:
        """The frames' ids before any divergence (the parser may have logged more since)."""
        log = self._parser.log
        return log if len(log) == self._count else log[: self._count]
