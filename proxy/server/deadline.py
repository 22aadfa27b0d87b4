"""A timeout for the many short waits of one stream, at the cost of a float per wait.

`asyncio.timeout()` arms a timer handle when a wait begins and cancels it when the wait ends:
~14 µs per use on uvloop (bench/cold_cache.py), and a stream used two per upstream frame (the
wait for the frame, the send of its events), ~1.4 µs per generated token. Almost no
such timer ever fires: frames come every few tens of milliseconds, deadlines are seconds away.

`Deadline` keeps one timer handle per stream and re-arms it lazily. Entering a wait stores its
deadline; the handle stays where it was as long as that is no later than the new deadline. When
it fires early (the deadline moved on) it re-arms itself for the current deadline; when it fires
inside a wait whose deadline has passed, it cancels the waiting task, and leaving the wait turns
that cancellation into `TimeoutError` — `asyncio.Timeout`'s semantics (Python 3.11): a
cancellation from anyone else (a client disconnect) is re-raised as it is.

    deadline = Deadline()
    async with deadline.at(loop.time() + 5):   # or deadline.after(5)
        frame = await frames.__anext__()        # TimeoutError when 5 s pass first
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType

#: A handle may fire a little before its time (uvloop's timers count whole milliseconds); that
#: close to the deadline counts as reaching it, as for `asyncio.timeout`, which never checks.
_SLACK = 0.001


class Deadline:
    """Reusable `asyncio.timeout` for one task's consecutive waits (see the module docstring).

    Bound to the task of its first wait; not re-entrant: one wait at a time. `expire()` ends
    the current wait now (the drain's end); `close()` drops the timer handle (the stream
    ended)."""

    __slots__ = (
        "_armed",
        "_cancelling",
        "_expiring",
        "_handle",
        "_inside",
        "_loop",
        "_task",
        "_when",
    )

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[object] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._armed = math.inf  # when the handle fires
        self._when = math.inf  # the deadline of the current (or last) wait
        self._inside = False
        self._expiring = False
        self._cancelling = 0

    def at(self, when: float) -> Deadline:
        """The next wait ends by `when` (event-loop time)."""
        self._when = when
        return self

    def after(self, seconds: float) -> Deadline:
        """The next wait ends within `seconds`."""
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        self._when = loop.time() + seconds
        return self

    async def __aenter__(self) -> Deadline:
        if self._inside:
            raise RuntimeError("Deadline is not re-entrant")
        task = self._task
        if task is None:  # the first wait: bind the task (Python 3.11's current_task is slow)
            task = self._task = asyncio.current_task()
            if task is None:
                raise RuntimeError("Deadline must be used inside a task")
            self._loop = self._loop or asyncio.get_running_loop()
        self._inside = True
        self._expiring = False
        self._cancelling = task.cancelling()
        if self._when < self._armed:  # the handle would fire too late: bring it forward
            self._arm(self._when)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._inside = False
        if self._expiring:
            self._expiring = False
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc  # our cancellation, and nobody else's

    def expire(self) -> None:
        """End the current wait now (if there is one), as if its deadline had passed."""
        if self._inside and not self._expiring:
            self.close()
            self._when = -math.inf
            self._fire()

    def close(self) -> None:
        """Drop the timer handle; the object may still be used (it re-arms on the next wait)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed = math.inf

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        assert self._loop is not None
        self._handle = self._loop.call_at(when, self._fire)
        self._armed = when

    def _fire(self) -> None:
        self._handle = None
        self._armed = math.inf
        if not self._inside or self._expiring:
            return  # between waits: the next one arms again
        assert self._loop is not None
        assert self._task is not None
        if self._loop.time() + _SLACK < self._when:
            self._arm(self._when)  # the deadline moved on since the handle was armed
            return
        self._expiring = True
        self._task.cancel()
