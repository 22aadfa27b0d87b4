"""What happened to each request, kept where tests and demos can read it.

`app.state.simulator` is a `SimulatorState`; `.requests` holds one `RequestRecord` per request
in arrival order (the last `record_limit`). A record is filled in as the exchange goes on and is
final once `closed_at` is set: the response was sent in full, the simulator cut the connection
(a fault, or the broken stream upstream would send), or the client went away — the moment the
simulator saw the connection close, on its monotonic clock, when it also stopped generating
(upstream aborts a request whose client disconnected). `await record.wait_closed()` waits for it.

Iteration statistics for `GET /metrics` are collected here too (upstream's endpoint drains its
stats queue on each read).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai_harmony import HarmonyEncoding

from proxy.harmony.response import IdFactory, random_id
from proxy.simulator.config import SimulatorConfig
from proxy.simulator.model import ScriptedModel


@dataclass(slots=True, eq=False)
class RequestRecord:
    """One request as the simulator served it (module doc). Times are monotonic seconds."""

    number: int
    method: str
    path: str
    started_at: float
    request_id: str | None = None  # the client's X-Request-Id
    traceparent: str | None = None  # the W3C trace context the request carried
    peer: tuple[str, int] | None = None  # the client's address and port: its connection
    stream: bool | None = None
    status: int | None = None  # HTTP status sent (None: nothing sent)
    prompt_ids: tuple[int, ...] = ()  # what the model was given
    token_ids: list[int] = field(default_factory=list)  # generated ids that reached the wire
    frames_sent: int = 0  # body chunks written
    finish_reason: str | None = None  # the finish that reached the wire
    stop_reason: int | None = None
    # Faults that fired, as specs; "upstream-broken-stream" where upstream's own stream breaks.
    faults: list[str] = field(default_factory=list)
    completed: bool = False  # the response was sent in full
    cut: bool = False  # the simulator closed the connection mid-response
    disconnected: bool = False  # the client closed it before the response was complete
    closed_at: float | None = None
    _closed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def tokens_sent(self) -> int:
        return len(self.token_ids)

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    async def wait_closed(self, timeout: float | None = None) -> None:
        """Wait until the exchange is over (TimeoutError after `timeout` seconds)."""
        async with asyncio.timeout(timeout):
            await self._closed.wait()

    def close(self, at: float, *, completed: bool = False, cut: bool = False) -> None:
        """The exchange ended at `at`; the first call wins."""
        if self.closed_at is not None:
            return
        self.closed_at = at
        self.completed = completed
        self.cut = cut
        self._closed.set()

    def deliver(self, token_ids: Sequence[int]) -> None:
        """These generated ids went out (streamed in a frame, or in the whole body)."""
        self.token_ids += token_ids

    def client_gone(self, at: float) -> None:
        if self.closed_at is None:
            self.disconnected = True
        self.close(at)


class SimulatorState:
    """Shared by all requests of one app: config, encoding, model, the seams (response ids,
    wall clock, monotonic clock), records, stats."""

    def __init__(
        self,
        config: SimulatorConfig,
        encoding: HarmonyEncoding,
        *,
        ids: IdFactory = random_id,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.encoding = encoding
        self.model = ScriptedModel(encoding)
        self.ids = ids
        self.clock = clock
        self.monotonic = monotonic
        self.requests: deque[RequestRecord] = deque(maxlen=config.record_limit)
        self.active = 0
        self._count = 0
        self._iteration = 0
        self._stats: deque[tuple[int, int, float, int, float]] = deque(maxlen=1000)

    def open(self, method: str, path: str, request_id: str | None) -> RequestRecord:
        """A new record (request numbers count from 1: the engine request id)."""
        self._count += 1
        record = RequestRecord(self._count, method, path, self.monotonic(), request_id)
        self.requests.append(record)
        return record

    def find(self, number: int) -> RequestRecord | None:
        return next((r for r in reversed(self.requests) if r.number == number), None)

    def iteration(self, tokens: int, latency: float) -> None:
        """Note one engine output for the iteration statistics (cheap: built when read)."""
        self._stats.append((self._iteration, tokens, latency, self.active, time.time()))
        self._iteration += 1

    def drain_stats(self) -> list[dict[str, Any]]:
        """The statistics noted since the last read, in upstream's JSON (values simulated)."""
        stats = [_iteration_stats(*noted) for noted in self._stats]
        self._stats.clear()
        return stats


def _iteration_stats(
    iteration: int, tokens: int, latency: float, active: int, at: float
) -> dict[str, Any]:
    return {
        "iter": iteration,
        "iterLatencyMS": round(latency * 1000.0, 3),
        "timestamp": time.strftime("%m-%d-%Y %H:%M:%S", time.localtime(at)),
        "numActiveRequests": active,
        "numQueuedRequests": 0,
        "numCompletedRequests": 0,
        "maxNumActiveRequests": 2048,
        "maxBatchSizeRuntime": 2048,
        "gpuMemUsage": 0,
        "cpuMemUsage": 0,
        "pinnedMemUsage": 0,
        "inflightBatchingStats": {
            "numScheduledRequests": active,
            "numContextRequests": 0,
            "numGenRequests": active,
            "numPausedRequests": 0,
            "numCtxTokens": 0,
            "microBatchId": 0,
            "avgNumDecodedTokensPerIter": float(tokens),
        },
        "kvCacheStats": {
            "maxNumBlocks": 65536,
            "freeNumBlocks": 65536,
            "usedNumBlocks": 0,
            "tokensPerBlock": 32,
            "allocTotalBlocks": 0,
            "allocNewBlocks": 0,
            "reusedBlocks": 0,
            "missedBlocks": 0,
            "cacheHitRate": 0.0,
        },
    }
