"""`asgi.Inbound`, on its own: the wait for the client's disconnect while the body is still
read by someone else (a pass-through), and after it was read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.types import Message

from proxy.server import asgi


class _Receive:
    """An ASGI `receive` fed by the test, one message at a time."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Message] = asyncio.Queue()

    async def __call__(self) -> Message:
        return await self.queue.get()


async def _streaming() -> tuple[_Receive, asgi.Inbound, AsyncIterator[bytes], asyncio.Future[None]]:
    """An inbound whose body has started (one chunk read, more to come) and a task waiting for
    the client's disconnect meanwhile."""
    receive = _Receive()
    inbound = asgi.Inbound(receive)
    reader = inbound.stream_body(0)
    receive.queue.put_nowait({"type": "http.request", "body": b"a", "more_body": True})
    assert await reader.__anext__() == b"a"
    return receive, inbound, reader, asyncio.ensure_future(inbound.wait_disconnect())


def test_waits_for_the_body_reader_then_reads_the_disconnect() -> None:
    async def scenario() -> None:
        receive, inbound, reader, watcher = await _streaming()
        await asyncio.sleep(0.01)
        assert not watcher.done()  # the body still streams: the watcher does not receive
        receive.queue.put_nowait({"type": "http.request", "body": b"b", "more_body": False})
        assert [chunk async for chunk in reader] == [b"b"]
        await asyncio.sleep(0.01)
        assert not watcher.done()  # the body ended, the client has not gone
        receive.queue.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(watcher, 1)
        assert inbound.disconnected

    asyncio.run(scenario())


def test_a_disconnect_while_the_body_streams_ends_the_wait() -> None:
    async def scenario() -> None:
        receive, inbound, reader, watcher = await _streaming()
        cancelled = asyncio.ensure_future(inbound.wait_disconnect())
        await asyncio.sleep(0.01)
        cancelled.cancel()  # one waiter gone does not disturb the other
        receive.queue.put_nowait({"type": "http.disconnect"})
        with pytest.raises(asgi.ClientDisconnected):
            await reader.__anext__()
        await asyncio.wait_for(watcher, 1)
        assert inbound.disconnected
        assert inbound.body_done
        assert receive.queue.empty()

    asyncio.run(scenario())
