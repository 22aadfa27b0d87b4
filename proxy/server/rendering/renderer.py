"""The `Renderer` seam, and rendering on the event loop when that is cheap.

    await renderer.prepare(body) -> PreparedRequest      raises ClientError (4xx) / ProxyError

`prepare_request` (sans-IO, unchanged) holds the GIL while openai-harmony renders, and its BPE is
quadratic in one unbroken run of text, so a costly body renders in a worker process
(`pool.py`). A body that is provably cheap to render is rendered inline, on the loop, where it
costs less than a round trip to a worker. "Cheap" is judged on the orjson bytes that go to a
worker anyway (`is_cheap`): at most `INLINE_MAX_BYTES` bytes, `INLINE_MAX_OBJECTS` JSON objects
(each input item or content part is one: openai-harmony spends ~150 µs on every message) and no
run of non-whitespace bytes longer than `INLINE_MAX_RUN` (the BPE cost driver: one o200k
pre-token never spans whitespace, and JSON escapes only make a run look longer). Worst body
under all three: ~1.5 ms (bench/render_cost.py).

`InlineRenderer` renders everything on the loop: the pool's fast path, and the whole renderer
with `render_workers = 0`.
"""

from __future__ import annotations

from typing import Any, Protocol

from openai_harmony import HarmonyEncoding

from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.request.prepare import PreparedRequest
from proxy.server.rendering.pacer import Pacer
from proxy.server.rendering.worker import RenderOptions

#: Fast-path bounds, measured with bench/render_cost.py: the
#: costliest body within all three renders in ~1.5 ms; a worker round trip costs ~0.2-0.4 ms.
INLINE_MAX_BYTES = 2048
INLINE_MAX_OBJECTS = 6
INLINE_MAX_RUN = 512


class Renderer(Protocol):
    """Validates and renders a parsed `/v1/responses` body (the dict, possibly modified by the
    caller, e.g. with stored history merged into `input`)."""

    async def prepare(self, body: dict[str, Any]) -> PreparedRequest: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def ready(self) -> bool: ...


def longest_run(payload: bytes) -> int:
    """Bytes in the longest run of `payload` without ASCII whitespace."""
    return max(map(len, payload.split()), default=0)


def is_cheap(payload: bytes) -> bool:
    """True when the body whose orjson bytes are `payload` renders within the inline bound."""
    return (
        len(payload) <= INLINE_MAX_BYTES
        and payload.count(b"{") <= INLINE_MAX_OBJECTS
        and longest_run(payload) <= INLINE_MAX_RUN
    )


class InlineRenderer:
    """`prepare_request` on the event loop: `render_workers = 0` (tests, benchmarks' baseline)."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        prefixes: PrefixCache | None = None,
        options: RenderOptions | None = None,
        pacer: Pacer | None = None,
    ) -> None:
        self._encoding = encoding
        self._prefixes = prefixes or PrefixCache(encoding)
        self._options = options or RenderOptions()
        self._pacer = pacer

    async def prepare(self, body: dict[str, Any]) -> PreparedRequest:
        if self._pacer is not None:  # a burst of requests: a few renders per loop iteration
            await self._pacer.turn()
        return self._options.render(body, self._encoding, self._prefixes)

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def ready(self) -> bool:
        return True
