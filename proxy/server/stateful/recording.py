"""One stored response's writes: the `Recorder` hands its events to the store writer.

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
Once the record is created, the recorder keeps what the end needs of it (the input items, the
chain) as the encoded bytes, not as Python objects: a few hundred bytes per open stream instead
of their dicts (bench/stream_memory.py).

A response created with `conversation` also adds, in the same batch as its end, its
input items and then its output items to the conversation (one `Push`: concurrent responses'
items never interleave), when it ended `completed` or `incomplete`. A failed or cancelled one
adds nothing, so the client can send the same request again. With `store: false` the response
itself is not kept (`keep` false): only the conversation's items are written.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from proxy.harmony.history.conversation import encode_items
from proxy.harmony.history.stored import StoredResponse, encode_events, encode_record
from proxy.server.stateful.state import Context, Stateful
from proxy.store import Append, Create, Op, Push, StoreError, Update


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
        keep: bool = True,
    ) -> None:
        self.key = key
        self.scope = scope
        self.record = record
        self._stateful = stateful
        self._keep = keep
        self._created = created or not keep
        self._pending: list[dict[str, Any]] = []
        #: The terminal snapshot, until it is taken.
        self._final: dict[str, Any] | None = None
        #: The record without its response, encoded, once it is in the store (module doc).
        self._rest: bytes | None = None
        if created and keep:
            self._rest, self.record = record.rest(), _GONE
        #: The conversation the response adds its items to, and its input items.
        self.conversation: tuple[str, tuple[dict[str, Any], ...]] | None = None
        self._added: tuple[dict[str, Any], ...] = ()
        self.finished = False
        if keep:
            stateful.running.add(key)  # its lease is renewed while it runs

    def add(self, events: list[dict[str, Any]]) -> None:
        """Events written to the client (or, in the background, to no one); not the last."""
        if not events or not self._keep:
            return
        if not self._created and not self.record.response:
            # The record starts as the first event's snapshot (`response.created`).
            self.record = replace(self.record, response=events[0]["response"])
        self._pending += events
        self._stateful.writer.schedule(self)

    async def finish(self, events: list[dict[str, Any]], *, wait: bool = True) -> None:
        """The terminal batch: stored before the client sees it when `wait` (module doc)."""
        if self.end(events) and wait:
            await self.stored()

    def end(self, events: list[dict[str, Any]]) -> bool:
        """Hand over the terminal batch, to be written in the next batch; True when the caller
        is to `await stored()` before the client sees its terminal event."""
        if self.finished:
            return False
        self.finished = True
        self._stateful.running.discard(self.key)
        if events:
            self.add(events)
            ended = events[-1]["response"]
            if self._keep:
                self._final = ended
            if self.conversation is not None and ended["status"] in _ADDED_WHEN:
                self._added = (*self.conversation[1], *(ended.get("output") or []))
        if not self._keep and not self._added:
            return False  # nothing to write
        self._stateful.writer.schedule(self)
        # Nobody waits on a failing store: the stream's end is not held for it.
        return self._stateful.writer.healthy

    async def stored(self) -> None:
        """Wait until what `end` handed over is applied (bounded by `store_timeout`); a
        failure is logged, the stream ends all the same."""
        try:
            async with asyncio.timeout(self._stateful.settings.store_timeout):
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
            if self._keep:
                self._rest, self.record = self.record.rest(), _GONE
        if self._pending:
            mark, data = encode_events(self._pending)
            self._pending = []
            ops.append(Append(self.key, mark, data))
        if self._final is not None:
            final, self._final = self._final, None
            output = final.get("output") or []
            rest = self._rest if self._rest is not None else self.record.rest()
            ops.append(
                Update(
                    self.key,
                    encode_record(final, rest),
                    lease=0.0,
                    aliases=tuple(item["id"] for item in output if item.get("id")),
                )
            )
        if self._added and self.conversation is not None:
            added, self._added = self._added, ()
            ops.append(Push(self.conversation[0], encode_items(added)))
        return ops


#: What a recorder's `record` is once the store has it (module docstring).
_GONE = StoredResponse({})
#: The statuses whose items a conversation keeps (module docstring).
_ADDED_WHEN = frozenset({"completed", "incomplete"})


def recorder(
    stateful: Stateful, key: str, scope: str, context: Context, *, created: bool = False
) -> Recorder:
    """The recorder of the response `key` of `scope`, continuing `context` (`created`: its
    record is in the store already, as a background response's is)."""
    record = StoredResponse({}, context.input, context.chain, context.background)
    made = Recorder(stateful, key, scope, record, created=created, keep=context.store)
    if context.conversation is not None:
        made.conversation = (context.conversation, context.appended)
    return made
