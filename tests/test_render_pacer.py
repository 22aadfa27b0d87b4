"""The render pacer: at most N renders on the loop per iteration, in arrival order, and what
became ready meanwhile (an open stream's frame) runs between the batches."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from proxy.server.rendering.pacer import Pacer


class Iterations:
    """Counts event-loop iterations: a callback that re-schedules itself once per iteration."""

    def __init__(self) -> None:
        self.now = 0
        self._running = True

    def start(self) -> None:
        asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._running = False

    def _tick(self) -> None:
        self.now += 1
        if self._running:
            asyncio.get_running_loop().call_soon(self._tick)


def test_light_load_never_waits() -> None:
    async def scenario() -> int:
        pacer = Pacer(4)
        clock = Iterations()
        clock.start()
        seen = []
        for _ in range(3):
            before = clock.now
            await pacer.turn()
            seen.append(clock.now - before)
            await asyncio.sleep(0)
        clock.stop()
        return max(seen)

    assert asyncio.run(scenario()) == 0  # no turn cost an iteration


def test_a_burst_renders_n_per_iteration_in_arrival_order_with_frames_between() -> None:
    async def scenario() -> tuple[Counter[int], list[int], list[str]]:
        pacer = Pacer(3)
        clock = Iterations()
        clock.start()
        when: Counter[int] = Counter()
        order: list[int] = []
        log: list[str] = []

        async def render(number: int) -> None:
            await pacer.turn()
            when[clock.now] += 1
            order.append(number)
            log.append("render")

        def frame() -> None:  # an open stream's frame, ready while the burst waits
            log.append("frame")

        tasks = [asyncio.create_task(render(n)) for n in range(12)]
        await asyncio.sleep(0)  # the first iteration: every task starts, 3 render
        asyncio.get_running_loop().call_soon(frame)
        await asyncio.gather(*tasks)
        clock.stop()
        return when, order, log

    when, order, log = asyncio.run(scenario())
    assert max(when.values()) <= 3
    assert sum(when.values()) == 12
    assert order == list(range(12))
    # the frame did not wait for the whole burst: at most one batch ran before it after its turn
    assert log.index("frame") <= 6


def test_cancelled_waiters_give_their_turn_away() -> None:
    async def scenario() -> list[int]:
        pacer = Pacer(1)
        done: list[int] = []

        async def render(number: int) -> None:
            await pacer.turn()
            done.append(number)

        tasks = [asyncio.create_task(render(n)) for n in range(6)]
        await asyncio.sleep(0)
        tasks[1].cancel()  # waiting
        tasks[3].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert sum(isinstance(r, asyncio.CancelledError) for r in results) == 2
        assert pacer.waiting == 0
        return done

    assert asyncio.run(scenario()) == [0, 2, 4, 5]


def test_a_pacer_needs_a_positive_rate() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Pacer(0)
