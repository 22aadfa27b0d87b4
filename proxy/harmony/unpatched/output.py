"""What an unpatched trtllm-serve builds as a response's `output` for gpt-oss, defect and all.

Upstream's non-streaming builder (`_create_output_content_harmony` →
`_parse_output_message_harmony`, see `emitter.py` for the recorded versions) parses all of
a response's ids and makes one item per assistant message. It is the `output` of a non-streaming
answer and of the streamed `response.completed`, and it raises on some messages: then the
non-streaming answer is an HTTP 400 and the stream breaks without a terminal event.

Which item a message becomes, and whether the builder raises on it, depends on its header
alone (`_item_kind`) except for a browser call, whose text must be a JSON object. The recovery
accounting (`stream/recovery.py`) uses that to know, from headers it already read, when a response's
terminal event is certain and when only the builder itself can tell (`may_fail`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from openai_harmony import HarmonyEncoding, HarmonyError, Message, Role, TextContent

from proxy.harmony.response import IdFactory

#: openai 3.57.0 names the find action `find_in_page`; upstream builds `ActionFind(type="find")`.
_FIND_ERROR: Final = (
    "1 validation error for ActionFind\ntype\n  Input should be 'find_in_page' "
    "[type=literal_error, input_value='find', input_type=str]"
)


class UpstreamOutputError(Exception):
    """Upstream's response builder raised; the message is what it would report.

    Non-streaming, upstream answers HTTP 400 with this message; streaming, the stream breaks
    without a terminal event (`UnpatchedStream.aborted`).
    """


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """What upstream reads of a parsed Harmony message (an entry of `parser.messages`)."""

    assistant: bool  # author role
    channel: str | None
    recipient: str | None
    text: str  # the parser gives every message exactly one text content


# Items and parts as upstream builds them (openai 3.57.0 models, dumped). Streamed ids are "".
def reasoning_item(status: str | None, content: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {
        "id": "",
        "summary": [],
        "type": "reasoning",
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def message_item(status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "",
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def reasoning_part(text: str) -> dict[str, Any]:
    return {"text": text, "type": "reasoning_text"}


def text_part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


# -- the builder -----------------------------------------------------------------------------


def unpatched_output(
    encoding: HarmonyEncoding, token_ids: Sequence[int], ids: IdFactory
) -> list[dict[str, Any]]:
    """Upstream's non-streaming `output` items for these ids (`_create_output_content_harmony`).

    Also the `output` of the streamed `response.completed`. Raises `UpstreamOutputError` where
    upstream's builder raises (unparsable ids, an unknown channel or recipient, a bad browser
    call). Ids are drawn in upstream's order: `rs`, `msg`, `call` then `fc`, `ws`.
    """
    try:
        parsed = encoding.parse_messages_from_completion_tokens(
            list(token_ids), role=Role.ASSISTANT
        )
    except (HarmonyError, OverflowError) as exc:
        raise UpstreamOutputError(str(exc)) from exc
    return output_items([_from_harmony(message) for message in parsed], ids)


def _from_harmony(message: Message) -> ParsedMessage:
    (content,) = message.content  # the parser gives every message one text content
    text = content.text if isinstance(content, TextContent) else ""
    role = message.author.role == Role.ASSISTANT
    return ParsedMessage(role, message.channel, message.recipient, text)


def output_items(messages: list[ParsedMessage], ids: IdFactory) -> list[dict[str, Any]]:
    """`_parse_output_message_harmony` for each message, in order."""
    output: list[dict[str, Any]] = []
    for message in messages:
        output += _items_of(message, ids)
    return output


def may_fail(assistant: bool, channel: str | None, recipient: str | None) -> bool:
    """True when the builder may raise on a message with this header: it does for an unknown
    channel or recipient, and for a browser call whose text is not the JSON it expects."""
    try:
        return _item_kind(assistant, channel, recipient) == "web_search_call"
    except UpstreamOutputError:
        return True


def _item_kind(assistant: bool, channel: str | None, recipient: str | None) -> str:
    """The item upstream makes of a message with this header ("" for none); raises where the
    builder raises before it reads the text."""
    if not assistant:
        return ""  # a tool's or user's message the model wrote: left out
    if recipient is not None and recipient.startswith("browser."):
        return "web_search_call"  # on any channel
    if channel == "analysis":
        return "reasoning"  # whatever the recipient
    if channel == "commentary":
        if recipient is None:
            return ""  # a preamble: dropped
        if recipient.startswith("functions."):
            return "function_call"
        if recipient.startswith(("python", "browser")):
            return "reasoning"
        raise UpstreamOutputError(f"Unknown recipient: {recipient}")
    if channel == "final":  # whatever the recipient
        return "message"
    raise UpstreamOutputError(f"Unknown channel: {channel}")


def _items_of(message: ParsedMessage, ids: IdFactory) -> list[dict[str, Any]]:
    kind = _item_kind(message.assistant, message.channel, message.recipient)
    recipient, text = message.recipient or "", message.text
    if kind == "web_search_call":
        return [_web_search_call(recipient, text, ids)]
    if kind == "reasoning":
        return [_reasoning(text, ids)]
    if kind == "function_call":
        return [_function_call(recipient.split(".")[-1], text, ids)]
    if kind == "message":
        item = message_item("completed", [text_part(text, None)])
        return [{**item, "id": ids("msg")}]
    return []


def _reasoning(text: str, ids: IdFactory) -> dict[str, Any]:
    return {**reasoning_item(None, [reasoning_part(text)]), "id": ids("rs")}


def _function_call(name: str, arguments: str, ids: IdFactory) -> dict[str, Any]:
    call_id = ids("call")  # upstream draws the call id before the item id
    return {
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": ids("fc"),
        "async_": None,
        "caller": None,
        "namespace": None,
        "status": None,
    }


def _web_search_call(recipient: str, text: str, ids: IdFactory) -> dict[str, Any]:
    """A `browser.*` call → `web_search_call`; its argument is JSON with `query`/`url`."""
    try:
        call = json.loads(text)
    except ValueError as exc:
        raise UpstreamOutputError(str(exc)) from exc
    if not isinstance(call, dict):
        raise UpstreamOutputError(f"'{type(call).__name__}' object has no attribute 'get'")
    action: dict[str, Any]
    if recipient == "browser.search":
        query = f"cursor:{call.get('query', '')}"
        action = {"type": "search", "queries": None, "query": query, "sources": None}
    elif recipient == "browser.open":
        action = {"type": "open_page", "url": f"cursor:{call.get('url', '')}"}
    elif recipient == "browser.find":
        # `browser_call["pattern"]` (KeyError), then the model rejects type "find".
        raise UpstreamOutputError("'pattern'" if "pattern" not in call else _FIND_ERROR)
    else:
        raise UpstreamOutputError(f"Unknown browser action: {recipient}")
    return {"id": ids("ws"), "action": action, "status": "completed", "type": "web_search_call"}
