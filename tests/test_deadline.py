"""`Deadline`: asyncio.timeout's semantics for a stream's many waits, with one lazy timer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from proxy.server.deadline import Deadline

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the timer handles a `Deadline` asks it for."""

    timers = 0

    def call_at(self, when: float, callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
        if isinstance(getattr(callback, "__self__", None), Deadline):
            self.timers += 1
        return super().call_at(when, callback, *args, **kw)


def run(main: Callable[[], Awaitable[Any]], loop: str = "asyncio") -> Any:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(main())


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_wait_past_its_deadline_raises_timeout_error(loop: str) -> None:
    async def main() -> float:
        deadline = Deadline()
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            async with deadline.after(0.05):
                await asyncio.sleep(5)
        return asyncio.get_running_loop().time() - started

    assert 0.04 <= run(main, loop) < 2


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_wait_that_ends_in_time_returns_its_result(loop: str) -> None:
    async def main() -> str:
        deadline = Deadline()
        async with deadline.after(5):
            await asyncio.sleep(0.01)
        return "done"

    assert run(main, loop) == "done"


def test_many_waits_share_one_timer_that_follows_the_deadline() -> None:
    # A timer armed for the first wait fires while a later wait, whose deadline moved on,
    # still has time: that wait is left alone, and the timer re-arms for its deadline.
    loop = CountingLoop()

    async def main() -> None:
        deadline = Deadline()
        for _ in range(200):
            async with deadline.after(0.1):
                await asyncio.sleep(0)
        async with deadline.after(0.3):
            await asyncio.sleep(0.15)  # the first handle fires at ~0.1 s, inside this wait
        with pytest.raises(TimeoutError):
            async with deadline.after(0.1):
                await asyncio.sleep(5)
        deadline.close()

    try:
        loop.run_until_complete(main())
        # armed once, re-armed when it fired early, brought forward for the last, shorter wait
        assert loop.timers == 3
    finally:
        loop.close()


def test_someone_elses_cancellation_is_not_a_timeout() -> None:
    async def main() -> None:
        deadline = Deadline()

        async def wait() -> None:
            async with deadline.after(5):
                await asyncio.sleep(5)

        task = asyncio.ensure_future(wait())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main)


def test_cancelled_by_someone_else_as_the_deadline_passes() -> None:
    # Both cancel the task: the outer cancellation wins, as with asyncio.timeout.
    async def main() -> None:
        deadline = Deadline()

        async def wait() -> None:
            async with deadline.after(5):
                deadline.expire()  # our cancellation …
                asyncio.current_task().cancel()  # type: ignore[union-attr]  # … and another
                await asyncio.sleep(5)

        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(wait())

    run(main)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_expire_ends_the_current_wait_at_once(loop: str) -> None:
    async def main() -> float:
        deadline = Deadline()
        deadline.expire()  # outside a wait: nothing to end
        async with deadline.after(0.5):
            await asyncio.sleep(0.01)
        started = asyncio.get_running_loop().time()
        asyncio.get_running_loop().call_later(0.02, deadline.expire)
        with pytest.raises(TimeoutError):
            async with deadline.after(60):
                await asyncio.sleep(60)
        return asyncio.get_running_loop().time() - started

    assert run(main, loop) < 1


def test_not_reentrant_and_only_in_a_task() -> None:
    async def main() -> None:
        deadline = Deadline()
        async with deadline.after(1):
            with pytest.raises(RuntimeError, match="re-entrant"):
                async with deadline.after(1):
                    pass

    run(main)
    with pytest.raises(RuntimeError):  # no loop, no task
        Deadline().at(0).__aenter__().send(None)


def test_close_leaves_no_timer_behind() -> None:
    async def main() -> int:
        deadline = Deadline()
        async with deadline.after(30):
            pass
        deadline.close()
        scheduled = getattr(asyncio.get_running_loop(), "_scheduled", [])
        return len([handle for handle in scheduled if not handle.cancelled()])

    assert run(main) == 0
