"""The stateful half of `/v1/responses` in the shell: who may see what, the context a request
continues, and the store's housekeeping.

- **Scope** (scope.py): a response belongs to the credential that created it — a SHA-256 of the
  `Authorization` bearer token, or of the `store_scope_header` value; no credential at all is
  one shared scope. Every read is by scope: another credential gets 404, never the data.
- **Context**: `prepare(body, scope, render)` resolves `previous_response_id` (the chain's
  input and output items), `conversation` (its items) and `item_reference` input
  items from the store, merges them into a body (`proxy.harmony.history.chain`) and renders that
  body through the one `render` seam every request takes. Malformed id → 400; a
  `previous_response_id` that is unknown, another credential's, or whose chain is no longer
  whole → 400 `previous_response_not_found`, as OpenAI answers it; an unknown conversation or
  referenced item → 404; store down → 503, all before anything reaches upstream; errors of
  the merged input are told in the request's own item numbers.
- **Recorders** (recording.py, above this module) carry each stored response's writes to the one
  `StoreWriter`; a running one is listed in `running` while it runs.
- **Leases**: a running stored response is vouched for by its process (`Lease` every
  `HEARTBEAT` seconds). A reader that finds one past its lease ends it as failed
  (`end_abandoned`): a crashed process never leaves a response `in_progress` for ever.
- **Housekeeping**: expired entries swept, gauges refreshed, every `SWEEP_PERIOD` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.config.settings import Settings
from proxy.errors import ClientError, StoreUnavailableError
from proxy.harmony.history import chain as history
from proxy.harmony.history import conversation as conv
from proxy.harmony.history.stored import (
    RUNNING,
    StoredResponse,
    as_it_stands,
    decode_events,
    encode_events,
    ended_events,
)
from proxy.harmony.request.fields import check_response_id, previous_not_found
from proxy.harmony.request.prepare import PreparedRequest
from proxy.harmony.response import IdFactory
from proxy.metrics.serving import Metrics
from proxy.store import Append, Entry, Lease, Op, Store, StoreError, Update
from proxy.store.measured import Measured
from proxy.store.writer import StoreWriter
from proxy.tracing import Tracing

#: Seconds between lease renewals of running responses, and how long a lease lasts.
HEARTBEAT = 5.0
LEASE_SECONDS = 3 * HEARTBEAT
SWEEP_PERIOD = 60.0

#: The render seam: a body in, the prepared request out (400s as `ClientError`).
Render = Callable[[dict[str, Any]], Awaitable[PreparedRequest]]


@dataclass(frozen=True, slots=True)
class Context:
    """What a request continues and how it is stored (the echo is already applied)."""

    body: dict[str, Any]
    #: The items the response is generated from, as stored and listed (`input_items`).
    input: list[dict[str, Any]]
    chain: tuple[str, ...] = ()
    previous_response_id: str | None = None
    background: bool = False
    #: Whether the response itself is stored (`store`).
    store: bool = True
    #: The conversation the response belongs to, and its own input items as that
    #: conversation keeps them: appended, with the output items, when it ends.
    conversation: str | None = None
    appended: tuple[dict[str, Any], ...] = ()

    @property
    def recorded(self) -> bool:
        """Whether the response has writes to make: its own record, or its conversation's."""
        return self.store or self.conversation is not None


@dataclass
class Loaded:
    """A stored response as a reader sees it now."""

    key: str
    record: StoredResponse
    entry: Entry
    #: The response object as it stands (the record's, or replayed from the events so far).
    response: dict[str, Any] = field(default_factory=dict)


