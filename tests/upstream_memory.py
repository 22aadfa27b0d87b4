"""An upstream in memory, injected through the lean client's transport seam
(`Upstream(transport=...)`, `create_app(transport=...)`).

Each request the client writes is parsed with h11 (an HTTP/1.1 implementation independent of the
proxy's) and answered by a handler with the raw bytes of a response, the way httpx's
MockTransport answers — but below HTTP, so the client's own request writer, response parser
(llhttp), pool and error tree are the ones under test. A handler that raises an `OSError`
breaks the connection with it (a reset); a transport that is `down` refuses to connect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import orjson

from proxy.upstream.connection import Connection


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


Handler = Callable[[Request], bytes]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}


def reply(
    status: int,
    *,
    json: Any = None,
    text: str | None = None,
    content_type: str | None = None,
) -> bytes:
    """The bytes of a whole HTTP/1.1 response: a JSON body, a text body, or none."""
    if json is not None:
        body, kind = orjson.dumps(json), "application/json"
    else:
        body, kind = (text or "").encode(), "text/plain; charset=utf-8"
    head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
    if body or content_type:
        head += f"content-type: {content_type or kind}\r\n"
    head += f"content-length: {len(body)}\r\n\r\n"
    return head.encode() + body


@dataclass
class MemoryTransport:
    """A `proxy.upstream.transport.Transport` whose connections lead to `handle`."""

    handle: Handler
    #: Refuse new connections (ConnectionRefusedError, as a closed port does).
    down: bool = False
    requests: list[Request] = field(default_factory=list)
    connections: int = 0

    async def connect(self, connection: Connection) -> None:
        if self.down:
            raise ConnectionRefusedError(111, "Connection refused")
        self.connections += 1
        connection.connection_made(_Pipe(connection, self))


class _Pipe(asyncio.Transport):
    """One connection's transport: what the client writes is parsed, the answer fed back."""

    def __init__(self, protocol: Connection, owner: MemoryTransport) -> None:
        super().__init__()
        self._protocol = protocol
        self._owner = owner
        self._closing = False
        self._parser = h11.Connection(h11.SERVER)
        self._head: h11.Request | None = None
        self._body = b""
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        self._parser.receive_data(bytes(data))
        while True:
            event = self._parser.next_event()
            if event is h11.NEED_DATA:
                return  # the rest of the request comes with a later write
            if isinstance(event, h11.Request):
                self._head = event
            elif isinstance(event, h11.Data):
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
        head, body, self._head, self._body = self._head, self._body, None, b""
        assert head is not None
        request = Request(
            head.method.decode(),
            head.target.decode(),
            {name.decode(): value.decode("latin-1") for name, value in head.headers},
            body,
        )
        self._owner.requests.append(request)
        self._parser = h11.Connection(h11.SERVER)  # the next request on this connection
        try:
            answer = self._owner.handle(request)
        except OSError as exc:
            self._closing = True
            self._loop.call_soon(self._protocol.connection_lost, exc)
            return
        self._loop.call_soon(self._protocol.data_received, answer)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._loop.call_soon(self._protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass
