"""An independent check of every repaired stream, as it is written (sans-IO).

The core builds done texts from its own deltas, so they agree by construction; this check does
not trust that. It follows the events the shell writes and verifies that each item's deltas
concatenate to its done text and that the terminal snapshot carries the same texts. A failure
is a bug in the proxy: it is counted (`proxy_selfcheck_failures_total`, an alert) and logged.
Cost: one CRC-32 per delta, a few integers per item.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

from proxy.harmony.stream.events import TERMINAL_EVENTS

_TEXT_DONE = {
    "response.output_text.done": "text",
    "response.reasoning_text.done": "text",
    "response.function_call_arguments.done": "arguments",
}


def _crc(text: str, previous: int = 0) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogatepass"), previous)


def _item_text(item: dict[str, Any]) -> str:
    if item.get("type") == "function_call":
        return str(item.get("arguments", ""))
    return "".join(str(part.get("text", "")) for part in item.get("content") or [])


class SelfCheck:
    """Feed it the events written; `problem` is None while everything agrees."""

    __slots__ = ("_deltas", "_done", "problem")

    def __init__(self) -> None:
        self._deltas: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self.problem: str | None = None

    def observe(self, events: Iterable[dict[str, Any]]) -> None:
        for event in events:
            kind = event["type"]
            if kind.endswith(".delta"):
                item_id = event["item_id"]
                self._deltas[item_id] = _crc(event["delta"], self._deltas.get(item_id, 0))
            elif kind in _TEXT_DONE:
                if _crc(event[_TEXT_DONE[kind]]) != self._deltas.get(event["item_id"], 0):
                    self._fail(f"{kind} text differs from its deltas")
            elif kind == "response.output_item.done":
                item = event["item"]
                self._done[item["id"]] = _crc(_item_text(item))
                if self._done[item["id"]] != self._deltas.get(item["id"], 0):
                    self._fail("output_item.done text differs from its deltas")
            elif kind in TERMINAL_EVENTS:
                output = event["response"].get("output") or []
                if [item.get("id") for item in output] != list(self._done):
                    self._fail("terminal snapshot items differ from the done items")
                for item in output:
                    if _crc(_item_text(item)) != self._done.get(item.get("id"), -1):
                        self._fail("terminal snapshot text differs from the done item")

    def _fail(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem
