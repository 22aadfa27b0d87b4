"""Conversations as data (OpenAI's Conversations API is the contract). Sans-IO: the
shell moves the bytes, these functions check requests and build answers.

A conversation is one store entry (proxy/store/base.py): its document is the record below (id,
creation time, metadata), its log its items, one item per log entry, in the order they were
added. Items come from `POST /v1/conversations` (`items`), from `POST …/items`, and from every
response created with `conversation`: its input items, then its output items, appended as one
batch when it ends (`Push`: batches of concurrent responses land one after the other, whole).

Items are kept the way `GET …/items` lists them — what `history.stored_input` makes of input
items (each with an `id`, messages with list content, a `status`), and output items as the
response's terminal snapshot carried them — so a conversation renders exactly as the same items
sent in `input` (the render of the merged body does it; prompt ids equal by construction).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import ClientError
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request.check import check_keys, fail, want_object, want_str
from proxy.harmony.request.fields import INCLUDES, read_metadata
from proxy.harmony.request.items import check_items
from proxy.harmony.response import Sealer

#: Ids the proxy makes: `conv_` and 32 hex digits (128 random bits, like response ids).
_CONVERSATION_ID = re.compile(r"conv_[A-Za-z0-9]{1,96}")
#: Items one create or append may carry (the spec's `maxItems`).
MAX_ITEMS = 20
#: `GET …/items`: `limit` bounds and default (the spec's).
LIMIT_DEFAULT, LIMIT_MAX = 20, 100
_CREATE_KEYS = frozenset({"items", "metadata"})
_UPDATE_KEYS = frozenset({"metadata"})
_APPEND_KEYS = frozenset({"items"})


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """The document of a conversation's store entry."""

    id: str
    created_at: int
    metadata: dict[str, str]

    def resource(self) -> dict[str, Any]:
        """The Conversation object (`ConversationResource`)."""
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }

    def encode(self) -> bytes:
        return orjson.dumps(self.resource())

    @classmethod
    def decode(cls, doc: bytes) -> ConversationRecord:
        data = orjson.loads(doc)
        return cls(data["id"], data["created_at"], data["metadata"])


def deleted(key: str) -> dict[str, Any]:
    """The answer to `DELETE /v1/conversations/{id}`."""
    return {"id": key, "object": "conversation.deleted", "deleted": True}


def check_conversation_id(value: Any, path: str) -> str:
    """A conversation id as the proxy makes them, else a 400 naming `path` — before any store
    is asked (malformed → 400, unknown → 404, as for response ids)."""
    text = want_str(value, path)
    if not _CONVERSATION_ID.fullmatch(text):
        fail(path, value, "expected an ID that begins with 'conv_'", code="invalid_value")
    return text


def conversation_param(value: Any) -> str:
    """The id a create request's `conversation` names: the id itself, or `{"id": …}`."""
    if isinstance(value, dict):
        check_keys(value, ("id",), "conversation", "'conversation'")
        return check_conversation_id(value.get("id"), "conversation.id")
    return check_conversation_id(value, "conversation")


def not_found(key: str, param: str = "conversation_id") -> ClientError:
    return ClientError(f"Conversation with id '{key}' not found.", status=404, param=param)


def item_not_found(item_id: str) -> ClientError:
    return ClientError(f"Item with id '{item_id[:100]}' not found.", status=404, param="item_id")


def exclusive() -> ClientError:
    """`conversation` with `previous_response_id`: OpenAI's 400."""
    return ClientError(
        "Mutually exclusive parameters: Ensure you are only providing one of: "
        "'previous_response_id' or 'conversation'.",
        param="conversation",
        code="mutually_exclusive_parameters",
    )


# -- request bodies -----------------------------------------------------------------------------


def read_create(body: Any) -> tuple[list[Any], dict[str, str]]:
    """`POST /v1/conversations`: the raw items (up to 20, checked) and the metadata."""
    body = _object(body, _CREATE_KEYS)
    items = body.get("items")
    return ([] if items is None else _items(items, empty=True)), _metadata(body)


def read_update(body: Any) -> dict[str, str]:
    """`POST /v1/conversations/{id}`: the new metadata (required)."""
    body = _object(body, _UPDATE_KEYS)
    if "metadata" not in body:
        raise ClientError(
            "Missing required parameter: 'metadata'.",
            param="metadata",
            code="missing_required_parameter",
        )
    return _metadata(body)


def read_append(body: Any) -> list[Any]:
    """`POST /v1/conversations/{id}/items`: the raw items (1 to 20)."""
    body = _object(body, _APPEND_KEYS)
    if body.get("items") is None:
        raise ClientError(
            "Missing required parameter: 'items'.", param="items", code="missing_required_parameter"
        )
    return _items(body["items"], empty=False)


