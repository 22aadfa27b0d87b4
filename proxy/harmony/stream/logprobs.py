"""Token logprobs of output text: upstream's per-token values, our tokens' text.

With `include: ["message.output_text.logprobs"]` the shell asks upstream's `/v1/completions`
for `logprobs: max(1, top_logprobs)` and hands the core each frame's values with its ids
(`ResponseStream.feed(ids, logprobs, top_logprobs)`: plain data, aligned with the ids). The
core turns each content token of a message item into one entry (`Logprobs.entry`), the shape of
OpenAI's `LogProb` (`token`, `logprob`, `bytes`, `top_logprobs` of `token`, `logprob`,
`bytes`), the same dict on the delta that carries the token's text, on `output_text.done` and
in the item's `output_text` part. (The delta and done events' `ResponseLogProb` is the same
without `bytes`; the spec lets an event carry more, and `bytes` is what makes the tokens add up
to the text.)

- `token` and `bytes` come from the vocabulary by id, never from upstream's decoded strings:
  `bytes` exactly, also for a token that splits a multi-byte character. Its `token` then follows
  OpenAI's chat-completions convention: each byte that is not part of a whole character is
  written as the escape `\\xNN` (what Python's `backslashreplace` gives: `b"\\xe2\\x80"` →
  `"\\\\xe2\\\\x80"`); the bytes, not the string, are what concatenates to the text.
- `top_logprobs` are the `top_logprobs` most likely of upstream's alternatives, most likely
  first (`best`). Upstream names them by decoded string, not by id, so their `bytes` are that
  string's UTF-8 (a partial character decodes to U+FFFD there) and two ids that decode alike
  are one entry upstream (`{string: logprob}` dicts): fewer than asked is possible, as OpenAI's
  spec allows. Upstream's order is not the order of likelihood: trtllm-serve lists the sampled
  token first, then its top K (K + 1 entries when the sampled token is not among them), so
  the entries are sorted by logprob and cut after sorting, whatever order and however many
  entries a dict has. The token's own `logprob` is its sampled value (`token_logprobs`),
  also when the sampled token is not among the alternatives kept.

Sans-IO; one `Logprobs` per response (it caches per id what the table gives).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from proxy.harmony.stream.parser import TokenTable

Entry = dict[str, Any]

_VALUE = itemgetter(1)


def best(top: Mapping[str, float], count: int) -> list[tuple[str, float]]:
    """The `count` most likely of upstream's alternatives, most likely first (module doc);
    equal logprobs keep upstream's order. Every entry is looked at: the sampled token upstream
    lists first may be the least likely, and the N-th best may come last."""
    ranked = sorted(top.items(), key=_VALUE, reverse=True)
    return ranked[:count] if len(ranked) > count else ranked


class Logprobs:
    """Builds the logprob entries of one response (module doc); `top` is the request's
    `top_logprobs` (0-20)."""

    __slots__ = ("_strings", "_table", "_tokens", "top")

    def __init__(self, table: TokenTable, top: int) -> None:
        self._table = table
        self.top = top
        self._tokens: dict[int, tuple[str, list[int]]] = {}
        # The bytes of upstream's alternative strings: a few thousand distinct ones in a long
        # answer, each met again and again (top 20: most of the cost of an entry).
        self._strings: dict[str, list[int]] = {}

    def token(self, token: int) -> tuple[str, list[int]]:
        """The `token` string and `bytes` of an id (cached; the list is shared, never changed)."""
        known = self._tokens.get(token)
        if known is None:
            data = self._table.get(token) or b""
            known = self._tokens[token] = (_text(data), list(data))
        return known

    def size(self, token: int) -> int:
        """How many bytes the token adds to the text."""
        return len(self.token(token)[1])

    def entry(self, token: int, value: float, top: Mapping[str, float] | None) -> Entry:
        """One token's entry: its text from the vocabulary, upstream's sampled value, and the
        `top` most likely of upstream's alternatives (module doc)."""
        text, data = self.token(token)
        alternatives: list[Entry] = []
        if top and self.top:
            strings = self._strings
            for alternative, logprob in best(top, self.top):
                encoded = strings.get(alternative)
                if encoded is None:
                    encoded = strings[alternative] = list(alternative.encode())
                alternatives.append({"token": alternative, "logprob": logprob, "bytes": encoded})
        return {"token": text, "logprob": value, "bytes": data, "top_logprobs": alternatives}


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")
