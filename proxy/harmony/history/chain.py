"""Stored conversations as request bodies: what `previous_response_id` and `item_reference`
mean, in plain data. Sans-IO: the shell reads the store, these functions only
reshape dicts.

The rule (OpenAI's): a request with `previous_response_id` is rendered
**exactly as if the client had sent the whole history in `input`** — the chain's input and
output items, oldest first, then the new input — while `instructions`, `tools`, `reasoning` and
`text` come from the new request only. So the history is merged into a *body*, and that body
goes through the one rendering path every request takes (`prepare_request`, or the awaited
renderer seam that replaces it): no second renderer, prompt ids equal by construction.

    stored chain ─history_items─▶ items ─merged_body(body, items)─▶ body ─prepare─▶ prompt ids

Input items are stored the way `GET /v1/responses/{id}/input_items` returns them
(`stored_input`): each with an `id`, messages with list content, calls and outputs with a
`status`. Every one of these changes renders to the same tokens as the item as sent (a string
content is one text part either way).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.errors import ClientError
from proxy.harmony.request.inputs import as_items
from proxy.harmony.response import IdFactory

#: Id prefixes of the items the proxy stores (OpenAI's: msg_, fc_, rs_; outputs of calls fco_).
_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}
_INPUT_PATH = re.compile(r"^input\[(\d+)\]")
#: The fields that name stored context, resolved into the merged body's input.
_CONTEXT_FIELDS = ("previous_response_id", "conversation")


def stored_input(value: Any, ids: IdFactory) -> list[dict[str, Any]]:
    """A request's (already validated) `input` as stored and listed: each item with an `id`;
    a string input as one user message; message content as a list of parts; function calls and
    their outputs with a `status`; reasoning with its `summary` list."""
    items: list[dict[str, Any]] = []
    for raw in as_items(value):
        item = dict(raw)
        kind = item.get("type") or "message"
        item["type"] = kind
        if kind == "message":
            item["content"] = _parts(item["content"], assistant=item["role"] == "assistant")
            item.setdefault("status", "completed")
        elif kind in ("function_call", "function_call_output"):
            item.setdefault("status", "completed")
        elif kind == "reasoning" and item.get("summary") is None:
            item["summary"] = []
        if not item.get("id"):
            item["id"] = ids(_ID_PREFIX.get(kind, "item"))
        items.append({"id": item.pop("id"), **item})
    return items


def _parts(content: Any, *, assistant: bool) -> list[Any]:
    """Message content as the list a listed item carries: an assistant's text as `output_text`
    with `annotations` (openai-python's `ResponseOutputMessage` requires them) and `logprobs`
    (OpenAI's spec requires them), others' as given. Both render as the same text content."""
    if isinstance(content, str):
        content = [{"type": "input_text", "text": content}]
    if not assistant:
        return list(content)
    parts = []
    for part in content:
        if part.get("type") in ("input_text", "output_text"):
            part = {"annotations": [], "logprobs": [], **part, "type": "output_text"}
        parts.append(part)
    return parts


def history_items(chain: Sequence[tuple[Sequence[Any], Sequence[Any]]]) -> list[Any]:
    """The context of a chain: for each response, oldest first, its input items then its
    output items."""
    items: list[Any] = []
    for inputs, outputs in chain:
        items += inputs
        items += outputs
    return items


def merged_body(body: Mapping[str, Any], history: Sequence[Any]) -> dict[str, Any]:
    """`body` as if its client had sent `history` before its own input (module docstring).
    `previous_response_id` and `conversation` are left out: the merged body stands
    on its own."""
    merged = {key: value for key, value in body.items() if key not in _CONTEXT_FIELDS}
    merged["input"] = [*history, *as_items(body.get("input"))]
    return merged


def references(value: Any) -> list[tuple[int, str]]:
    """(index, id) of the `item_reference` items of an `input` (ids checked by the renderer)."""
    if not isinstance(value, list):
        return []
    found = []
    for index, item in enumerate(value):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            ref = item.get("id")
            if isinstance(ref, str):
                found.append((index, ref))
    return found


def with_references(body: Mapping[str, Any], items: Mapping[int, Any]) -> dict[str, Any]:
    """`body` with the `item_reference` at each index of `items` replaced by the stored item."""
    value = body["input"]
    return {**body, "input": [items.get(index, item) for index, item in enumerate(value)]}


def local_error(
    error: ClientError, history_length: int, source: str = "previous_response_id"
) -> ClientError:
    """An error of the merged body, told in the client's own terms: `input[k]` of the merged
    input is `input[k - history_length]` of the request; an error inside the stored history
    (a stored item this proxy cannot render again) names `source`, the field the history came
    from (`previous_response_id`, or `conversation`)."""
    if not history_length or error.param is None:
        return error
    match = _INPUT_PATH.match(error.param)
    if match is None:
        return error
    index = int(match.group(1))
    if index < history_length:
        return ClientError(
            f"The stored conversation of '{source}' cannot be rendered again: " + error.message,
            status=error.status,
            param=source,
            code=error.code,
        )
    local = f"input[{index - history_length}]"
    return ClientError(
        error.message.replace(match.group(0), local),
        status=error.status,
        param=local + error.param[match.end() :],
        code=error.code,
    )
