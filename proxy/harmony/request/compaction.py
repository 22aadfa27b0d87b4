"""Compaction as data: the `compaction` item's sealed payload, where it renders, what a
compaction keeps, and the summarisation pass's request (`POST /v1/responses/compact`).

A compaction replaces the history before it with a checkpoint summary the model wrote. Its item
is `{"type": "compaction", "id": "cmp_…", "encrypted_content": BLOB}`, where BLOB is sealed like
encrypted reasoning (reasoning_seal.py, kind `COMPACTION`: a reasoning blob does not open as a
compaction, nor the reverse) over the payload

    {"summary": "<the model's checkpoint summary>", "users": [["<text part>", …], …]}

`users` are the texts of the user messages the compaction keeps. What a compaction keeps, as the
spec's `CompactResource` shows it: the user messages of the compacted window, verbatim, then the
one compaction item; assistant messages, tool calls and their outputs, and reasoning are what
the summary replaces. The kept user messages are both returned as items (the client keeps them
in its history, as OpenAI's example does) and sealed in the payload, so the rule "items before
the latest compaction item are dropped" loses nothing: the compaction item alone re-renders them.

Kept, but bounded (`kept_budget`): the newest user messages, newest first, while their text fits
in the budget — the newest one always, so the turn being answered stays verbatim — and the
older ones are left to the summary. Unbounded, each compaction would carry every user message of
the earlier ones forward, and once that text alone passed the threshold every later request
would pay a summarisation pass and still be over it.

Where it renders. Items before the latest compaction item in an input (with a stored chain or
conversation merged in first) are dropped. The compaction item then stands at the head of the
conversation, right after the system and developer messages, and renders as

    user  <kept user message>   (one message each, in order)
    developer  "Checkpoint summary of the conversation so far: …"

A developer message is Harmony's place for context the application (not the user) gives the
model, with authority over the conversation that follows; the model reads the summary as the
state it continues from. It comes after the kept user messages because it summarises the work
done on them, and the items after the compaction continue from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openai_harmony import Message, Role, TextContent

from proxy.harmony.reasoning_seal import COMPACTION, ReasoningKeys, SealError
from proxy.harmony.request.check import (
    Shape,
    at,
    check_shape,
    fail,
    missing,
    want_list,
    want_object,
)
from proxy.harmony.request.inputs import as_items

#: The summarisation instruction: a developer message after the history, so the model's next
#: message is the checkpoint summary. Documented in docs/compaction.md.
INSTRUCTION = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Write a checkpoint summary of the "
    "conversation so far, for yourself to continue from once the earlier messages are gone: "
    "the user's goal and requests, the decisions made and why, what was done and its results "
    "(tool calls and their outputs that matter, file names, identifiers, numbers), what is "
    "still open, and the next step. Be complete but concise. Do not call any tool. Answer "
    "with the summary only."
)
#: How a compaction's summary is introduced to the model where it renders.
SUMMARY_HEADING = "Checkpoint summary of the conversation so far:\n"

#: The fields of `CompactResponseMethodPublicBody` (anything else is a 400).
COMPACT_FIELDS = frozenset(
    {
        "model",
        "input",
        "previous_response_id",
        "instructions",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "service_tier",
    }
)


@dataclass(frozen=True, slots=True)
class Sealed:
    """An opened compaction: the summary and the kept user messages' text parts."""

    summary: str
    users: tuple[tuple[str, ...], ...]


def seal(keys: ReasoningKeys, summary: str, users: list[list[str]]) -> str:
    """The `encrypted_content` of a compaction."""
    return keys.seal_json(COMPACTION, {"summary": summary, "users": users})


def open_sealed(keys: ReasoningKeys, blob: Any, path: str) -> Sealed:
    """The payload of a compaction item's `encrypted_content`, or a 400 naming `path`."""
    if not isinstance(blob, str):
        fail(path, blob, "expected a string", code="invalid_type")
    try:
        payload = keys.open_json(COMPACTION, blob)
    except SealError as exc:
        fail(path, blob, f"cannot be opened: {exc}", code="invalid_encrypted_content")
    summary, users = payload.get("summary"), payload.get("users")
    if not isinstance(summary, str) or not isinstance(users, list):  # pragma: no cover - ours
        fail(path, blob, "cannot be opened: not a compaction", code="invalid_encrypted_content")
    return Sealed(summary, tuple(tuple(str(t) for t in texts) for texts in users))


def render(opened: Sealed) -> list[Message]:
    """The messages a compaction item renders as (module doc)."""
    messages = [
        Message.from_role_and_contents(Role.USER, [TextContent(text=t) for t in texts])
        for texts in opened.users
        if texts
    ]
    messages.append(Message.from_role_and_content(Role.DEVELOPER, SUMMARY_HEADING + opened.summary))
    return messages


def latest(items: list[Any]) -> int:
    """The index of the latest compaction item (-1: none)."""
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if isinstance(item, dict) and item.get("type") == "compaction":
            return index
    return -1


def window(items: list[Any]) -> list[Any]:
    """The items that render: from the latest compaction item on (all when there is none)."""
    return items[max(latest(items), 0) :]


def user_texts(item: Any) -> list[str] | None:
    """The text parts of a user message item (None: not a user message)."""
    if not isinstance(item, dict) or item.get("role") != "user":
        return None
    if item.get("type", "message") != "message":
        return None
    content = item.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return None
    return [
        part["text"]
        for part in content
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]


