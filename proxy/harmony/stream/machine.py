"""The per-token state machine of the repair core: tokens → messages → items → events.

`ResponseStream` (repair.py) owns the response's lifecycle and its terminal events; this base
class owns what happens per token: every token goes through the Harmony parser, message
boundaries are read from the token ids (the states mirror the parser's, see repair.py), a
completed header opens an item (`items.classify`), content becomes its deltas, an end token
closes it. Malformed output is expected input: counted and survived here, never raised; where our
parse departs from upstream's, the recovery accounting is told (`_departed`). When the request
constrains the output (constraint.py), each completed header and each final answer's end is
checked; the first violation is kept and raises `Violated`, which stops the frame (repair.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from enum import Enum

from openai_harmony import HarmonyError, Role

from proxy.harmony import tokens as tk
from proxy.harmony.constraint import ConstraintCheck, Violation
from proxy.harmony.response import IdFactory, ResponseContext
from proxy.harmony.stream import events as ev
from proxy.harmony.stream.items import FINAL_CHANNEL, KeptItem, OpenItem, classify, kept
from proxy.harmony.stream.logprobs import Logprobs
from proxy.harmony.stream.parser import HarmonyParser
from proxy.harmony.stream.record import Tally
from proxy.harmony.stream.recovery import RecoveryAccounting


class Parse(Enum):
    HEADER = "header"
    CONTENT = "content"
    SKIP = "skip"  # content of a message we do not surface (not from the assistant)
    EXPECT_START = "expect_start"


HEADER, CONTENT, SKIP, EXPECT_START = Parse  # locals for the per-token loop

_STATE_ERRORS = {
    HEADER: "invalid_header",
    CONTENT: "invalid_content_token",
    SKIP: "invalid_content_token",
    EXPECT_START: "token_outside_message",
}


class Violated(Exception):
    """The output broke the request's constraint: parsing stops at this token (`_violation`)."""


