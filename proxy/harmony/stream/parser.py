"""openai-harmony's `StreamableParser(role=assistant)`, fast on what gpt-oss writes.

Theory of operation
-------------------
The core reads four things of the parser: whether it accepted a token, `last_content_delta`
after each content token, and `current_role` / `current_channel` / `current_recipient` once a
header is complete. openai-harmony computes them at a price the proxy pays on every token:
each content token is decoded *and re-encoded* into tokens (~1.2 µs), each token of a header
or between messages renders a formatting token again (~33 µs: it collects every special token
of the vocabulary), and a parser costs ~170 µs to make. Together that was a third of the
proxy's CPU per token.

`HarmonyParser` gives the same answers for the output a well-behaved model writes, from the
tokens' bytes (`TokenTable`) and the parser's own rules, transcribed from openai-harmony's
`StreamableParser::process_next` (strict mode):

    EXPECT_START ──<|start|>──▶ HEADER ──<|message|>, header parsed──▶ CONTENT
         ▲                                                              │
         └──────────────────────<|end|> / <|call|> / <|return|>─────────┘

- CONTENT: a token's bytes join the bytes not yet decoded; when they decode as UTF-8 they are
  the delta, when they end inside a character the complete part is (or there is none).
- HEADER: at `<|message|>` the header's text is split into role, channel, recipient and content
  type as `parse_header_from_string` does, for an assistant header in printable ASCII.

Everything else — a token the parser would reject, bytes that are no UTF-8, an id outside the
vocabulary, a header of another author or outside those rules — is where openai-harmony's
parser takes over: one is made, replays the ids fed so far (kept as 4-byte words) and gets
this one and all later ones itself (`share_log()`: the ids it takes then are logged still, for
the recovery accounting, which reads its ids from this log). Its answers are the reference;
`tests/test_parser.py` checks on random token streams that both parsers give the same answers
token by token.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, Final, cast

from openai_harmony import HarmonyEncoding, HarmonyError, Role, StreamableParser

from proxy.harmony import tokens as tk

_EXPECT_START: Final = 0
_HEADER: Final = 1
_CONTENT: Final = 2

#: `encoding.stop_tokens()`: they end a message's content.
_STOPS: Final = tk.MESSAGE_ENDS
_CHANNEL: Final = "<|channel|>"
_CONSTRAIN: Final = "<|constrain|>"
_ASSISTANT: Final = "assistant"
#: Header characters the fast path reads as openai-harmony does (no Unicode whitespace rules).
_PRINTABLE: Final = frozenset(chr(code) for code in range(0x20, 0x7F))
#: What may follow a channel name: openai-harmony ends it at whitespace or '<'.
_AFTER_CHANNEL: Final = frozenset(" <")


class TokenTable:
    """The bytes of token ids (openai-harmony's `decode_bytes`), cached; one per encoding and
    app, shared by its streams (the cache holds at most the vocabulary, ~200,000 entries)."""

    __slots__ = ("_bytes", "_encoding")

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        self._bytes: dict[int, bytes] = {}

    def get(self, token: int) -> bytes | None:
        """The token's bytes; None for an id the vocabulary does not have."""
        data = self._bytes.get(token)
        if data is None:
            try:
                # surrogateescape round-trips the bytes of a token that is no UTF-8 on its own
                text = self._encoding.decode([token], errors="surrogateescape")
            except (HarmonyError, OverflowError):
                return None
            data = self._bytes[token] = text.encode("utf-8", "surrogateescape")
        return data


class HarmonyParser:
    """A `StreamableParser(encoding, Role.ASSISTANT)` with the same `process()` and the same
    `last_content_delta`, `current_role`, `current_channel`, `current_recipient` (see the module
    docstring); `text()` takes a run of content tokens in one call."""

    __slots__ = (
        "_assistant_next",
        "_channel",
        "_delta",
        "_encoding",
        "_header",
        "_keep",
        "_log",
        "_real",
        "_recipient",
        "_state",
        "_table",
        "_undecoded",
    )

    def __init__(self, encoding: HarmonyEncoding, table: TokenTable) -> None:
        self._encoding = encoding
        self._table = table
        self._state = _HEADER  # given a role, the parser starts inside the first header
        self._assistant_next = True  # openai-harmony's `next_role`, until a header parsed
        self._header = b""
        self._undecoded = b""  # bytes of a character not complete yet
        self._delta: str | None = None
        self._channel: str | None = None
        self._recipient: str | None = None
        self._log = array("I")  # every id taken, for openai-harmony's parser to replay
        self._keep = False  # the log is shared (`share_log`): kept after the takeover too
        self._real: Any = None  # that parser's compiled core, once it took over

    # -- what the core reads ---------------------------------------------------------------

    @property
    def last_content_delta(self) -> str | None:
        if self._real is None:
            return self._delta
        return cast("str | None", self._real.last_content_delta)

    @property
    def current_role(self) -> Role | None:
        if self._real is not None:
            raw = self._real.current_role
            return Role(raw) if raw is not None else None
        if self._state == _CONTENT or self._assistant_next:
            return Role.ASSISTANT
        return None

    @property
    def current_channel(self) -> str | None:
        if self._real is None:
            return self._channel
        return cast("str | None", self._real.current_channel)

    @property
    def current_recipient(self) -> str | None:
        if self._real is None:
            return self._recipient
        return cast("str | None", self._real.current_recipient)

    @property
    def held_bytes(self) -> int:
        """Bytes of content taken but not yet in a delta (a character not complete yet); the
        fast path's only (`text()` runs only there)."""
        return len(self._undecoded)

    @property
    def log(self) -> array[int]:
        """Every id taken so far, in order; after the takeover only while shared."""
        return self._log

    def share_log(self, shared: bool = True) -> None:
        """Keep logging every id taken after openai-harmony's parser took over too (one array
        for both this parser's replay and the recovery accounting's ids), or no longer: the log
        goes once that parser took over."""
        self._keep = shared
        if not shared and self._real is not None:
            self._log = array("I")

    @property
    def delegated(self) -> bool:
        """Whether openai-harmony's parser took over (for tests and benchmarks)."""
        return self._real is not None

    # -- feeding ---------------------------------------------------------------------------

    def process(self, token: int) -> None:
        """Take one token; raises what openai-harmony raises (HarmonyError, OverflowError)."""
        if self._real is None:
            state = self._state
            if state == _CONTENT:
                if token in _STOPS:
                    self._end()
                    self._log.append(token)
                    return
                if self._decode(token):
                    self._log.append(token)
                    return
            elif state == _HEADER:
                if token == tk.MESSAGE:
                    if self._parse_header():
                        self._log.append(token)
                        return
                else:
                    data = self._table.get(token)
                    if data is not None:
                        self._header += data
                        self._log.append(token)
                        return
            elif token == tk.START:
                self._state = _HEADER
                self._header = b""
                self._log.append(token)
                return
            self._delegate()
        self._real.process(token)
        if self._keep:
            self._log.append(token)

    def text(self, token_ids: Sequence[int], position: int, deltas: list[str]) -> int:
        """Take the content tokens from `position` on while they are plain text for the fast
        path, appending each non-empty delta to `deltas`; returns the position of the first
        token left (a message end, <|start|>, anything `process` must see) or the end."""
        if self._real is not None or self._state != _CONTENT:
            return position
        table, undecoded, start = self._table._bytes, self._undecoded, position
        delta = self._delta
        end = len(token_ids)
        while position < end:
            token = token_ids[position]
            if token in _STOPS or token == tk.START:
                break
            data = table.get(token)
            if data is None:
                break  # not cached yet, or not in the vocabulary: `process` decides
            if undecoded:
                data = undecoded + data
            try:
                delta, undecoded = data.decode(), b""
            except UnicodeDecodeError as exc:
                if not _incomplete(exc, data):
                    break  # no UTF-8: `process` hands over to openai-harmony's parser
                delta, undecoded = data[: exc.start].decode() or None, data[exc.start :]
            if delta is not None:
                deltas.append(delta)
            position += 1
        self._undecoded, self._delta = undecoded, delta
        self._log.extend(token_ids[start:position])
        return position

    # -- the rules -------------------------------------------------------------------------

    def _decode(self, token: int) -> bool:
        """A content token: the delta as openai-harmony computes it; False where only its
        parser can say (an id outside the vocabulary, bytes that are no UTF-8)."""
        data = self._table.get(token)
        if data is None:
            return False
        data = self._undecoded + data
        try:
            self._delta, self._undecoded = data.decode(), b""
        except UnicodeDecodeError as exc:
            if not _incomplete(exc, data):
                return False
            self._delta, self._undecoded = data[: exc.start].decode() or None, data[exc.start :]
        return True

    def _end(self) -> None:
        self._state = _EXPECT_START
        self._delta = self._channel = self._recipient = None
        self._undecoded = b""

    def _parse_header(self) -> bool:
        """`parse_header_from_tokens` for an assistant header in printable ASCII; False for any
        other (openai-harmony's parser decides, raising where it rejects the header)."""
        try:
            text = self._header.decode()
        except UnicodeDecodeError:
            return False
        if not _PRINTABLE.issuperset(text):
            return False
        channel = None
        at = text.find(_CHANNEL)
        if at >= 0:
            rest = text[at + len(_CHANNEL) :]
            cut = next((i for i, char in enumerate(rest) if char in _AFTER_CHANNEL), len(rest))
            channel = rest[:cut]
            if not channel:
                return False  # "channel marker present but no channel value"
            text = text[:at] + rest[cut:]
        text = text.strip()
        if _CONSTRAIN in text:
            text = text.replace(_CONSTRAIN, " " + _CONSTRAIN).strip()
        parts = text.split()
        if not self._assistant_next and (not parts or parts[0] != _ASSISTANT):
            return False  # another author, or none: openai-harmony's own role rules
        if parts and parts[0] == _ASSISTANT:
            del parts[0]
        recipient = None
        if parts:
            count, last = len(parts), parts.pop()
            if last.startswith("to="):
                recipient = last[3:]
            elif count == 1:
                recipient = last  # a single part is a standalone recipient (0.0.8: any part)
            elif parts:  # the last part is a content type; one more may name the recipient
                raw = parts.pop()
                recipient = raw[3:] if raw.startswith("to=") else raw
            if parts:
                return False  # "unexpected tokens remaining in message header"
        self._state = _CONTENT
        self._assistant_next = False
        self._channel, self._recipient = channel, recipient
        self._undecoded = b""
        return True

    def _delegate(self) -> None:
        """openai-harmony's parser takes over: made now, it replays every id taken so far."""
        parser = StreamableParser(self._encoding, Role.ASSISTANT)
        # its compiled core when the wrapper has one (0.0.8 does): the same `process` and
        # properties, without a Python call around each
        real = getattr(parser, "_inner", parser)
        for token in self._log:
            real.process(token)
        self._real = real
        if not self._keep:
            self._log = array("I")


def _incomplete(error: UnicodeDecodeError, data: bytes) -> bool:
    """The bytes end inside a character (its bytes so far valid): wait for the rest."""
    return error.end == len(data) and error.reason == "unexpected end of data"
