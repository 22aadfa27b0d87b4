"""The store interface: one small async API, every backend behind it.

Theory of operation
-------------------
The store keeps *entries*. An entry is one stored thing — a response or a conversation — and
every backend keeps the same parts of it:

    key       its id (`resp_…`), unique in the whole store
    scope     who may see it: a hash of the credential that created it. Every read takes the
              reader's scope and answers "not found" for another scope's entry (isolation)
    doc       one document (bytes), replaced whole: for a response, its record
    log       entries in order, each tagged with an integer *mark* that only grows: for a
              response, its events in batches (`Append`: the mark is the batch's last
              `sequence_number`); for a conversation, one item per entry (`Push`: the store
              numbers them, so writers in any process never collide; `Remove` takes one out)
    aliases   further names under which the entry's scope finds its key (item ids → response)
    signals   named flags raised at most once (`cancel`): kept with the entry for later
              readers, and delivered to whoever waits for signals, in any process
    lease     until when a running process vouches for the entry (a crashed runner is seen)
    created, expires, size   retention: entries past `expires` are gone; past `max_bytes`
              the oldest entries are evicted first

Writes are plain data (`Create`, `Update`, `Append`, `Push`, `Remove`, `Signal`, `Lease`,
`Delete`) handed to
`apply` in batches: a batch is applied in order, in one transaction (SQLite) or one pipeline
(Redis). A write to a key that no longer exists (deleted, expired, evicted) does nothing, so a
response deleted while it runs is not brought back by its last events.

Reads: `get` / `get_many` (scope-checked), `read_log` (after a scope-checked `get`),
`resolve` (alias → key, scope-checked), `wait_log` (new log entries after a mark, waiting up to
a timeout: how a resume follows a response live), `next_signals` (signals raised anywhere).

Errors: every backend failure leaves as `StoreError` (`raise … from exc`), so the shell has one
exception to turn into a 503 or a logged, counted write failure.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

#: The signal `POST /v1/responses/{id}/cancel` raises.
CANCEL = "cancel"


class StoreError(Exception):
    """The store could not do what was asked (unreachable, full, corrupt): the shell answers 503
    for reads and background work, and logs and counts a failed write of a foreground stream."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored entry as read back (see the module docstring for the parts)."""

    key: str
    scope: str
    doc: bytes
    created: float
    expires: float
    lease: float = 0.0
    signals: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Create:
    """A new entry. An existing entry with the same key is replaced whole, log included."""

    key: str
    scope: str
    doc: bytes
    created: float
    expires: float
    lease: float = 0.0
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Update:
    """Replace an entry's document (and lease, when given); add aliases."""

    key: str
    doc: bytes
    lease: float | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Append:
    """Add one log entry; `mark` must exceed every earlier mark of the key (else ignored)."""

    key: str
    mark: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Push:
    """Add log entries after the entry's last one, in order; the store gives them marks above
    every mark the entry holds, in the same atomic step as the rest of the batch. So concurrent
    pushes from any process land one after the other, never interleaved, never lost (a
    conversation's items). An entry is written with `Append` or with `Push`, never both."""

    key: str
    data: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Remove:
    """Take the log entry with `mark` out of the entry's log (nothing when there is none)."""

    key: str
    mark: int


@dataclass(frozen=True, slots=True)
class Signal:
    """Raise the named signal on an entry (kept, and delivered to `next_signals` waiters)."""

    key: str
    name: str


@dataclass(frozen=True, slots=True)
class Lease:
    """The running process still vouches for the entry until `until`."""

    key: str
    until: float


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove the entry, its log and its aliases."""

    key: str


Op = Create | Update | Append | Push | Remove | Signal | Lease | Delete


@dataclass(frozen=True, slots=True)
class Stats:
    """What the store holds now (for the gauges)."""

    entries: int
    bytes: int


class Store(abc.ABC):
    """The interface every backend implements (module docstring). Backends are made by
    `proxy.store.open_store` from the `store_url` setting and owned by the app's lifespan."""

    #: Names the backend in metrics and logs: `sqlite`, `redis`, `memory`.
    kind: str = "store"

    @abc.abstractmethod
    async def apply(self, ops: Sequence[Op]) -> int:
        """Apply the writes in order, atomically where the backend can; evict oldest entries
        while over the size bound. Returns how many entries were evicted."""

    @abc.abstractmethod
    async def get_many(self, scope: str, keys: Sequence[str]) -> list[Entry | None]:
        """The entries of `keys` visible to `scope` (None: absent, expired or another scope's)."""

    async def get(self, scope: str, key: str) -> Entry | None:
        """The entry `key` if `scope` may see it."""
        (entry,) = await self.get_many(scope, [key])
        return entry

    @abc.abstractmethod
    async def read_log(self, key: str, after: int = -1) -> list[tuple[int, bytes]]:
        """Log entries with a mark above `after`, oldest first (the caller checked the scope)."""

    @abc.abstractmethod
    async def wait_log(self, key: str, after: int, timeout: float) -> list[tuple[int, bytes]]:
        """Like `read_log`, but when there is nothing yet, wait up to `timeout` seconds for it
        (an append in any process sharing the store wakes the wait)."""

    @abc.abstractmethod
    async def resolve(self, scope: str, alias: str) -> str | None:
        """The key of the entry `alias` names in `scope`, if any."""

    @abc.abstractmethod
    async def next_signals(self, timeout: float) -> list[tuple[str, str]]:
        """(key, name) of signals raised since the last call (in any process), waiting up to
        `timeout` seconds for one; the first call only starts listening."""

    @abc.abstractmethod
    async def sweep(self, now: float) -> int:
        """Forget what expired by `now`; returns how many entries went."""

    @abc.abstractmethod
    async def stats(self) -> Stats:
        """How many entries and bytes the store holds."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise `StoreError` unless the store answers."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release connections, threads and files (idempotent)."""


def entry_size(doc: bytes, aliases: Sequence[str] = ()) -> int:
    """What an entry's document and aliases count towards `max_bytes` (the log adds its data)."""
    return len(doc) + sum(len(alias) for alias in aliases)
