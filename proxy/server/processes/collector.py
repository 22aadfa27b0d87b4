"""The cyclic garbage collector of a serving process: full passes rarer than CPython's default.

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
"""

from __future__ import annotations

import gc


def space_full_passes(middle_passes: int) -> None:
    """At most one full pass per `middle_passes` passes of the middle generation."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, middle_passes)
