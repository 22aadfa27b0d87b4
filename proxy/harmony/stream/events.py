"""Responses stream events and output items, built as plain dicts ready for orjson.

One builder per wire type of the Responses stream; the shapes satisfy openai-python's strict
event models (`sequence_number` everywhere, `logprobs` lists on text events, `status` on every
item, `summary` on reasoning items). Sequence numbers are stamped by `EventLog`, the single
place that counts them: dense from 0, never restarting.
"""

from __future__ import annotations

from typing import Any

import orjson

Event = dict[str, Any]
Item = dict[str, Any]

#: The events that end a response's stream: exactly one of them, last.
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
#: The events that announce a response before its output (each carries the response object).
OPENING_EVENTS = frozenset({"response.created", "response.in_progress", "response.queued"})
# Item types; also the "kind" of an open item in stream/repair.py.
REASONING = "reasoning"
MESSAGE = "message"
FUNCTION_CALL = "function_call"
WEB_SEARCH_CALL = "web_search_call"

#: Delta event type per item type (what an item streams its text as).
DELTA_TYPE = {
    REASONING: "response.reasoning_text.delta",
    MESSAGE: "response.output_text.delta",
    FUNCTION_CALL: "response.function_call_arguments.delta",
}

#: Every item-level event type the core emits (what `RepairRecord.recovered_events` counts); the
#: metrics export each at zero from start-up, so alerts and rates never start from "no data".
ITEM_EVENT_TYPES = (
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    *DELTA_TYPE.values(),
    "response.output_text.done",
    "response.reasoning_text.done",
    "response.function_call_arguments.done",
    "response.web_search_call.in_progress",
    "response.web_search_call.completed",
)


class EventLog:
    """Collects the events of one `feed`/`finish` call, stamping dense sequence numbers."""

    __slots__ = ("events", "next_sequence")

    def __init__(self) -> None:
        self.next_sequence = 0
        self.events: list[Event] = []

    def add(self, event: Event) -> None:
        event["sequence_number"] = self.next_sequence
        self.next_sequence += 1
        self.events.append(event)

    def take(self) -> list[Event]:
        """Hand over the events collected since the last call."""
        events, self.events = self.events, []
        return events


# -- items -------------------------------------------------------------------------------------


def reasoning_item(
    item_id: str, text: str | None, status: str, encrypted_content: str | None = None
) -> Item:
    """A reasoning item; `text=None` while it is open (`content: []` in `output_item.added`);
    `encrypted_content` the sealed text when the request included it (reasoning_seal.py)."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {
        "id": item_id,
        "type": REASONING,
        "summary": [],
        "content": content,
        "encrypted_content": encrypted_content,
        "status": status,
    }


def output_text_part(text: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
    """An `output_text` part; `logprobs` its tokens' entries when asked."""
    return {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": [] if logprobs is None else logprobs,
    }


def reasoning_text_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def message_item(
    item_id: str, text: str | None, status: str, phase: str, logprobs: list[Any] | None = None
) -> Item:
    """An assistant message; `phase` is "final_answer" or "commentary" (a preamble)."""
    content = [] if text is None else [output_text_part(text, logprobs)]
    return {
        "id": item_id,
        "type": MESSAGE,
        "role": "assistant",
        "status": status,
        "content": content,
        "phase": phase,
    }


