"""A stored stream's end: the last frame's tokens reach the client at once, its terminal event
only once the response is stored (a retrieve after `response.completed` finds it completed)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import orjson
from openai_harmony import HarmonyEncoding

from proxy.store.base import Op, Update
from proxy.store.memory import MemoryStore
from tests.stateful_support import MODEL, stack


class GatedStore(MemoryStore):
    """A memory store whose writes of a response's end wait until `gate` opens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.held = threading.Event()  # an end's write is waiting at the gate

    async def apply(self, ops: Sequence[Op]) -> int:
        if any(isinstance(op, Update) for op in ops):
            self.held.set()
            await asyncio.to_thread(self.gate.wait, 10)
        return await super().apply(ops)


def test_the_last_frame_goes_out_before_the_commit_and_the_terminal_event_after(
    encoding: HarmonyEncoding,
) -> None:
    store = GatedStore()
    with stack(encoding, store, store_timeout=15.0) as running:
        seen: list[dict[str, Any]] = []
        with (
            httpx.Client(base_url=running.base_url, timeout=20) as client,
            client.stream(
                "POST",
                "/responses",
                json={"model": MODEL, "input": "Where is my order?", "stream": True},
                headers={"X-Sim-Tokens": "60"},
            ) as answer,
        ):
            lines = answer.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    seen.append(orjson.loads(line[6:]))
                    done = seen[-1]["type"] == "response.output_item.done"
                    if done and seen[-1]["item"]["type"] == "message":
                        break
            # Every event of the end but the terminal one arrived while its write waits.
            assert store.held.wait(10)
            assert not store.gate.is_set()
            types = [event["type"] for event in seen]
            assert "response.output_text.done" in types
            assert "response.completed" not in types
            key = seen[0]["response"]["id"]
            assert client.get(f"/responses/{key}").json()["status"] == "in_progress"
            store.gate.set()
            for line in lines:
                if line.startswith("data: "):
                    seen.append(orjson.loads(line[6:]))
        assert seen[-1]["type"] == "response.completed"
        assert [event["sequence_number"] for event in seen] == list(range(len(seen)))
        with httpx.Client(base_url=running.base_url, timeout=20) as client:
            assert client.get(f"/responses/{key}").json()["status"] == "completed"
