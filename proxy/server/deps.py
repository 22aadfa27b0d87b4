"""What every request of one app shares: its `ServerState` (what upstream can do, the counts the
drain waits for), the `RepairDeps` an exchange is given, and the drain's bound on waiting
(`until_drained`). Built once per app (services.py), read by the exchanges (exchange.py), the
pass-through relay (relay.py) and the routes (routes/)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.errors import ClientError, UnavailableError
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.response import IdFactory
from proxy.harmony.stream.parser import TokenTable
from proxy.metrics.genai import GenAIMetrics
from proxy.metrics.serving import Metrics
from proxy.server.rendering.renderer import Renderer
from proxy.tracing import Tracing
from proxy.upstream.client import Upstream
from proxy.upstream.probe import Capability

T = TypeVar("T")

#: The error code of requests the drain ended (not upstream's fault: not counted as such).
SHUTTING_DOWN = "server_shutting_down"
#: The 429's code when the proxy serves `max_concurrent_streams` already.
TOO_MANY_STREAMS = "too_many_streams"

_UNKNOWN = Capability(False, False, "upstream not probed yet")
#: Seconds a request waits for the first capability probe to end (capability.py): above the
#: few seconds a probe takes from a busy upstream, below a client's patience.
FIRST_PROBE_WAIT = 10.0


@dataclass
class ServerState:
    """Mutable state shared by all requests of one app (owned by the app, injected here)."""

    capability: Capability = _UNKNOWN
    #: Set once the first capability probe has ended (capability.py): until then requests
    #: wait for it rather than take `_UNKNOWN` for upstream's answer.
    probed: asyncio.Event = field(default_factory=asyncio.Event)
    first_probe_wait: float = FIRST_PROBE_WAIT
    in_flight: int = 0
    #: Requests being handled on the proxy's own routes (`Counted`, routes/answers.py), for
    #: the drain (processes/runner.py).
    active: int = 0
    draining: bool = False
    #: Set on the loop when the drain starts: what WebSocket sessions wait on to end.
    drain_started: asyncio.Event = field(default_factory=asyncio.Event)
    #: True once the drain period is over: open streams end with `response.failed`.
    force_end: bool = False
    #: What wakes each open stream's wait for its next frame when the drain is over (a
    #: callback per stream, not a task per stream: a task costs memory per open stream).
    interrupts: set[Callable[[], None]] = field(default_factory=set)

    def end_all(self) -> None:
        """The drain period is over: every open stream ends now."""
        self.force_end = True
        for interrupt in list(self.interrupts):
            interrupt()


@dataclass(frozen=True)
class RepairDeps:
    """Everything an exchange needs, injected by the app factory: every seam (encoding, upstream,
    metrics, ids, clocks, renderer) is a field, none a module global."""

    settings: Settings
    encoding: HarmonyEncoding
    upstream: Upstream
    metrics: Metrics
    state: ServerState
    log: Callable[..., None]
    ids: IdFactory
    #: Rendered system + developer prompts, shared by the requests of one app.
    prefixes: PrefixCache
    #: Validation + rendering, off the event loop (rendering/pool.py); it opens input
    #: reasoning with the same keys and applies `max_prompt_tokens`.
    renderer: Renderer
    #: Seal `encrypted_content` of output reasoning items.
    reasoning_keys: ReasoningKeys
    #: The bytes of token ids, shared by the streams of one app (None: one per stream).
    tokens: TokenTable | None = None
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    #: The GenAI server histograms (metrics/genai.py); None: not counted.
    genai: GenAIMetrics | None = None
    #: Traces (proxy/tracing.py); None: off, and no span is made.
    tracing: Tracing | None = None


def check_stream_room(deps: RepairDeps) -> None:
    """Raise 429 `too_many_streams` when the proxy serves `max_concurrent_streams` upstream
    streams already (each repaired response, each compaction pass, counts as one)."""
    limit = deps.settings.max_concurrent_streams
    if limit and deps.state.in_flight >= limit:
        raise ClientError(
            f"the proxy is serving its limit of {limit} streams; retry shortly",
            status=429,
            code=TOO_MANY_STREAMS,
        )


async def until_drained(state: ServerState, work: Awaitable[T]) -> T:
    """`await work`, unless the drain period ends first: then 503 `server_shutting_down` (a
    request still rendering or waiting for upstream's head at the drain timeout gets a JSON 503,
    never a 500 from uvicorn's cancellation)."""
    timer: asyncio.Timeout | None = None

    def interrupt() -> None:
        if timer is not None and not timer.expired():
            timer.reschedule(asyncio.get_running_loop().time())

    state.interrupts.add(interrupt)
    try:
        if state.force_end:
            raise TimeoutError
        async with asyncio.timeout(None) as timer:
            return await work
    except TimeoutError:
        if not state.force_end:
            raise
        raise UnavailableError(
            "the proxy is shutting down; retry on another replica", code=SHUTTING_DOWN
        ) from None
    finally:
        state.interrupts.discard(interrupt)
        if asyncio.iscoroutine(work):
            work.close()  # never awaited when the drain had already ended
