"""The cyclic garbage collector of a serving process: full passes rarer than CPython's default,
and no young pass skipped.

A full pass walks every object the collector tracks and holds the event loop meanwhile: with
2,000 open streams on a worker that is ~500,000 objects and 150-300 ms, a stall of every
stream's frames. CPython runs one when, since the last, 10 passes of the middle generation ran
and the objects promoted to the oldest grew by a quarter of those it kept (its threshold 2 and
a fixed rule). While streams open by the thousand that rule fires at every quarter of growth:
six to nine passes of 40-300 ms per worker in the first seconds of a 4,000-stream burst.

Raising threshold 2 leaves the young passes (a few hundred objects, well under a millisecond)
as they are and spaces the full passes by that many middle passes, which come with
allocations: a busy worker still runs one every few tens of seconds, so the cycles that
outlive their stream (a closed connection's transport and protocol, ~30 objects per stream)
are still freed, later. Freezing the start-up's objects out of the walk (`gc.freeze()`) made
the bursts worse: the rule then counted only the streams' objects.

The young generation has a blind spot too. CPython starts a young pass when the tracked objects
allocated less those freed exceed 700, and it counts every freed object, old ones included.
When many streams end together, their old objects die by the thousand, the count stays near
zero, and the young generation grows unchecked: passes over 30,000-40,000 young objects, 12-20
ms each, measured in a 4,000-stream run (a stall of every open stream's frames, like a full
pass's). While requests are in flight, `YoungPasses` looks every `YOUNG_PERIOD`: when CPython
ran no young pass meanwhile, it counts the young generation (a list of its objects: tens of
microseconds while it is as small as it should be) and, when that holds twice the threshold or
more, runs the pass the count skipped (young, or young and middle when CPython's rule for the
middle generation is due): a few thousand objects at most, well under the passes it prevents.
Otherwise it does nothing, so the passes that CPython runs, and the middle and full passes they
lead to, are as they were.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

#: Seconds between two counts of the young generation while requests are in flight.
YOUNG_PERIOD = 0.01
#: Seconds between two checks of whether requests are in flight while none is.
IDLE_PERIOD = 1.0
#: Young objects, as a multiple of CPython's threshold for a young pass, that mean the count
#: missed (module docstring).
MISSED_AT = 2


def space_full_passes(middle_passes: int) -> None:
    """At most one full pass per `middle_passes` passes of the middle generation."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, middle_passes)


def _young_objects() -> int:
    return len(gc.get_objects(0))


def _young_passes() -> int:
    return int(gc.get_stats()[0]["collections"])


class YoungPasses:
    """The young passes that CPython's count skips, while `busy()` (module docstring).
    `start()` on the serving loop, `stop()` when it ends."""

    def __init__(
        self,
        busy: Callable[[], bool],
        *,
        period: float = YOUNG_PERIOD,
        idle_period: float = IDLE_PERIOD,
        young: Callable[[], int] = _young_objects,
        passes: Callable[[], int] = _young_passes,
        counts: Callable[[], tuple[int, int, int]] = gc.get_count,
        collect: Callable[[int], object] = gc.collect,
    ) -> None:
        self._busy = busy
        self._period = period
        self._idle_period = idle_period
        self._young = young
        self._passes = passes
        self._seen = -1
        self._counts = counts
        self._collect = collect
        self._timer: asyncio.TimerHandle | None = None
        self.forced = 0  # young passes run here

    def start(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._idle_period, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        busy = self._busy()
        thresholds = gc.get_threshold()
        # A young pass since the last tick left the generation small: no need to count it.
        passes, self._seen = self._seen, self._passes()
        if busy and passes == self._seen and self._young() > MISSED_AT * thresholds[0]:
            # As CPython's own pass would: the middle generation with it once enough young
            # passes ran (an explicit young pass counts as one, but never starts a middle
            # pass: without this, the middle generation grows as the young one did).
            self._collect(1 if self._counts()[1] > thresholds[1] else 0)
            self.forced += 1
            self._seen = self._passes()
        delay = self._period if busy else self._idle_period
        self._timer = asyncio.get_running_loop().call_later(delay, self._tick)
