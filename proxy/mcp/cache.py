"""The tool lists of MCP servers, kept for a bounded time per server URL and credential.

The key holds a hash of the headers the client sent to that server, never the headers: two
callers with different credentials never share a list, and the cache holds no secret.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import orjson


def credential_key(url: str, headers: Mapping[str, str] | None) -> str:
    """The cache key of `url` listed with `headers` (header names case-folded)."""
    folded = sorted((name.lower(), value) for name, value in (headers or {}).items())
    digest = hashlib.sha256(orjson.dumps(folded)).hexdigest()
    return f"{url}\n{digest}"


class ToolCache:
    """At most `entries` lists, each kept `ttl` seconds (0: nothing is kept)."""

    def __init__(self, ttl: float, entries: int, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._entries = entries
        self._clock = clock
        self._lists: OrderedDict[str, tuple[float, list[dict[str, Any]]]] = OrderedDict()

    def get(self, key: str) -> list[dict[str, Any]] | None:
        found = self._lists.get(key)
        if found is None:
            return None
        expires, tools = found
        if self._clock() >= expires:
            del self._lists[key]
            return None
        self._lists.move_to_end(key)
        return tools

    def put(self, key: str, tools: list[dict[str, Any]]) -> None:
        if self._ttl <= 0 or self._entries <= 0:
            return
        self._lists[key] = (self._clock() + self._ttl, tools)
        self._lists.move_to_end(key)
        while len(self._lists) > self._entries:
            self._lists.popitem(last=False)
