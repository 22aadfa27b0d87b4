"""At most N renders on the event loop per loop iteration, the rest in arrival order after.

An inline render holds the loop for up to ~1.5 ms. When thousands of requests arrive at once
(a client fleet reconnecting, a pod taking over another's traffic), every one of them renders
in the iteration it became ready, and the frames of the streams already open wait behind all
of them: seconds at a few thousand. Spreading the renders, N per iteration, lets the frames
that became ready meanwhile through after each N; the new requests wait their turn instead
(they have no event out yet, so nothing they show is late).

asyncio runs, in one iteration, the callbacks that were ready when it began; a callback added
meanwhile runs in the next one, after that one's I/O poll. The pacer counts the renders of the
current iteration and schedules one callback for the next, which resets the count and wakes
the next N waiters. Under light load a render never waits: the count stays under N.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Pacer:
    """`await pacer.turn()` before a render on the loop: at once while this iteration has had
    fewer than `per_tick` renders and nobody waits, else in a later iteration, in order."""

    def __init__(self, per_tick: int) -> None:
        if per_tick < 1:
            raise ValueError("per_tick must be at least 1")
        self.per_tick = per_tick
        self._used = 0
        self._scheduled = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def turn(self) -> None:
        if self._used < self.per_tick and not self._waiters:
            self._take()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._schedule()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Woken and cancelled in the same iteration: its turn goes to the next waiter.
                self._used -= 1
                self._wake()
            raise

    def _take(self) -> None:
        self._used += 1
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self._scheduled = False
        self._used = 0
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._used < self.per_tick:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._take()
        if self._waiters:
            self._schedule()