def function_call_item(
    item_id: str, call_id: str, name: str, namespace: str | None, arguments: str, status: str
) -> Item:
    item: Item = {
        "id": item_id,
        "type": FUNCTION_CALL,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def web_search_item(item_id: str, action: dict[str, Any], status: str) -> Item:
    """A `browser.*` call the model made: upstream's non-streaming answer shows it this way."""
    return {"id": item_id, "type": WEB_SEARCH_CALL, "status": status, "action": action}


def web_search_action(recipient: str, arguments: str | None) -> dict[str, Any]:
    """The `action` of a `browser.search|open|find` call from its JSON arguments (lenient: the
    model's JSON may be broken or cut; what cannot be read is left empty)."""
    try:
        args = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        args = {}
    if not isinstance(args, dict):
        args = {}

    def text(key: str) -> str | None:
        value = args.get(key)
        return value if isinstance(value, str) else None

    operation = recipient.partition(".")[2]
    if operation == "open":
        return {"type": "open_page", "url": text("url") or text("id")}
    if operation == "find":
        return {"type": "find_in_page", "pattern": text("pattern") or "", "url": text("url") or ""}
    # `query` only when known; `queries`/`sources` never (we run no search): OpenAI's spec gives
    # these no null.
    query = text("query")
    return {"type": "search"} if query is None else {"type": "search", "query": query}


def web_search_event(stage: str, output_index: int, item_id: str) -> Event:
    """`response.web_search_call.in_progress|searching|completed`."""
    return {
        "type": f"response.web_search_call.{stage}",
        "output_index": output_index,
        "item_id": item_id,
    }


# -- events ------------------------------------------------------------------------------------


def response_event(kind: str, response: dict[str, Any]) -> Event:
    """`response.created` / `in_progress` / `completed` / `incomplete` / `failed`."""
    return {"type": kind, "response": response}


def item_added(output_index: int, item: Item) -> Event:
    return {"type": "response.output_item.added", "output_index": output_index, "item": item}


def item_done(output_index: int, item: Item) -> Event:
    return {"type": "response.output_item.done", "output_index": output_index, "item": item}


def part_added(output_index: int, item_id: str, part: dict[str, Any]) -> Event:
    return {
        "type": "response.content_part.added",
        "output_index": output_index,
        "item_id": item_id,
        "content_index": 0,
        "part": part,
    }


def part_done(output_index: int, item_id: str, part: dict[str, Any]) -> Event:
    return {
        "type": "response.content_part.done",
        "output_index": output_index,
        "item_id": item_id,
        "content_index": 0,
        "part": part,
    }


def delta(
    kind: str, output_index: int, item_id: str, text: str, logprobs: list[Any] | None = None
) -> Event:
    """A text delta of an item of type `kind` (deltas concatenate to the done text);
    `logprobs` the entries of its tokens when asked."""
    if kind == MESSAGE:
        return {
            "type": "response.output_text.delta",
            "output_index": output_index,
            "item_id": item_id,
            "content_index": 0,
            "delta": text,
            "logprobs": [] if logprobs is None else logprobs,
        }
    if kind == REASONING:
        return {
            "type": "response.reasoning_text.delta",
            "output_index": output_index,
            "item_id": item_id,
            "content_index": 0,
            "delta": text,
        }
    return {
        "type": "response.function_call_arguments.delta",
        "output_index": output_index,
        "item_id": item_id,
        "delta": text,
    }


def text_done(
    kind: str,
    output_index: int,
    item_id: str,
    text: str,
    name: str = "",
    logprobs: list[Any] | None = None,
) -> Event:
    """`output_text.done`, `reasoning_text.done` or `function_call_arguments.done` (which names
    the function: required by OpenAI's spec); `logprobs` as on `delta`."""
    if kind == MESSAGE:
        return {
            "type": "response.output_text.done",
            "output_index": output_index,
            "item_id": item_id,
            "content_index": 0,
            "text": text,
            "logprobs": [] if logprobs is None else logprobs,
        }
    if kind == REASONING:
        return {
            "type": "response.reasoning_text.done",
            "output_index": output_index,
            "item_id": item_id,
            "content_index": 0,
            "text": text,
        }
    return {
        "type": "response.function_call_arguments.done",
        "output_index": output_index,
        "item_id": item_id,
        "name": name,
        "arguments": text,
    }


def error_event(code: str, message: str, param: str | None = None) -> Event:
    """openai-python's `ResponseErrorEvent`; always followed by `response.failed`."""
    return {"type": "error", "code": code, "message": message, "param": param}
