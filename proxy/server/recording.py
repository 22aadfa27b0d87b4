"""One stored response's writes: the `Recorder` hands its events to the store writer (issue 13).

The exchange calls `add(events)` for every batch it writes (cheap: a list append and a wake-up
of the writer task; nothing is serialised or awaited on the way to the client) and
`finish(terminal_batch)` for the last one, which waits — bounded by `store_timeout` — until the
store has the response in its terminal state, so that a client that reads it back or continues
from it right after the terminal event finds it (read-your-writes, also across replicas). A
store that fails or lags costs the stored copy, never the client's stream: the failure is
logged and counted (`proxy_store_errors_total`).

The writer calls `take()` when it gets to this recorder: the record is created with the first
events (`Create`: the response as `response.created` carried it, the input items as listed,
aliases for their ids), every later batch is one `Append` however many frames piled up, and the
end replaces the record with the terminal snapshot (`Update`, aliases for the output items).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from proxy.harmony.stored import StoredResponse, encode_events
from proxy.store import Append, Create, Op, StoreError, Update

if TYPE_CHECKING:
    from proxy.server.stateful import Stateful


class Recorder:
    """The writes of one stored response (module docstring)."""

    def __init__(
        self,
        stateful: Stateful,
        key: str,
        scope: str,
        record: StoredResponse,
        *,
        created: bool = False,
    ) -> None:
        self.key = key
        self.scope = scope
        self.record = record
        self._stateful = stateful
        self._created = created
        self._pending: list[dict[str, Any]] = []
        self._final: StoredResponse | None = None
        self.finished = False
        stateful.running[key] = self

    def add(self, events: list[dict[str, Any]]) -> None:
        """Events written to the client (or, in the background, to no one); not the last."""
        if not events:
            return
        if not self._created and not self.record.response:
            # The record starts as the first event's snapshot (`response.created`).
            self.record = replace(self.record, response=events[0]["response"])
        self._pending += events
        self._stateful.writer.schedule(self)

    async def finish(self, events: list[dict[str, Any]], *, wait: bool = True) -> None:
        """The terminal batch: stored before the client sees it when `wait` (module doc)."""
        if self.finished:
            return
        self.finished = True
        self._stateful.running.pop(self.key, None)
        if events:
            self.add(events)
            self._final = replace(self.record, response=events[-1]["response"])
        if not wait or not self._stateful.writer.healthy:
            # Nobody to serve (or the store is failing: the stream's end is not held for it).
            self._stateful.writer.schedule(self)
            return
        settings = self._stateful.settings
        try:
            async with asyncio.timeout(settings.store_timeout):
                await self._stateful.writer.flush(self)
        except (StoreError, TimeoutError) as exc:
            # Logged here; counted by the store's metrics (apply) or the writer (dropped).
            self._stateful.log_failure("store write failed", self.key, exc)

    def take(self) -> list[Op]:
        ops: list[Op] = []
        stateful = self._stateful
        if not self._created:
            self._created = True
            now = stateful.clock()
            ops.append(
                Create(
                    self.key,
                    self.scope,
                    self.record.encode(),
                    created=now,
                    expires=now + stateful.settings.store_ttl,
                    lease=now + stateful.lease_seconds,
                    aliases=tuple(item["id"] for item in self.record.input),
                )
            )
        if self._pending:
            mark, data = encode_events(self._pending)
            self._pending = []
            ops.append(Append(self.key, mark, data))
        if self._final is not None:
            final, self._final = self._final, None
            output = final.response.get("output") or []
            ops.append(
                Update(
                    self.key,
                    final.encode(),
                    lease=0.0,
                    aliases=tuple(item["id"] for item in output if item.get("id")),
                )
            )
        return ops


#: A recorder factory for the exchange: `(response id) -> Recorder`.
RecorderFactory = Callable[[str], Recorder]