def check_new_items(items: list[Any], keys: ReasoningKeys | None) -> None:
    """Items to add, with their `item_reference`s resolved: each renderable later (the render
    of the whole conversation looks up the calls their outputs answer), ids distinct."""
    check_items(items, "items", keys)
    duplicate = first_duplicate(item.get("id") for item in items)
    if duplicate is not None:
        raise duplicate_error(duplicate, "items")


def _object(body: Any, keys: frozenset[str]) -> dict[str, Any]:
    """A request body: an object (no body: an empty one) of `keys` only."""
    checked: dict[str, Any] = {} if body is None else want_object(body, "body")
    check_keys(checked, keys, "", "this request body")  # the key quoted capped, as everywhere
    return checked


def _items(value: Any, *, empty: bool) -> list[Any]:
    if not isinstance(value, list):
        fail("items", value, "expected an array of items", code="invalid_type")
    if len(value) > MAX_ITEMS:
        raise ClientError(
            f"Invalid 'items': array too long. Expected an array with maximum length "
            f"{MAX_ITEMS}, but got an array with length {len(value)} instead.",
            param="items",
            code="array_above_max_length",
        )
    if not value and not empty:
        raise ClientError(
            "Invalid 'items': empty array. Expected an array with minimum length 1, but got an "
            "empty array instead.",
            param="items",
            code="empty_array",
        )
    return value


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    return read_metadata(body.get("metadata")) or {}


def first_duplicate(ids: Iterable[Any]) -> str | None:
    """The first id seen twice (items without an id are never duplicates)."""
    seen: set[str] = set()
    for item_id in ids:
        if not isinstance(item_id, str) or not item_id:
            continue
        if item_id in seen:
            return item_id
        seen.add(item_id)
    return None


def check_input_ids(items: Sequence[dict[str, Any]], value: Any) -> None:
    """A create request's input items with an id its conversation's `items` already hold, or
    one id twice, are a 400, as OpenAI answers them: they are added to the conversation, whose
    item ids each name one item."""
    held = {item.get("id") for item in items}
    own = (
        [item.get("id") for item in value if isinstance(item, dict)]
        if isinstance(value, list)
        else []
    )
    for item_id in own:
        if isinstance(item_id, str) and item_id in held:
            raise duplicate_error(item_id, "input")
    duplicate = first_duplicate(own)
    if duplicate is not None:
        raise duplicate_error(duplicate, "input")


def duplicate_error(item_id: str, param: str) -> ClientError:
    """OpenAI's 400 for an item id the conversation (or the request) already has."""
    return ClientError(
        f"Duplicate item found with id {item_id[:100]}. Remove duplicate items from your input "
        "and try again.",
        param=param,
    )


# -- items in the log ---------------------------------------------------------------------------


def encode_items(items: Sequence[dict[str, Any]]) -> tuple[bytes, ...]:
    """Items as log entries, one each (`Push`)."""
    return tuple(orjson.dumps(item) for item in items)


def decode_items(entries: Iterable[tuple[int, bytes]]) -> list[tuple[int, dict[str, Any]]]:
    """(mark, item) of each log entry, oldest first."""
    return [(mark, orjson.loads(data)) for mark, data in entries]


def read_includes(values: Sequence[str]) -> frozenset[str]:
    """`include[]` of an item read: values of the spec's enum (others a 400)."""
    for index, value in enumerate(values):
        if value not in INCLUDES:
            fail(f"include[{index}]", value, f"expected one of {', '.join(INCLUDES)}")
    return frozenset(values)


def included(item: dict[str, Any], include: frozenset[str], seal: Sealer) -> dict[str, Any]:
    """`item` as a read with `include` shows it: with `reasoning.encrypted_content`, a
    reasoning item carries its text sealed (as a response created with that include would have
    given it); the other values name content gpt-oss never produces here."""
    if (
        "reasoning.encrypted_content" not in include
        or item.get("type") != "reasoning"
        or item.get("encrypted_content")
    ):
        return item
    texts = [part["text"] for part in item.get("content") or [] if isinstance(part, dict)]
    return {**item, "encrypted_content": seal(texts)} if texts else item


def page(
    items: Sequence[dict[str, Any]], *, after: str | None, limit: int, order: str
) -> dict[str, Any]:
    """`GET …/items`: the list object of up to `limit` items after the item `after`, in
    `order` (`asc`: oldest first)."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    if after:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise ClientError(
                f"No item with id '{after[:100]}' in this conversation.", param="after"
            )
        ordered = ordered[ids.index(after) + 1 :]
    return item_list(ordered[:limit], has_more=len(ordered) > limit)


def item_list(items: Sequence[dict[str, Any]], *, has_more: bool = False) -> dict[str, Any]:
    """The list object (`ConversationItemList`)."""
    return {
        "object": "list",
        "data": list(items),
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }
