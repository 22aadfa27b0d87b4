"""The repair core: gpt-oss token ids in, a correct Responses event stream out, at any chunking.

Theory of operation
-------------------
One `ResponseStream` per response. The shell calls `start()` once (`response.created`,
`response.in_progress`), `feed(ids)` for every upstream frame (any size, empty included), then
exactly one of `finish(finish_reason, stop_reason)` or `fail(code, message)`. Each call returns
the events to write, as plain dicts; `record()` returns what happened, as data.

Every token goes through a Harmony parser (`parser.HarmonyParser`: openai-harmony's
`StreamableParser` rules, fast on well-formed output, openai-harmony's own parser otherwise), so
its grammar decides what is header and what is content; runs of plain text go through in one
call. The per-token machine is `machine.TokenMachine`. Message boundaries are read from
the token ids, never from the parser's state (openai-harmony re-serialises its whole parser for
that, O(n) per read). We mirror the parser's three states:

    HEADER ──<|message|>──▶ CONTENT ──<|end|>/<|call|>/<|return|>──▶ EXPECT_START
      ▲                                                                  │
      └──────────────────────────────<|start|>───────────────────────────┘

The first message starts in HEADER: upstream's prompt ends in `<|start|>assistant`.

At `<|message|>` the header is complete: channel, recipient and role are read once and the
message becomes an output item (`items.classify`), announced there: before its first delta,
as soon as its header is complete.

Content tokens become deltas (`last_content_delta`: the parser holds back the bytes of a
multi-byte character until it is complete, so no delta carries a broken character). Within one
`feed` the deltas of an item are coalesced into one event unless `coalesce_deltas` is off. An
item's done text is the concatenation of its deltas, so they agree by construction.

A request that constrains the output (`tool_choice`, `text.format`; constraint.py) has it
checked as it is parsed: a header the constraint forbids is never announced, a final answer is
checked at its end, a required call at `finish`. At the first violation `feed` or `finish`
returns the events up to it and no more; `violation` then says what broke, and the shell must
end the response with `fail(...)` (it also closes the upstream request: nothing after the
violation is parsed). Until then `feed` and `finish` refuse to run.

Malformed output is expected input, never an exception. A token the parser rejects is
dropped and counted by kind in the record; a header the parser rejects leaves the parser waiting
for `<|start|>`, and we drop tokens until then without feeding them (no exception per token).
Nothing already parsed is lost, and every stream still ends with exactly one terminal event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from openai_harmony import HarmonyEncoding

from proxy.harmony.constraint import ConstraintCheck, Violation
from proxy.harmony.response import (
    IdFactory,
    ResponseContext,
    random_id,
    response_object,
    usage,
)
from proxy.harmony.stream import events as ev
from proxy.harmony.stream.items import KeptItem, OpenItem, shown
from proxy.harmony.stream.logprobs import Logprobs
from proxy.harmony.stream.machine import CONTENT, EXPECT_START, HEADER, TokenMachine, Violated
from proxy.harmony.stream.parser import HarmonyParser, TokenTable
from proxy.harmony.stream.record import RepairRecord, Tally
from proxy.harmony.stream.recovery import RecoveryAccounting


class StreamStateError(RuntimeError):
    """The shell called the core out of order (our bug, never the model's): names state and call."""


class _Phase(Enum):
    NEW = "new"
    STREAMING = "streaming"
    VIOLATED = "violated"  # the output broke its constraint: only fail() or cancel() now
    ENDED = "ended"


#: Finish reasons that end a response normally; any other ends it as failed.
_LENGTH = "length"
_NORMAL_FINISHES = frozenset({"stop", _LENGTH})


class ResponseStream(TokenMachine):
    """One response: token ids in (`feed`), Responses events out. See the module docstring."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        ctx: ResponseContext,
        ids: IdFactory = random_id,
        *,
        compare_unpatched: bool = True,
        derive_unpatched: bool = True,
        table: TokenTable | None = None,
    ) -> None:
        self._ctx = ctx
        self._ids = ids
        # Token bytes are best shared by all the streams of an app; the parser costs ~1 µs to
        # make (openai-harmony's ~170 µs, which is why the shell once made it ahead).
        table = table or TokenTable(encoding)
        self._parser = HarmonyParser(encoding, table)
        self._logprobs = None if ctx.top_logprobs is None else Logprobs(table, ctx.top_logprobs)
        self._values: Sequence[float] = ()
        self._top: Sequence[Mapping[str, float] | None] | None = None
        self._position = 0
        self._log = ev.EventLog()
        self._phase = _Phase.NEW
        self._parse = HEADER
        self._open: OpenItem | None = None
        self._output: list[ev.Item | KeptItem] = []
        self._closed: ev.Item | None = None
        self._message_tokens = 0  # tokens of the message being parsed, header included
        self._tally = Tally()
        self._malformed: Counter[str] = Counter()
        # What the unpatched upstream would have sent for the same frames, to account for what
        # the repair recovered, derived from this parse (recovery.py). The
        # counting runs in `account()`, which the shell calls after a frame's events are
        # written, so it is never on the latency path.
        self._compare = compare_unpatched
        self._recovery: RecoveryAccounting | None = None
        if compare_unpatched:
            self._recovery = RecoveryAccounting(
                encoding, ctx, self._tally, self._parser, derive=derive_unpatched
            )
        self._status = "in_progress"
        self._finish_reason: str | None = None
        self._check = None if ctx.constraint is None else ConstraintCheck(ctx.constraint)
        self._violation: Violation | None = None

    # -- public surface ------------------------------------------------------------------------

    def start(self) -> list[ev.Event]:
        """`response.created` and `response.in_progress`: send before the first token arrives."""
        self._require(_Phase.NEW, "start")
        self._phase = _Phase.STREAMING
        snapshot = self._snapshot()
        self._emit(ev.response_event("response.created", snapshot))
        self._emit(ev.response_event("response.in_progress", self._snapshot()))
        for item in self._ctx.leading:  # made before generation: whole at once
            self._emit(ev.item_added(len(self._output), item))
            self._emit(ev.item_done(len(self._output), item))
            self._output.append(item)
        if self._recovery is not None:
            self._recovery.start()
        return self._log.take()

    def feed(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        top_logprobs: Sequence[Mapping[str, float] | None] | None = None,
    ) -> list[ev.Event]:
        """Parse one upstream frame's token ids; return the events they complete.

        When the context asks for logprobs (`top_logprobs` not None), `logprobs` are
        upstream's values of the ids, one each, and `top_logprobs` its alternatives per id
        (None: none); without them here it is our misuse (`ValueError`): the shell fails the
        stream on a frame without them before it gets here.
        """
        self._require(_Phase.STREAMING, "feed")
        self._tally.frames += 1
        self._closed = None  # the last frame's events are on their way: kept items suffice
        fast = self._ctx.coalesce_deltas
        position, end = 0, len(token_ids)
        tracked = self._logprobs is not None
        if tracked:
            if logprobs is None or len(logprobs) != end:
                raise ValueError("feed() needs one logprob per token id when logprobs are on")
            if top_logprobs is not None and len(top_logprobs) != end:
                raise ValueError("feed() needs top_logprobs aligned with the token ids")
            self._values, self._top = logprobs, top_logprobs
        try:
            while position < end:
                if fast and self._parse is CONTENT:
                    position = self._text(token_ids, position)
                    if position == end:
                        break
                if tracked:
                    self._position = position
                self._token(token_ids[position])
                position += 1
        except Violated:
            self._phase = _Phase.VIOLATED
            token_ids = token_ids[: position + 1]  # what the parser saw
        if self._open is not None:
            self._flush(self._open)
        if self._recovery is not None:
            self._recovery.frame(token_ids, self._parse is EXPECT_START)
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
        item is closed here either way (whether upstream keeps `<|return|>` in the ids is not
        known, so nothing depends on seeing the terminator).
        `output_tokens` overrides our count with upstream's usage when the shell has it.
        """
        self._require(_Phase.STREAMING, "finish")
        self._finish_reason = finish_reason
        in_header = self._parse is HEADER  # before the parser sees the end of the ids
        self._end_of_tokens()
        if finish_reason not in _NORMAL_FINISHES:
            return self._fail(
                "generation_ended",
                f"upstream ended generation with finish_reason {finish_reason!r}",
                output_tokens,
            )
        truncated = finish_reason == _LENGTH
        try:
            if self._open is not None:
                self._close(self._open, "incomplete" if truncated else "completed")
            if self._check is not None:
                self._checked(self._check.end(finish_reason))
        except Violated:
            self._phase = _Phase.VIOLATED
            return self._log.take()
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
        if self._recovery is not None:
            self._recovery.finish(finish_reason, _as_int(stop_reason), in_header)
        self._phase = _Phase.ENDED
        return self._log.take()

    def fail(self, code: str, message: str) -> list[ev.Event]:
        """The stream cannot go on (upstream cut, bad frame, timeout, shutdown, the output broke
        its constraint): close open items as incomplete, then `error` and `response.failed`,
        the stream's one terminal event."""
        self._require(_Phase.STREAMING, "fail", _Phase.VIOLATED)
        self._end_of_tokens()
        return self._fail(code, message, None)

    def cancel(self) -> list[ev.Event]:
        """The response was cancelled (`POST /v1/responses/{id}/cancel`, or its client went
        away): close open items as incomplete and end with `response.failed` carrying status
        `cancelled` — OpenAI's event set has no `response.cancelled`."""
        self._require(_Phase.STREAMING, "cancel", _Phase.VIOLATED)
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

    @property
    def violation(self) -> Violation | None:
        """How the output broke the request's constraint (None: it has not); once set, the
        shell ends the response with `fail` (module doc)."""
        return self._violation

    @property
    def status(self) -> str:
        """The response's status so far (`in_progress` until the terminal event)."""
        return self._status

    @property
    def recovery(self) -> RecoveryAccounting | None:
        """The recovery accounting (None when the comparison is off); for tests and benches."""
        return self._recovery

    def account(self) -> None:
        """Bring the comparison with the unpatched upstream up to date (cheap when it is).

        The shell calls it after writing a frame's events; `record()` calls it too, so the
        accounting is complete whenever it is read.
        """
        if self._recovery is not None:
            self._recovery.account()

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

    def _end_of_tokens(self) -> None:
        if self._open is not None:
            self._flush(self._open)
        if self._parse is HEADER and self._message_tokens and self._finish_reason != _LENGTH:
            self._malformed["incomplete_header"] += 1
        # The parser is not told of the end (`process_eos`): nothing reads it afterwards, and
        # it costs ~75 µs for a 3,000-token answer.

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

    def _snapshot(
        self,
        output_tokens: int | None = None,
        *,
        incomplete: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        produced = self._tally.tokens if output_tokens is None else output_tokens
        closed = self._closed  # the last item, closed in this frame: listed as it is
        output = [shown(item) for item in (self._output if closed is None else self._output[:-1])]
        if closed is not None:
            output.append(closed)
        return response_object(
            self._ctx,
            status=self._status,
            output=output,
            usage=None
            if self._status == "in_progress"
            else usage(self._ctx.input_tokens, produced, self._tally.reasoning_tokens),
            error=error,
            incomplete_details=incomplete,
        )

    def _require(self, phase: _Phase, call: str, also: _Phase | None = None) -> None:
        if self._phase is not phase and self._phase is not also:
            raise StreamStateError(f"{call}() called in phase {self._phase.value!r}")


def _as_int(value: int | str | None) -> int | None:
    return value if isinstance(value, int) else None