class TokenMachine:
    """Tokens to events for `ResponseStream`, which sets up the state declared here."""

    _ctx: ResponseContext
    _ids: IdFactory
    _parser: HarmonyParser
    _log: ev.EventLog
    _parse: Parse
    _open: OpenItem | None
    _output: list[ev.Item | KeptItem]  # the closed items, as kept (items.py `kept`)
    #: The last of them as closed in this frame (or end): its done events hold it anyway, and
    #: a terminal snapshot lists it as it is instead of a decoded copy (None: none this frame).
    _closed: ev.Item | None
    _message_tokens: int  # tokens of the message being parsed, header included
    _tally: Tally
    _malformed: Counter[str]
    _recovery: RecoveryAccounting | None
    #: Logprobs: None unless asked; then the frame's values, aligned with its ids,
    #: and the position in the frame of the token `_token` is given.
    _logprobs: Logprobs | None
    _values: Sequence[float]
    _top: Sequence[Mapping[str, float] | None] | None
    _position: int
    #: The after-the-fact check of the request's constraint (None: it has none), and what broke
    #: it first.
    _check: ConstraintCheck | None
    _violation: Violation | None

    def _token(self, token: int) -> None:
        parse = self._parse
        self._tally.tokens += 1
        self._message_tokens += 1
        if parse is CONTENT:
            item = self._open
            assert item is not None  # CONTENT always has an open item
            if token in tk.MESSAGE_ENDS:
                self._feed_parser(token)
                self._close(item, "completed")
                self._parse = EXPECT_START
                if self._recovery is not None:
                    self._recovery.closed()
                return
            if token == tk.START:
                # The model began a new message without ending this one. The parser would take
                # `<|start|>assistant<|channel|>final…` as text of this item and the answer
                # would vanish into it; end the item for it instead, and carry on.
                self._departed("missing_end")  # upstream's parser takes it as text
                self._feed_parser(tk.END)
                self._message_tokens -= 1  # the <|start|> belongs to the next message
                self._close(item, "completed")
                self._parse = EXPECT_START
                self._tally.tokens -= 1  # counted again by the call below
                self._token(token)
                return
            if self._feed_parser(token):
                delta = self._parser.last_content_delta
                if item.logprobs is not None:
                    self._entry(item, token, self._position)
                    item.held = 0 if delta else item.held + 1
                if delta:
                    item.add(delta)
                    if not self._ctx.coalesce_deltas:
                        self._flush(item)
            return
        if parse is EXPECT_START:
            if token != tk.START:
                # The parser would reject it ("expecting start token"); skip the exception.
                self._departed("token_outside_message")
                return
            self._message_tokens = 1
            self._feed_parser(token)  # <|start|> is what the parser waits for: accepted
            self._parse = HEADER
            return
        if parse is SKIP:
            self._feed_parser(token)
            if token in tk.MESSAGE_ENDS:
                self._parse = EXPECT_START
                if self._recovery is not None:
                    self._recovery.closed()
            return
        # HEADER
        accepted = self._feed_parser(token)
        if token == tk.MESSAGE:
            if accepted:
                self._open_item()
            else:
                # A rejected header leaves the parser waiting for <|start|> (its content is
                # lost to the parser as well; nothing of it reached the client).
                self._parse = EXPECT_START

    def _text(self, token_ids: Sequence[int], position: int) -> int:
        """The open item's plain text tokens from `position` on, in one call: the hot path, most
        tokens of a response, so one parser call per run of text. Returns the position of the
        first token it leaves to `_token` (an end, <|start|>, a token the parser's fast path
        does not take), or the end."""
        item = self._open
        assert item is not None  # CONTENT always has an open item
        pending = item.pending
        before = len(pending)
        stop = self._parser.text(token_ids, position, pending)
        count = stop - position
        self._tally.tokens += count
        self._message_tokens += count
        item.text_tokens += len(pending) - before
        if item.logprobs is not None and stop > position:
            self._run_entries(item, token_ids, position, stop)
        return stop

    def _entry(self, item: OpenItem, token: int, position: int) -> None:
        assert self._logprobs is not None
        assert item.logprobs is not None
        top = self._top
        item.logprobs.append(
            self._logprobs.entry(
                token, self._values[position], None if top is None else top[position]
            )
        )

    def _run_entries(
        self, item: OpenItem, token_ids: Sequence[int], position: int, stop: int
    ) -> None:
        """The entries of a run `_text` took, and how many of its last tokens are held: those
        whose bytes all lie in the parser's incomplete character (at most 3 bytes)."""
        for at in range(position, stop):
            self._entry(item, token_ids[at], at)
        held = self._parser.held_bytes
        if not held:
            item.held = 0
            return
        assert self._logprobs is not None
        count, size = 0, 0
        for at in range(stop - 1, position - 1, -1):
            size += self._logprobs.size(token_ids[at])
            if size > held:  # some of its bytes are out: it went with that delta
                item.held = count
                return
            count += 1
        item.held += count  # the whole run is held, after the tokens held before it

    def _feed_parser(self, token: int) -> bool:
        try:
            self._parser.process(token)
        except HarmonyError:
            self._departed(_STATE_ERRORS[self._parse])
            return False
        except OverflowError:  # a token id that is no u32: not from this model
            self._departed("invalid_token_id")
            return False
        return True

    def _departed(self, malformed: str) -> None:
        """Malformed output where our parse departs from upstream's: counted, and the recovery
        accounting can no longer read upstream's parse from ours (recovery.py)."""
        self._malformed[malformed] += 1
        if self._recovery is not None:
            self._recovery.diverged()

    def _open_item(self) -> None:
        parser = self._parser
        role = parser.current_role
        channel, recipient = parser.current_channel, parser.current_recipient
        if self._recovery is not None:
            self._recovery.header(role is Role.ASSISTANT, channel, recipient)
        if role is not Role.ASSISTANT:
            # A hallucinated user/tool turn: never shown, like a stray header.
            self._malformed["unexpected_role"] += 1
            self._parse = SKIP
            return
        if self._check is not None:
            self._checked(self._check.header(channel, recipient))
        item = classify(
            channel=channel,
            recipient=recipient,
            namespaces=self._ctx.namespaces,
            output_index=len(self._output),
            ids=self._ids,
            seal=self._ctx.seal,
            logprobs=self._logprobs is not None,
        )
        item.tokens = self._message_tokens
        self._open = item
        self._parse = CONTENT
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
        self._output.append(kept(item.done_item, item.utf8))  # flushed: utf8 is its text
        self._closed = item.done_item
        self._tally.closed(item)
        self._open = None
        check = self._check
        if check is not None and status == "completed" and item.channel == FINAL_CHANNEL:
            self._checked(check.final(item.text))

    def _checked(self, violation: Violation | None) -> None:
        """Keep the first violation and stop parsing (`Violated`); nothing is open then."""
        if violation is not None:
            self._violation = violation
            self._parse = EXPECT_START
            raise Violated(violation.message)

    def _emit(self, event: ev.Event) -> None:
        self._log.add(event)
        self._tally.emitted(event["type"])