class Stateful:
    """Scopes, contexts, leases and housekeeping over one store (module doc)."""

    lease_seconds = LEASE_SECONDS

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        ids: IdFactory,
        clock: Callable[[], float],
        logger: logging.Logger,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self._tracing = tracing
        self.metrics = metrics
        self.ids = ids
        self.clock = clock
        self._logger = logger
        #: Ids of the stored responses running in this process (their leases are renewed).
        self.running: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._store: Store | None = None
        self._writer: StoreWriter | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise StoreUnavailableError("the response store is not open")
        return self._store

    @property
    def writer(self) -> StoreWriter:
        if self._writer is None:
            raise StoreUnavailableError("the response store is not open")
        return self._writer

    # -- lifespan -------------------------------------------------------------------------------

    def start(self, store: Store) -> None:
        """Take `store` (measured; the lifespan opened it) and start the writer and chores."""
        self._store = Measured(store, self.metrics, tracing=self._tracing)
        self._writer = StoreWriter(self._store, self._write_failed)
        self.writer.start()
        self._tasks = [
            asyncio.create_task(self._every(HEARTBEAT, self._renew_leases)),
            asyncio.create_task(self._every(SWEEP_PERIOD, self._sweep)),
        ]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._writer is not None:
            await self._writer.aclose(self.settings.store_timeout)
        if self._store is not None:
            await self._store.aclose()
        self._store = self._writer = None

    async def _every(self, seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await work()
            except StoreError as exc:  # counted by the Measured store; try again next round
                self.log_failure("store housekeeping failed", None, exc)
            await asyncio.sleep(seconds)

    async def _renew_leases(self) -> None:
        if not self.running:
            return
        until = self.clock() + LEASE_SECONDS
        self.writer.schedule(_Writes([Lease(key, until) for key in self.running]))

    async def _sweep(self) -> None:
        await self.store.sweep(self.clock())
        await self.store.stats()

    def _write_failed(self, error: StoreError, count: int, dropped: bool) -> None:
        if dropped:
            self.metrics.store.errors.labels("apply").inc()
        self.log_failure("store write failed", None, error, writes=count)

    def log_failure(
        self, message: str, key: str | None, error: BaseException, **extra: Any
    ) -> None:
        detail = str(error) or type(error).__name__
        self._logger.warning(message, extra={"response_id": key, "error": detail, **extra})

    # -- the context of a request ---------------------------------------------------------------

    async def prepare(
        self, body: dict[str, Any], scope: str, render: Render
    ) -> tuple[PreparedRequest, Context]:
        """Resolve, merge and render `body` (module docstring)."""
        previous = body.get("previous_response_id")
        conversation = body.get("conversation")
        if previous is not None and conversation is not None:
            raise conv.exclusive()
        chain: tuple[str, ...] = ()
        items: list[Any] = []
        source = "previous_response_id"
        if previous is not None:
            previous = check_response_id(previous, "previous_response_id")
            chain, items = await self._chain(scope, previous)
        elif conversation is not None:
            conversation = conv.conversation_param(conversation)
            items = [
                i for _, i in await self.conversation_items(scope, conversation, "conversation")
            ]
            source = "conversation"
        found = await self.references(scope, body.get("input"))
        own = history.with_references(body, found) if found else body
        if conversation is not None:
            conv.check_input_ids(items, own.get("input"))
        merged = history.merged_body(own, items) if previous or conversation else own
        try:
            prepared = await render(merged)
        except ClientError as error:
            raise history.local_error(error, len(items), source) from None
        background = body.get("background") is True
        echo = {
            **prepared.echo,
            "previous_response_id": previous,
            "background": background,
            "conversation": None if conversation is None else {"id": conversation},
        }
        prepared = replace(prepared, echo=echo)
        listed = (
            history.stored_input(own["input"], self.ids)
            if prepared.store or conversation is not None
            else []
        )
        context = Context(
            body=merged,
            # A conversation's items are part of what the response was made from (listed by
            # `input_items`, and continued by a later `previous_response_id` to it).
            input=([*items, *listed] if conversation is not None else listed)
            if prepared.store
            else [],
            chain=chain,
            previous_response_id=previous,
            background=background,
            store=prepared.store,
            conversation=conversation,
            appended=tuple(listed) if conversation is not None else (),
        )
        return prepared, context

    async def conversation_items(
        self, scope: str, key: str, param: str = "conversation_id"
    ) -> list[tuple[int, dict[str, Any]]]:
        """(mark, item) of the conversation `key` as `scope` sees it, oldest first; 404 naming
        `param` when it is not found."""
        entry = await self.guard(self.store.get(scope, key))
        if entry is None:
            raise conv.not_found(key, param)
        return conv.decode_items(await self.guard(self.store.read_log(key)))

    async def _chain(self, scope: str, previous: str) -> tuple[tuple[str, ...], list[Any]]:
        """The ids and the history items of the chain that ends with `previous`."""
        entry = await self.guard(self.store.get(scope, previous))
        if entry is None:
            raise previous_not_found(previous)
        last = StoredResponse.decode(entry.doc)
        if last.status in RUNNING:
            raise ClientError(
                f"Previous response with id '{previous}' is still {last.status}: continue from "
                "it once it has ended.",
                param="previous_response_id",
                code="previous_response_in_progress",
            )
        chain = (*last.chain, previous)
        earlier = await self.guard(self.store.get_many(scope, list(last.chain)))
        records = []
        for key, found in zip(last.chain, earlier, strict=True):
            if found is None:
                raise previous_not_found(
                    previous,
                    f"it continues response '{key}', which is no longer stored (deleted, "
                    "expired or evicted)",
                )
            records.append(StoredResponse.decode(found.doc))
        records.append(last)
        return chain, history.history_items(
            [(record.input, record.response.get("output") or []) for record in records]
        )

    async def references(self, scope: str, value: Any, path: str = "input") -> dict[int, Any]:
        """The stored items the `item_reference` items of `value` (a request's `input`, or the
        `items` of a conversation call, named by `path`) name, by index."""
        found: dict[int, Any] = {}
        for index, ref in history.references(value):
            key = await self.guard(self.store.resolve(scope, ref))
            entry = None if key is None else await self.guard(self.store.get(scope, key))
            item = None if entry is None else _item(StoredResponse.decode(entry.doc), ref)
            if item is None:
                raise ClientError(
                    f"Item with id '{ref}' not found.",
                    status=404,
                    param=f"{path}[{index}].id",
                    code="item_not_found",
                )
            found[index] = item
        return found

    async def guard(self, work: Awaitable[Any]) -> Any:
        """A store read on a request's path: bounded by `store_timeout`, 503 when it fails."""
        try:
            async with asyncio.timeout(self.settings.store_timeout):
                return await work
        except (StoreError, TimeoutError) as exc:
            raise StoreUnavailableError("the response store is unavailable; retry shortly") from exc

    # -- readers ------------------------------------------------------------------------------

    async def load(self, scope: str, key: str) -> Loaded | None:
        """The response `key` as `scope` sees it now (None: not found); a running response's
        output is replayed from its events, and one whose runner is gone is ended."""
        entry = await self.guard(self.store.get(scope, key))
        if entry is None:
            return None
        record = StoredResponse.decode(entry.doc)
        loaded = Loaded(key, record, entry, record.response)
        if record.status not in RUNNING:
            return loaded
        events = decode_events(await self.guard(self.store.read_log(key)))
        loaded.response = as_it_stands(record.response, events)
        if loaded.response["status"] in RUNNING and self.abandoned(entry):
            await self.end_abandoned(loaded, events)
        return loaded

    def abandoned(self, entry: Entry) -> bool:
        """Its runner stopped vouching for it: the process is gone (or cut off the store)."""
        return entry.lease < self.clock() and entry.key not in self.running

    async def end_abandoned(self, loaded: Loaded, events: list[dict[str, Any]]) -> None:
        """End a response whose runner is gone, as failed (module docstring)."""
        next_sequence = events[-1]["sequence_number"] + 1 if events else 0
        message = "the proxy process running this response stopped before it ended"
        ending = ended_events(loaded.response, next_sequence, "runner_gone", message)
        mark, data = encode_events(ending)
        loaded.response = ending[-1]["response"]
        loaded.record = replace(loaded.record, response=loaded.response)
        ops: list[Op] = [Append(loaded.key, mark, data), Update(loaded.key, loaded.record.encode())]
        await self.guard(self.store.apply(ops))


def _item(record: StoredResponse, item_id: str) -> Any:
    for item in [*record.input, *(record.response.get("output") or [])]:
        if isinstance(item, dict) and item.get("id") == item_id:
            return item
    return None


class _Writes:
    """Fixed writes as a writer source (lease renewals)."""

    def __init__(self, ops: list[Op]) -> None:
        self._ops = ops

    def take(self) -> list[Op]:
        ops, self._ops = self._ops, []
        return ops
