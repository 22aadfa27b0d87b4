"""HTTP/1.1 limits on the client side: uvicorn's httptools protocol plus the guards it lacks,
answered the way nginx and Envoy answer them.

uvicorn 0.55's `HttpToolsProtocol` parses with llhttp (httptools) but bounds neither a request
head's size nor its header count, times neither a head nor a body, and counts no connections
(`limit_concurrency` counts tasks, and answers 503 only once a head is in). `GuardedProtocol`
adds what is missing; the parser, the ASGI cycle and the whole response direction
(`RequestResponseCycle.send`) stay uvicorn's own:

    limit (setting)      trips when                                       answer
    max_header_bytes     request target + header lines above it           431, close
    max_headers          more header lines than it                        431, close
    header_timeout       a head still incomplete this long after its      408, close (just close
                         first byte, or after the connection opened       if nothing was sent)
    body_timeout,        no body byte for body_timeout, or the body       408 before the response
    body_min_rate        averaging under body_min_rate after that         started, else close
    keepalive_timeout    idle between two requests                        close (uvicorn's timer)
    max_connections      a new connection over the cap                    close one without a
                                                                          request in flight,
                                                                          else 503 + Retry-After

Every answer is an OpenAI-style JSON error with `connection: close`, followed by a lingering
close: our FIN goes first and what the client still sends is read and dropped, within bounds,
so the client reads the answer instead of a reset (closing.py). At the cap, the connection
closed for room is the longest-lingering one, else the oldest that has not sent a whole request
head, else the longest-idle keep-alive one; never one with a request in flight.

Open files. Every client connection takes a descriptor, and one more for its upstream request;
past the open-file limit accept() fails with EMFILE, and the event loop resets the connections
waiting in the listen backlog, real clients' among them. `serve` raises the soft limit to the
hard one and fits, within it: what is open already and a reserve (`FD_SPARE`, and each render
worker's pipe), the listen backlog (one accept burst takes it whole before the guard sees any
of it; a quarter of what is left), and `max_connections` at two descriptors each.

The protocol itself: guard_protocol.py; how connections end: closing.py; what the connections
of one server share (the limits, the count, the registers): connections.py. A request head llhttp
rejects (a malformed request line or header) is answered the same way: an OpenAI-style JSON 400
`bad_request` and a lingering close, never uvicorn's plain-text 400.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
from typing import Any

from proxy.config.settings import Settings
from proxy.metrics.serving import Metrics
from proxy.server.http.connections import BACKLOG, Connections, Limits
from proxy.server.http.guard_protocol import GuardedProtocol
from proxy.server.http.upgrade import GuardedWebSocket

__all__ = ["Guard", "Limits", "fit_open_files", "http_guard"]

#: Open files kept, beyond those open when the guard is made, for what is not a client
#: connection or its upstream request: the store (an SQLite file and its journal, or Redis
#: connections), upstream's probe client, the metrics port, what libraries open later.
FD_SPARE = 48
#: Open files of each render worker, in the proxy's process (its pipe and its socket).
FD_PER_RENDER_WORKER = 2


class Guard(Connections):
    """The `Connections` of one server, and the uvicorn protocol bound to them."""

    def protocol(self) -> type[GuardedProtocol]:
        """The protocol class for `uvicorn.Config(http=...)`, bound to this guard."""

        class Bound(GuardedProtocol):
            guard = self

        return Bound

    def websocket_protocol(self) -> type[GuardedWebSocket]:
        """The protocol class for `uvicorn.Config(ws=...)`, bound to this guard (upgrade.py)."""

        class Bound(GuardedWebSocket):
            guard = self

        return Bound

    def uvicorn_options(self) -> dict[str, Any]:
        """`uvicorn.Config` keywords for a server guarded by this guard. uvicorn's own forwarding
        middleware stays off: the app applies it with `trusted_proxies` (forwarding.py), after
        noting the real peer; uvicorn's default would trust any client on 127.0.0.1."""
        return {
            "http": self.protocol(),
            "ws": self.websocket_protocol(),
            "ws_max_size": self.limits.ws_max_message_bytes,
            "ws_ping_interval": self.limits.ws_ping_interval,
            "ws_ping_timeout": self.limits.ws_ping_interval,
            "proxy_headers": False,
            "backlog": self.limits.backlog,
        }


def http_guard(settings: Settings, metrics: Metrics, logger: logging.Logger) -> Guard:
    """The guard of `serve`: the limits of `settings`, reported to `metrics`, with
    `max_connections` and the listen backlog fitted to the open-file limit (raised to its hard
    maximum first)."""
    fitted, backlog = fit_open_files(settings.max_connections, settings.render_workers, logger)
    limits = dataclasses.replace(Limits.of(settings), max_connections=fitted, backlog=backlog)
    return Guard(
        limits,
        lambda kind: metrics.http_limits.labels(kind).inc(),
        metrics.client_connections.set,
    )


def fit_open_files(requested: int, render_workers: int, logger: logging.Logger) -> tuple[int, int]:
    """(max_connections, listen backlog) within the open-file limit (module doc): `requested`
    connections (0: no cap) or fewer, and `BACKLOG` or less."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        # As Go's runtime does: the soft limit (often 1024) is a default, the hard one the grant.
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # pragma: no cover - a platform that refuses
            pass
    if soft == resource.RLIM_INFINITY:
        return requested, BACKLOG
    reserve = _open_now() + FD_SPARE + FD_PER_RENDER_WORKER * render_workers
    room = max(4, soft - reserve)
    backlog = max(1, min(BACKLOG, room // 4))
    fits = max(1, (room - backlog) // 2)
    if requested and requested > fits:
        logger.warning(
            "max_connections lowered to fit the open-file limit",
            extra={
                "max_connections": requested,
                "fitted": fits,
                "backlog": backlog,
                "open_file_limit": soft,
            },
        )
        return fits, backlog
    return requested, backlog


def _open_now() -> int:
    """Descriptors this process has open (Linux; elsewhere a guess)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # pragma: no cover - no /proc
        return 16
