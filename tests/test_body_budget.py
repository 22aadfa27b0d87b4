"""The body budget, on its own: reservations wait first come first served,
give up with a 503 after the wait, and a body is read only within its reservation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from proxy.errors import ClientError, UnavailableError
from proxy.server import asgi
from proxy.server.http.budget import STEP, BodyBudget, declared_length, read_body


def test_reservations_fit_wait_in_order_and_release() -> None:
    async def scenario() -> list[str]:
        budget = BodyBudget(100, wait=5)
        order: list[str] = []
        first = budget.reservation()
        await first.ensure(60)
        assert budget.used == 60

        async def later(name: str, size: int) -> None:
            async with budget.reservation() as hold:
                await hold.ensure(size)
                order.append(name)
                await asyncio.sleep(0.01)

        waiting = [
            asyncio.ensure_future(later("big", 70)),  # does not fit yet
            asyncio.ensure_future(later("small", 10)),  # would fit, but waits its turn
        ]
        await asyncio.sleep(0.05)
        assert order == []
        first.release()
        first.release()  # idempotent
        await asyncio.gather(*waiting)
        assert budget.used == 0
        return order

    assert asyncio.run(scenario()) == ["big", "small"]


def test_a_reservation_that_does_not_come_is_a_503_and_unblocks_the_queue() -> None:
    async def scenario() -> None:
        budget = BodyBudget(100, wait=0.05)
        holder = budget.reservation()
        await holder.ensure(100)
        with pytest.raises(UnavailableError) as raised:
            await budget.reservation().ensure(1)
        assert raised.value.status == 503
        assert raised.value.code == "body_budget_exhausted"
        assert "body_budget_bytes" in raised.value.message
        assert budget.used == 100  # the one that gave up holds nothing
        holder.release()
        assert budget.used == 0

    asyncio.run(scenario())


def test_a_waiter_cancelled_as_room_comes_free_is_skipped() -> None:
    """The wait of a request is cancelled (its timeout, its client gone) and, before its task
    runs again, another request releases: the release must not grant the cancelled wait."""

    async def scenario() -> None:
        budget = BodyBudget(100, wait=5)
        holder = budget.reservation()
        await holder.ensure(100)
        cancelled = asyncio.ensure_future(budget.reservation().ensure(50))
        served = budget.reservation()
        behind = asyncio.ensure_future(served.ensure(50))
        await asyncio.sleep(0.01)
        cancelled.cancel()  # its waiter is cancelled now, its handler runs later
        holder.release()  # meets the cancelled waiter first
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await behind
        assert budget.used == 50
        served.release()
        assert budget.used == 0

    asyncio.run(scenario())


def test_a_body_larger_than_the_budget_takes_all_of_it() -> None:
    async def scenario() -> None:
        budget = BodyBudget(100, wait=1)
        async with budget.reservation() as hold:
            await hold.ensure(1000)
            assert budget.used == 100
            await hold.ensure(5000)  # covered: it holds the whole budget
            assert budget.used == 100
        assert budget.used == 0
        unlimited = BodyBudget(0, wait=1)
        async with unlimited.reservation() as hold:
            await hold.ensure(10**12)
        assert unlimited.used == 0

    asyncio.run(scenario())


def _receive(chunks: Iterable[bytes]) -> Any:
    messages = [{"type": "http.request", "body": chunk, "more_body": True} for chunk in chunks]
    messages.append({"type": "http.request", "body": b"", "more_body": False})
    received: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        message = messages.pop(0)
        received.append(message)
        return message

    receive.received = received  # type: ignore[attr-defined]
    return receive


def test_read_body_reserves_the_declared_length_or_steps_as_it_grows() -> None:
    async def scenario() -> None:
        budget = BodyBudget(10 * STEP, wait=1)
        scope = {"headers": [(b"content-length", b"5000")]}
        async with budget.reservation() as hold:
            raw = await read_body(scope, asgi.Inbound(_receive([b"x" * 5000])), hold, 10**9)
            assert raw == b"x" * 5000
            assert budget.used == 5000
        chunked = {"headers": [(b"transfer-encoding", b"chunked")]}
        parts = [b"y" * (STEP // 2)] * 5  # 2.5 steps
        async with budget.reservation() as hold:
            raw = await read_body(chunked, asgi.Inbound(_receive(parts)), hold, 10**9)
            assert len(raw) == 5 * (STEP // 2)
            assert budget.used == 3 * STEP
        assert budget.used == 0

    asyncio.run(scenario())


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    async def scenario() -> None:
        budget = BodyBudget(100, wait=1)
        receive = _receive([b"never"])
        scope = {"headers": [(b"expect", b"100-continue"), (b"content-length", b"10001")]}
        with pytest.raises(ClientError) as raised:
            async with budget.reservation() as hold:
                await read_body(scope, asgi.Inbound(receive), hold, 10000)
        assert raised.value.status == 413
        assert "Content-Length 10001" in raised.value.message
        assert receive.received == []  # uvicorn sends `100 Continue` on the first receive()
        assert budget.used == 0

    asyncio.run(scenario())
    assert declared_length({"headers": [(b"content-length", b"12")]}) == 12
    assert declared_length({"headers": [(b"transfer-encoding", b"chunked")]}) is None
    assert declared_length({"headers": [(b"content-length", b"x")]}) is None
