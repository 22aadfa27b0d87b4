"""A body's `input` as a list of items. `input` may be a string: it is one user message, in the
shape a client would send it (OpenAI's `EasyInputMessage`, `{"role": "user", "content": text}`).

Every reader of `input` takes it through `as_items`, so a string input renders, is stored, is
continued and is compacted as that one message, the same everywhere.
"""

from __future__ import annotations

from typing import Any


def as_items(value: Any) -> list[Any]:
    """`input` as a list of items: a string is one user message, a list is itself (copied),
    anything else (absent, or a shape the renderer refuses) is no item."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []
