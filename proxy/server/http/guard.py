"""HTTP/1.1 limits on the client side (issue 12, items 2 and 7): uvicorn's httptools protocol
plus the guards it lacks, answered the way nginx and Envoy answer them.

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
    max_connections      a new connection over the cap                    close the longest-idle
                                                                          keep-alive connection,
                                                                          else 503 + Retry-After

Every answer is an OpenAI-style JSON error with `connection: close`, followed by a lingering
close (RFC 9112 §9.6): our FIN goes first and what the client still sends is read and dropped
for up to `LINGER_SECONDS`, so the client reads the answer instead of a reset.

The protocol itself: `proxy/server/http/guard_protocol.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.config import Settings
from proxy.metrics import Metrics
from proxy.server.http.guard_protocol import GuardedProtocol

#: Open files kept for everything but client connections and their upstream connections.
FD_RESERVE = 64


@dataclass(frozen=True, slots=True)
class Limits:
    """The client-side limits: the settings of the same names (config.py, README)."""

    max_header_bytes: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    body_min_rate: int
    keepalive_timeout: float
    #: 0: no cap.
    max_connections: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(**{name: getattr(settings, name) for name in cls.__dataclass_fields__})


class Guard:
    """What the connections of one server share: the limits, the number of open connections,
    the keep-alive connections now idle (oldest first), and where limit events go."""

    def __init__(
        self,
        limits: Limits,
        observe: Callable[[str], None] | None = None,
        connections: Callable[[int], None] | None = None,
    ) -> None:
        self.limits = limits
        self.observe: Callable[[str], None] = observe or (lambda kind: None)
        #: Told the number of open connections when it changes (a gauge: with worker
        #: processes a scrape cannot read another process's count; issue 17).
        self.connections: Callable[[int], None] = connections or (lambda count: None)
        self.open = 0
        self.idle: dict[GuardedProtocol, None] = {}

    def protocol(self) -> type[GuardedProtocol]:
        """The protocol class for `uvicorn.Config(http=...)`, bound to this guard."""

        class Bound(GuardedProtocol):
            guard = self

        return Bound

    def uvicorn_options(self) -> dict[str, Any]:
        """`uvicorn.Config` keywords for a server guarded by this guard. uvicorn's own forwarding
        middleware stays off: the app applies it with `trusted_proxies` (forwarding.py), after
        noting the real peer; uvicorn's default would trust any client on 127.0.0.1."""
        return {"http": self.protocol(), "ws": "none", "proxy_headers": False}


def http_guard(settings: Settings, metrics: Metrics, logger: logging.Logger) -> Guard:
    """The guard of `serve`: the limits of `settings`, reported to `metrics`, with
    `max_connections` fitted to the open-file limit (raised to its hard maximum first)."""
    fitted = fit_connections(settings.max_connections, logger)
    limits = dataclasses.replace(Limits.of(settings), max_connections=fitted)
    return Guard(
        limits,
        lambda kind: metrics.http_limits.labels(kind).inc(),
        metrics.client_connections.set,
    )


def fit_connections(requested: int, logger: logging.Logger) -> int:
    """`requested` connections (0: no cap), or fewer if the open-file limit cannot hold them:
    each needs its own descriptor and one for its upstream request (issue 12: with a 256-file
    limit, slow clients took every descriptor and accept() failed for everyone else)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        # As Go's runtime does: the soft limit (often 1024) is a default, the hard one the grant.
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # pragma: no cover - a platform that refuses
            pass
    if not requested or soft == resource.RLIM_INFINITY:
        return requested
    fits = max(1, (soft - FD_RESERVE) // 2)
    if requested > fits:
        logger.warning(
            "max_connections lowered to fit the open-file limit",
            extra={"max_connections": requested, "fitted": fits, "open_file_limit": soft},
        )
        return fits
    return requested
