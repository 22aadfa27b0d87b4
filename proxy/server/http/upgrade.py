"""The WebSocket side of a guarded connection: a request head with `Upgrade: websocket` that
passed the guard's head limits (guard_protocol.py) is handed to uvicorn's WebSocket protocol on
the websockets library (`websockets-sansio`), which does the handshake, the framing, the message
size limit and the ping/pong keepalive.

What the guard keeps for such a connection: it still counts under `max_connections` (until it
closes), but it leaves the HTTP registers — a WebSocket is never closed to make room, like a
request in flight. What it adds: a send that waits on a client that stopped reading (the
transport's write buffer above its high-water mark) for `send_timeout` aborts the connection,
so a session never holds its upstream request, or a drain, for a client that reads nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from proxy.server.http.connections import Connections


class GuardedWebSocket(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, counted by the guard and with a bounded send wait (module
    doc); bound to a guard by `Guard.websocket_protocol`."""

    guard: ClassVar[Connections]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The connection was counted by the HTTP protocol it was upgraded from (`handed_over`).
        self._counted = False

    def handed_over(self) -> None:
        """The HTTP protocol counted this connection; it is this one's to uncount now."""
        self._counted = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self.guard.open -= 1
            self.guard.connections(self.guard.open)
        super().connection_lost(exc)

    async def send(self, message: Any) -> None:
        if not self.writable.is_set() and not self.disconnected:
            try:
                async with asyncio.timeout(self.guard.limits.send_timeout):
                    await self.writable.wait()
            except TimeoutError:
                self.guard.observe("ws_send_timeout")
                self.transport.abort()  # a close would wait for the full buffer to drain
                raise ClientDisconnected() from None
        await super().send(message)
