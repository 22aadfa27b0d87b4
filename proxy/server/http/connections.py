"""What the client connections of one server share: the limits, the count of open connections,
and the registers of connections that may be closed to make room under the cap.

The lowest module of `proxy.server.http`: the protocols (closing.py, guard_protocol.py) read and
update a `Connections`; guard.py binds them to one (`Guard`, a `Connections` that also makes the
protocol class for uvicorn).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from proxy.config.settings import Settings

#: uvicorn's listen backlog, when the open-file limit leaves room for it.
BACKLOG = 2048


@dataclass(frozen=True, slots=True)
class Limits:
    """The client-side limits: the settings of the same names (config/settings.py)."""

    max_header_bytes: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    body_min_rate: int
    keepalive_timeout: float
    #: 0: no cap.
    max_connections: int
    #: Seconds a send may wait on a client that stopped reading (a WebSocket is then aborted).
    send_timeout: float
    ws_max_message_bytes: int
    ws_ping_interval: float
    #: Connections the kernel may queue until they are accepted (uvicorn's `backlog`).
    backlog: int = BACKLOG

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        names = [name for name in cls.__dataclass_fields__ if name != "backlog"]
        return cls(**{name: getattr(settings, name) for name in names})


class Sheddable(Protocol):
    """A connection in one of the registers: it can be closed for room."""

    def shed(self) -> None: ...


class Connections:
    """The limits, the number of open connections, the registers of those that may be closed
    for room (closing.py), and where limit events go."""

    def __init__(
        self,
        limits: Limits,
        observe: Callable[[str], None] | None = None,
        connections: Callable[[int], None] | None = None,
    ) -> None:
        self.limits = limits
        self.observe: Callable[[str], None] = observe or (lambda kind: None)
        #: Told the number of open connections when it changes (a gauge: with worker
        #: processes a scrape cannot read another process's count).
        self.connections: Callable[[int], None] = connections or (lambda count: None)
        self.open = 0
        # The registers, each oldest first (insertion order): answered and lingering; waiting
        # for a request head; idle keep-alive.
        self.lingering: dict[Sheddable, None] = {}
        self.waiting: dict[Sheddable, None] = {}
        self.idle: dict[Sheddable, None] = {}

    def make_room(self) -> bool:
        """Close one connection for a new one over the cap: the longest-lingering one, else the
        oldest that has not sent a whole request head, else the longest-idle keep-alive one;
        False when every connection has a request in flight."""
        for register in (self.lingering, self.waiting, self.idle):
            if register:
                next(iter(register)).shed()  # which leaves the register
                return True
        return False