#: Bytes of kept user text per token of the compaction's reference size (`kept_budget`). A
#: token is never less than one byte, so the kept text never takes more tokens than the
#: reference; English runs ~4 bytes a token, so it takes about a quarter of it, which leaves the
#: rest of a threshold to the summary and the turns after it before the next compaction. Bytes,
#: not tokens: counting tokens would run the BPE on the event loop, over the client's text.
KEPT_BYTES_PER_TOKEN = 1
#: Without a threshold (the compact route, a `compaction_trigger` alone) the reference is this
#: share of the model's context (`max_prompt_tokens`).
KEPT_CONTEXT_SHARE = 4


def kept_budget(threshold: int | None, max_prompt_tokens: int) -> int:
    """The UTF-8 bytes of user text a compaction keeps verbatim, at most (module doc): one per
    token of the `compact_threshold`, or of a quarter of the context without one."""
    reference = threshold if threshold is not None else max_prompt_tokens // KEPT_CONTEXT_SHARE
    return reference * KEPT_BYTES_PER_TOKEN


def kept(items: list[Any], keys: ReasoningKeys, budget: int) -> list[list[str]]:
    """The text parts of the user messages a compaction of `items` keeps (module doc): of those
    the latest earlier compaction kept, then those after it, the newest whose text fits in
    `budget` bytes (the newest one always), in order."""
    rest = window(items)
    texts: list[list[str]] = []
    for index, item in enumerate(rest):
        if isinstance(item, dict) and item.get("type") == "compaction":
            opened = open_sealed(keys, item.get("encrypted_content"), f"input[{index}]")
            texts.extend(list(users) for users in opened.users)
            continue
        found = user_texts(item)
        if found is not None:
            texts.append(found)
    first = len(texts)
    used = 0
    while first > 0:
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts[first - 1])
        if used + size > budget and first < len(texts):
            break  # a contiguous run of the newest: the older ones are in the summary
        used += size
        first -= 1
    return texts[first:]


def kept_item(texts: list[str], item_id: str) -> dict[str, Any]:
    """A kept user message as an output item."""
    return {
        "id": item_id,
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": [{"type": "input_text", "text": text} for text in texts],
    }


def compaction_item(item_id: str, blob: str) -> dict[str, Any]:
    """The `compaction` output item."""
    return {"id": item_id, "type": "compaction", "encrypted_content": blob}


_CONTEXT_ENTRY = Shape(
    "a 'context_management' entry",
    frozenset({"type", "compact_threshold"}),
    ("ContextManagementParam",),
)
#: The spec's least `compact_threshold`.
MIN_THRESHOLD = 1000


def read_context_management(value: Any) -> int | None:
    """`context_management` of a create body: its `compact_threshold` (None: none set); 400
    for anything but `[{"type": "compaction", "compact_threshold": N ≥ 1000 or null}]`."""
    if value is None:
        return None
    threshold = None
    for index, raw in enumerate(want_list(value, "context_management")):
        path = at("context_management", index)
        entry = want_object(raw, path)
        check_shape(entry, _CONTEXT_ENTRY, path)
        if entry.get("type") != "compaction":
            fail(at(path, "type"), entry.get("type"), "only 'compaction' is supported")
        found = entry.get("compact_threshold")
        if found is None:
            continue
        if isinstance(found, bool) or not isinstance(found, int):
            fail(at(path, "compact_threshold"), found, "expected an integer", code="invalid_type")
        if found < MIN_THRESHOLD:
            fail(at(path, "compact_threshold"), found, f"must be at least {MIN_THRESHOLD}")
        threshold = found if threshold is None else min(threshold, found)
    return threshold


def triggered(body: dict[str, Any]) -> bool:
    """Whether the input's last item is a `compaction_trigger` (compact now)."""
    items = body.get("input")
    return (
        isinstance(items, list)
        and bool(items)
        and isinstance(items[-1], dict)
        and items[-1].get("type") == "compaction_trigger"
    )


def read_compact_body(body: Any) -> dict[str, Any]:
    """Check a `POST /v1/responses/compact` body's top level (its items are checked when the
    pass renders them); 400 for an unknown field or a missing model."""
    checked = want_object(body, "body")
    for key in checked:
        if key not in COMPACT_FIELDS:
            fail(key, checked[key], "not a field of a compact request", code="unknown_parameter")
    if checked.get("model") is None:
        missing("model")
    if checked.get("input") is None and checked.get("previous_response_id") is None:
        missing("input")
    return checked


def pass_body(body: dict[str, Any]) -> dict[str, Any]:
    """The `/v1/responses` body of the summarisation pass over a compact body whose chain is
    merged in: the input, then the instruction; no tools (no tool call can be made), not
    stored, with reasoning."""
    pass_input = [
        *as_items(body.get("input")),
        {"type": "message", "role": "developer", "content": INSTRUCTION},
    ]
    fields = {"model", "instructions", "prompt_cache_key", "prompt_cache_retention"}
    out = {key: body[key] for key in fields if body.get(key) is not None}
    return {**out, "input": pass_input, "store": False, "stream": False, "tool_choice": "none"}


def summary_of(response: dict[str, Any]) -> str | None:
    """The summary a completed pass wrote (None: it did not complete with one)."""
    if response.get("status") != "completed":
        return None
    texts = [
        part.get("text", "")
        for item in response.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "output_text"
    ]
    summary = "".join(texts).strip()
    return summary or None
