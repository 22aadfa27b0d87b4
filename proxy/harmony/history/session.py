"""What a WebSocket session keeps of its last response, so that a `response.create` naming it
in `previous_response_id` continues it — also with `store: false` — and how much.

- A **stored** response is kept as its id alone: naming it goes through the store, as over HTTP.
- An **unstored** one is kept as its history (the input it was made from, then its output) when
  that history, encoded, fits `limit` bytes — the session's message limit: no more than a
  stateless client could send in one message. Over it, the history is not kept (truncation
  `auto` drops old items from a prompt, never from what a session holds); a turn naming the
  response then gets a 400 saying why and what to do, never a silent loss of items.

The size is measured once per turn, when the response ends (`keep`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import ClientError
from proxy.harmony.history.chain import merged_body
from proxy.harmony.request.inputs import as_items


@dataclass(frozen=True, slots=True)
class Kept:
    """A session's last response (module doc). `items`: its history when the session continues
    it itself (None: stored, or over `limit`); `size`: the encoded bytes of that history."""

    response_id: str
    stored: bool
    items: tuple[Any, ...] | None
    size: int
    limit: int

    @property
    def held(self) -> int:
        """Bytes of history the session holds for this response."""
        return self.size if self.items is not None else 0


def keep(
    response_id: str,
    *,
    stored: bool,
    made_from: Mapping[str, Any],
    output: Sequence[Any],
    limit: int,
) -> Kept:
    """The session's memory of a response that ended well: made from the body `made_from`
    (its input, merged with what it continued), with `output`; `stored` when the store has it."""
    if stored:
        return Kept(response_id, True, None, 0, limit)
    items = (*as_items(made_from.get("input")), *output)
    size = len(orjson.dumps(items))
    return Kept(response_id, False, items if size <= limit else None, size, limit)


def continuing(kept: Kept | None, body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`body` with the session's kept history merged in when its `previous_response_id` names
    the session's unstored last response, and that id; else `body` as sent and None (a stored
    response, or another, goes through the store). A body with `conversation` too is left to
    be refused as over HTTP. A response whose history was over the bound: 400."""
    if (
        kept is None
        or kept.stored
        or body.get("previous_response_id") != kept.response_id
        or body.get("conversation") is not None
    ):
        return body, None
    if kept.items is None:
        raise ClientError(
            f"previous_response_id {kept.response_id!r} is this connection's last response, but "
            f"it was not stored (store: false) and its history ({kept.size} bytes encoded) is "
            f"over what a connection keeps (ws_max_message_bytes, {kept.limit} bytes). Send "
            "the history in input, use store: true to continue long conversations through the "
            "response store, or compact the history (POST /v1/responses/compact, or "
            "context_management) before it grows this long",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return merged_body(body, kept.items), kept.response_id
