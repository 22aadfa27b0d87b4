"""A record-and-replay stand-in for trtllm-serve, for benchmarks where the upstream's own CPU
would hide the proxy's: the first request of each kind is relayed to the real simulator and its
answer recorded (every chunk, with the time it took); every later one is answered from the
recording, paced as recorded, by ~100 lines of raw asyncio. A frame costs it one timer and one
socket write, against the simulator's uvicorn, Starlette, JSON and detokenizer.

Kinds: (method, path, streamed or not). So the benchmark must send one request body throughout
(the recording answers them all); the proxy does exactly the work it does against the simulator.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

#: One piece of a recorded answer: seconds after the previous piece (or the request), bytes.
Piece = tuple[float, bytes]


@dataclass
class ReplayUpstream:
    """`await start()`, then point the proxy at `url`; `close()` at the end."""

    target_host: str
    target_port: int
    recordings: dict[tuple[bytes, bytes, bool], list[Piece]] = field(default_factory=dict)
    replayed: int = 0
    _server: asyncio.Server | None = None
    _recording: dict[tuple[bytes, bytes, bool], asyncio.Lock] = field(default_factory=dict)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> ReplayUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=4096)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(_content_length(head))
                method, path = head.split(b" ", 2)[:2]
                key = (method, path.split(b"?")[0], b'"stream":true' in body)
                pieces = self.recordings.get(key)
                if pieces is None:
                    pieces = await self._record(key, head + body)
                else:
                    self.replayed += 1
                for delay, data in pieces:
                    if delay > 0.0005:
                        await asyncio.sleep(delay)
                    writer.write(data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            return
        finally:
            writer.close()

    async def _record(self, key: tuple[bytes, bytes, bool], request: bytes) -> list[Piece]:
        lock = self._recording.setdefault(key, asyncio.Lock())
        async with lock:  # one recording per kind, even when several arrive at once
            if key in self.recordings:
                return self.recordings[key]
            reader, writer = await asyncio.open_connection(self.target_host, self.target_port)
            try:
                writer.write(request)
                pieces = await _read_answer(reader)
            finally:
                writer.close()
            self.recordings[key] = pieces
            return pieces


async def _read_answer(reader: asyncio.StreamReader) -> list[Piece]:
    """One HTTP/1.1 answer as pieces: the head, then each chunk (or the whole body)."""
    last = time.monotonic()
    pieces: list[Piece] = []

    def piece(data: bytes) -> None:
        nonlocal last
        now = time.monotonic()
        pieces.append((now - last, data))
        last = now

    head = await reader.readuntil(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        piece(head + await reader.readexactly(_content_length(head)))
        return pieces
    piece(head)
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            piece(size_line + data)
            return pieces
        piece(size_line + data)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            return int(line[15:])
    return 0
