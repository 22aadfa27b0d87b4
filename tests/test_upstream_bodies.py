"""Request bodies streamed up by the lean client (pass-through), and HEAD answers,
against a raw HTTP/1.1 server on loopback (tests/test_upstream_stream.py's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from proxy.errors import ClientError
from proxy.upstream.stream import LocalProtocolError, StreamClient
from tests.test_upstream_stream import Request, client_for, serving, sized

OK = b"HTTP/1.1 200 OK\r\n"


async def read_chunked(request: Request) -> bytes:
    body = b""
    while True:
        size = int((await request.reader.readuntil(b"\r\n"))[:-2], 16)
        if size == 0:
            await request.reader.readuntil(b"\r\n")  # no trailers: the blank line
            return body
        body += await request.reader.readexactly(size)
        assert await request.reader.readexactly(2) == b"\r\n"


async def echo(request: Request, writer: asyncio.StreamWriter) -> bool:
    """Answers with the body it got (read chunked when it came chunked)."""
    body = request.body
    if (b"transfer-encoding", b"chunked") in request.headers:
        body = await read_chunked(request)
    writer.write(sized(body, OK))
    await writer.drain()
    return True


async def pieces(*parts: bytes, pause: float = 0.0) -> AsyncIterator[bytes]:
    for part in parts:
        if pause:
            await asyncio.sleep(pause)
        yield part


async def body_of(client: StreamClient, *args: object, **options: object) -> tuple[int, bytes]:
    response = await client.send(*args, **options)  # type: ignore[arg-type]
    try:
        data = b""
        while chunk := await response.read():
            data += chunk
        return response.status, data
    finally:
        response.close()


@pytest.mark.parametrize("length", [11, None], ids=["content_length", "chunked"])
def test_a_streamed_body_goes_up_whole_and_the_connection_is_reused(length: int | None) -> None:
    async def run() -> None:
        async with serving(echo) as server:
            client = client_for(server)
            for _ in range(2):
                sent = pieces(b"hello", b"", b" world", pause=0.01)
                got = await body_of(client, "PUT", "/x", [], sent, length=length)
                assert got == (200, b"hello world")
            head = server.requests[0].head
            assert (b"content-length: 11" in head) == (length == 11)
            assert (b"transfer-encoding: chunked" in head) == (length is None)
            assert server.connections == 1
            await client.aclose()

    asyncio.run(run())


def test_a_large_body_to_a_slow_upstream_waits_for_it_and_arrives_whole() -> None:
    """Writes wait while upstream's socket is full (`pause_writing`): the body is taken from
    its source (our client) only as fast as upstream reads it."""
    blob = bytes(range(256)) * 256  # 64 KiB
    count = 256  # 16 MiB: far more than the socket buffers hold (~4 MiB here)
    taken: list[int] = []
    taken_when_read: list[int] = []

    async def source() -> AsyncIterator[bytes]:
        for number in range(count):
            taken.append(number)
            yield blob

    async def slow(request: Request, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.3)  # busy: reads nothing yet
        taken_when_read.append(len(taken))
        size = 0
        while True:
            length = int((await request.reader.readuntil(b"\r\n"))[:-2], 16)
            if length == 0:
                await request.reader.readuntil(b"\r\n")
                break
            size += len(await request.reader.readexactly(length + 2)) - 2
        writer.write(sized(b"%d" % size, OK))
        await writer.drain()
        return True

    async def run() -> None:
        async with serving(slow) as server:
            client = client_for(server)
            got = await body_of(client, "POST", "/x", [], source(), length=None)
            assert got == (200, b"%d" % (count * len(blob)))
            assert taken_when_read[0] * len(blob) < 8 * 1024 * 1024, taken_when_read
            await client.aclose()

    asyncio.run(run())


def test_an_early_answer_stops_the_upload_and_the_connection_is_not_reused() -> None:
    consumed = []

    async def endless() -> AsyncIterator[bytes]:
        for number in range(200):
            consumed.append(number)
            await asyncio.sleep(0.01)
            yield b"x" * 100

    async def refuse(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(sized(b"too large", b"HTTP/1.1 413 Too Large\r\n"))
        await writer.drain()
        return await request.until_closed(5)

    async def run() -> None:
        async with serving(refuse) as server:
            client = client_for(server)
            started = time.monotonic()
            assert await body_of(client, "POST", "/x", [], endless(), length=None) == (
                413,
                b"too large",
            )
            assert time.monotonic() - started < 1.0
            assert len(consumed) < 100  # the rest of the body was never read from its source
            assert client.idle_connections == 0  # upstream waits for a body we never finish
            await client.aclose()

    asyncio.run(run())


def test_a_failing_body_source_fails_the_request_and_closes_the_connection() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"part"
        raise ClientError("request body exceeds the limit", status=413)

    async def run() -> None:
        async with serving(echo) as server:
            client = client_for(server)
            with pytest.raises(ClientError, match="exceeds the limit"):
                await client.send("POST", "/x", [], failing(), length=None)
            for _ in range(100):
                if server.closed_at:
                    break
                await asyncio.sleep(0.01)
            assert server.closed_at, "the half-sent request's connection stayed open"
            assert client.idle_connections == 0
            await client.aclose()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("parts", "message"),
    [((b"abc", b"def"), "longer than its Content-Length 4"), ((b"ab",), "of 2 bytes, not its")],
)
def test_a_body_that_disagrees_with_its_length_is_not_sent(
    parts: tuple[bytes, ...], message: str
) -> None:
    async def run() -> None:
        async with serving(echo) as server:
            client = client_for(server)
            with pytest.raises(LocalProtocolError, match=message):
                await client.send("POST", "/x", [], pieces(*parts), length=4)
            await client.aclose()

    asyncio.run(run())


def test_the_answer_to_head_has_no_body_and_the_connection_is_reused() -> None:
    async def run() -> None:
        async with serving(lambda r, w: _head_answer(w)) as server:
            client = client_for(server)
            for _ in range(2):
                assert await body_of(client, "HEAD", "/x", [], b"") == (200, b"")
            assert b"content-length" not in server.requests[0].head  # none for no body
            assert server.connections == 1
            await client.aclose()

    asyncio.run(run())


async def _head_answer(writer: asyncio.StreamWriter) -> bool:
    writer.write(OK + b"content-length: 5\r\n\r\n")
    await writer.drain()
    return True
