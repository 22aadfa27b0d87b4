"""Output items: which item a Harmony message becomes, and each item's event lifecycle.

One Harmony message is one output item. `classify` decides the item from the
completed header; `OpenItem` then owns that item's events from `output_item.added` to
`output_item.done`, so the lifecycle of every item type lives in this one file.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from proxy.harmony.response import IdFactory, Sealer
from proxy.harmony.stream import events as ev
from proxy.harmony.stream.logprobs import Entry

# Accounting channels (the record's and the metrics' label values): a small fixed set.
REASONING_CHANNEL = "reasoning"
FINAL_CHANNEL = "final"
COMMENTARY_CHANNEL = "commentary"  # preambles to the user
TOOL_CHANNEL = "tool_call"  # function-call arguments and built-in tool input
CHANNELS = (REASONING_CHANNEL, FINAL_CHANNEL, COMMENTARY_CHANNEL, TOOL_CHANNEL)

_FUNCTIONS_PREFIX = "functions."


class OpenItem:
    """An output item from its header to its end token; collects its text as deltas."""

    __slots__ = (
        "call_id",
        "channel",
        "done_item",
        "done_text",
        "held",
        "item_id",
        "kind",
        "logprobs",
        "name",
        "namespace",
        "output_index",
        "pending",
        "phase",
        "seal",
        "sent",
        "text_tokens",
        "tokens",
        "utf8",
    )

    def __init__(
        self,
        kind: str,
        channel: str,
        output_index: int,
        item_id: str,
        *,
        phase: str = "final_answer",
        name: str = "",
        namespace: str | None = None,
        call_id: str = "",
        seal: Sealer | None = None,
        logprobs: bool = False,
    ) -> None:
        self.kind = kind
        self.channel = channel
        self.output_index = output_index
        self.item_id = item_id
        self.phase = phase
        self.name = name
        self.namespace = namespace
        self.call_id = call_id
        self.seal = seal  # reasoning: `encrypted_content` of the done item
        # Text as it went out, as UTF-8: one buffer rather than one small object per token,
        # and 1-2 bytes a character where a `str` with one emoji in it takes 4 (memory per open
        # stream, bench/stream_memory.py). One encode per flush (a frame's deltas).
        self.utf8 = bytearray()
        self.pending: list[str] = []  # deltas since the last flush
        self.text_tokens = 0  # tokens that gave text: one delta each at one delta per token
        self.tokens = 0
        self.done_item: ev.Item = {}
        self.done_text: str | None = None  # the text, once closed: decoded once
        # Logprob entries of the item's tokens (None: not asked, or not a message):
        # `sent` of them went out with deltas; the last `held` wait for the delta that shows
        # their bytes (a character split across tokens, held back by the parser).
        self.logprobs: list[Entry] | None = [] if logprobs and kind == ev.MESSAGE else None
        self.sent = 0
        self.held = 0

    def add(self, delta: str) -> None:
        self.pending.append(delta)
        self.text_tokens += 1

    def take_pending(self) -> str:
        """The text added since the last call (one coalesced delta), or ""."""
        pending = self.pending
        if not pending:
            return ""
        text = pending[0] if len(pending) == 1 else "".join(pending)
        pending.clear()
        # Deltas are decoded text (never a lone surrogate): strict UTF-8 round-trips them.
        self.utf8 += text.encode()
        # A web search streams no text, only its lifecycle; its text is kept for the action.
        return "" if self.kind == ev.WEB_SEARCH_CALL else text

    @property
    def text(self) -> str:
        if self.done_text is not None:
            return self.done_text
        return self.utf8.decode() + "".join(self.pending)

    def delta_event(self, text: str) -> ev.Event:
        return ev.delta(self.kind, self.output_index, self.item_id, text, self._release())

    def _release(self) -> list[Entry] | None:
        """The entries a delta carries: every token since the last delta whose text has begun
        to show (a token's entry goes with the first delta holding any of its bytes)."""
        entries = self.logprobs
        if entries is None:
            return None
        end = len(entries) - self.held
        released = entries[self.sent : end]
        self.sent = end
        return released

    def _settle(self) -> list[Entry] | None:
        """At the item's end: tokens whose bytes never became text (a character cut off by the
        end of generation) take their entries with them, so entries and text still agree."""
        entries = self.logprobs
        if entries is not None and self.held:
            del entries[len(entries) - self.held :]
            self.held = 0
        return entries

    def _item(self, text: str | None, status: str) -> ev.Item:
        if self.kind == ev.WEB_SEARCH_CALL:
            action = ev.web_search_action(self.name, text)
            return ev.web_search_item(self.item_id, action, status)
        if self.kind == ev.REASONING:
            sealed = None if text is None or self.seal is None else self.seal([text])
            return ev.reasoning_item(self.item_id, text, status, sealed)
        if self.kind == ev.MESSAGE:
            return ev.message_item(self.item_id, text, status, self.phase, self.logprobs)
        return ev.function_call_item(
            self.item_id, self.call_id, self.name, self.namespace, text or "", status
        )

    def _part(self, text: str, entries: list[Entry] | None = None) -> dict[str, object] | None:
        if self.kind == ev.REASONING:
            return ev.reasoning_text_part(text)
        if self.kind == ev.MESSAGE:
            return ev.output_text_part(text, entries)
        return None  # function and web search calls have no content parts

    def opening_events(self) -> Iterator[ev.Event]:
        """`output_item.added` (+ `content_part.added`): before the item's first delta."""
        yield ev.item_added(self.output_index, self._item(None, "in_progress"))
        if self.kind == ev.WEB_SEARCH_CALL:
            yield ev.web_search_event("in_progress", self.output_index, self.item_id)
        part = self._part("")
        if part is not None:
            yield ev.part_added(self.output_index, self.item_id, part)

    def closing_events(self, status: str) -> Iterator[ev.Event]:
        """Every done event of the item, in the stream's order (all of them before anything of the
        next item); sets `done_item`."""
        text = self.done_text = self.text
        entries = self._settle()
        if self.kind == ev.WEB_SEARCH_CALL:
            yield ev.web_search_event("completed", self.output_index, self.item_id)
        else:
            yield ev.text_done(self.kind, self.output_index, self.item_id, text, self.name, entries)
        part = self._part(text, entries)
        if part is not None:
            yield ev.part_done(self.output_index, self.item_id, part)
        self.done_item = self._item(text, status)
        yield ev.item_done(self.output_index, self.done_item)


#: What a `bytes` object takes beside its bytes.
_BYTES_SIZE = sys.getsizeof(b"")


class KeptItem:
    """A closed item as the response keeps it until its end (its terminal event lists every
    item): the done item without its text, and the text as UTF-8 — kept so only when that is
    smaller: a `str` with one emoji in it takes 4 bytes a character (memory per open stream).
    `item()` gives the done item back, equal to the one sent."""

    __slots__ = ("_bare", "_utf8")

    def __init__(self, bare: ev.Item, utf8: bytes) -> None:
        self._bare = bare
        self._utf8 = utf8

    def item(self) -> ev.Item:
        text = self._utf8.decode()
        bare = self._bare
        if bare["type"] == ev.FUNCTION_CALL:
            return {**bare, "arguments": text}
        part, *rest = bare["content"]
        return {**bare, "content": [{**part, "text": text}, *rest]}


def kept(item: ev.Item, utf8: bytes | bytearray | None = None) -> ev.Item | KeptItem:
    """`item` (a done item) as the response keeps it until its end (`KeptItem`); `utf8`: its
    text as UTF-8 when the caller has it (an `OpenItem`'s), else encoded here."""
    if item["type"] == ev.FUNCTION_CALL:
        text: str = item["arguments"]
    elif item.get("content"):  # a message or reasoning item: one text part
        text = item["content"][0]["text"]
    else:
        return item
    if text.isascii():  # one byte a character either way
        return item
    if utf8 is None:
        utf8 = text.encode()
    if len(utf8) + _BYTES_SIZE >= sys.getsizeof(text):  # text of 2-byte characters (CJK)
        return item
    utf8 = bytes(utf8)
    # A copy: the item itself is in the `output_item.done` event, which may still wait to be
    # written (a stored response's events).
    if item["type"] == ev.FUNCTION_CALL:
        return KeptItem({**item, "arguments": ""}, utf8)
    part, *rest = item["content"]
    return KeptItem({**item, "content": [{**part, "text": ""}, *rest]}, utf8)


def shown(item: ev.Item | KeptItem) -> ev.Item:
    """The done item `kept` made `item` from."""
    return item.item() if isinstance(item, KeptItem) else item


def classify(
    *,
    channel: str | None,
    recipient: str | None,
    namespaces: frozenset[str],
    output_index: int,
    ids: IdFactory,
    seal: Sealer | None = None,
    logprobs: bool = False,
) -> OpenItem:
    """The item a completed assistant header opens; `seal` seals the text of reasoning items
    (None: `encrypted_content` stays null); `logprobs`: its answer's message items collect
    logprob entries (reasoning, function-call arguments and preambles carry none, as on
    OpenAI):

    analysis, no recipient              → reasoning item (`reasoning_text` part)
    final / commentary, no recipient    → message (phase final_answer / commentary, a preamble)
    functions.NAME                      → function_call NAME
    NS.NAME, NS a declared namespace    → function_call NAME in namespace NS
    browser.search|open|find            → web_search_call (upstream's non-streaming item type)
    python, container.*, any other      → reasoning item (upstream's, where it does not fail)
    """
    if recipient:
        if recipient.startswith("browser."):
            # What upstream's non-streaming answer gives for a browser call, on any channel.
            return OpenItem(
                ev.WEB_SEARCH_CALL, TOOL_CHANNEL, output_index, ids("ws"), name=recipient
            )
        namespace, _, name = recipient.partition(".")
        if recipient.startswith(_FUNCTIONS_PREFIX):
            namespace, name = "", recipient[len(_FUNCTIONS_PREFIX) :]
        if namespace == "" or namespace in namespaces:
            return OpenItem(
                ev.FUNCTION_CALL,
                TOOL_CHANNEL,
                output_index,
                ids("fc"),
                name=name,
                namespace=namespace or None,
                call_id=ids("call"),
            )
        # python, container.* and any other tool the proxy does not run: upstream's
        # non-streaming answer shows such input as reasoning (or fails; we do not).
        return OpenItem(ev.REASONING, TOOL_CHANNEL, output_index, ids("rs"), seal=seal)
    if channel == "analysis":
        return OpenItem(ev.REASONING, REASONING_CHANNEL, output_index, ids("rs"), seal=seal)
    if channel == "commentary":
        return OpenItem(
            ev.MESSAGE,
            COMMENTARY_CHANNEL,
            output_index,
            ids("msg"),
            phase="commentary",  # a preamble: no logprobs
        )
    # final, and a message without a channel: the answer.
    return OpenItem(ev.MESSAGE, FINAL_CHANNEL, output_index, ids("msg"), logprobs=logprobs)
