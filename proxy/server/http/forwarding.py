"""What upstream is told about the client: forwarding headers set by us from
the connection, never a client's passed on verbatim.

trtllm-serve runs uvicorn, which believes `X-Forwarded-For`/`-Proto` from 127.0.0.1 — the
sidecar proxy's own address — so whatever a client wrote there used to become trtllm-serve's idea
of the client. `ForwardingMiddleware` rewrites each request's headers before any route sees them:

- dropped from the client: every `X-Forwarded-*` (`-For`, `-Host`, `-Proto`, `-Port`, `-Prefix`,
  `-Server`, …), `Forwarded`, `X-Real-IP`, the client addresses CDNs and load balancers set
  (`True-Client-IP`, `X-Client-IP`, `X-Cluster-Client-IP`, `CF-Connecting-IP`,
  `Fastly-Client-IP`, `X-Original-Forwarded-For`), and the request-target rewrites some
  frameworks honour (`X-Original-URL`, `X-Rewrite-URL`, `X-Original-Host`): a server behind us
  must learn the client, scheme, host and target from us alone;
- set by us: `X-Forwarded-For` (the peer's address), `X-Forwarded-Proto` (the connection's
  scheme), `X-Forwarded-Host` (the request's `Host`);
- when the peer is one of `trusted_proxies` (a load balancer in front of us), its chain is kept
  and our peer appended (`X-Forwarded-For: client, lb`), and its `-Proto`/`-Host` are kept.

`scope["client"]` and `scope["scheme"]` then come from uvicorn's own `ProxyHeadersMiddleware`
with the same trusted set (so they cannot be spoofed either); uvicorn's server-level copy of it,
which trusts 127.0.0.1 by default, is switched off (`Guard.uvicorn_options`). Both the
pass-through route and the repaired route's completion request forward these headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

#: Forwarding headers a client may send; never passed on as sent (module doc). Any other name
#: starting with `x-forwarded-` is dropped too (`_PREFIX`).
CLIENT_FORWARDING = frozenset(
    {
        b"x-forwarded-for",
        b"x-forwarded-host",
        b"x-forwarded-proto",
        b"x-forwarded-port",
        b"forwarded",
        b"x-real-ip",
        b"true-client-ip",
        b"x-client-ip",
        b"x-cluster-client-ip",
        b"cf-connecting-ip",
        b"fastly-client-ip",
        b"x-original-forwarded-for",
        b"x-original-url",
        b"x-rewrite-url",
        b"x-original-host",
    }
)
_PREFIX = b"x-forwarded-"
#: Header names remembered as no forwarding header, per middleware: a set lookup per header
#: instead of the exact-name lookup plus a prefix test (which doubled the function's cost).
#: Bounded, so a client inventing names cannot grow it.
PLAIN_NAMES = 256
_SCHEMES = frozenset({b"http", b"https"})


class ForwardingMiddleware:
    """ASGI middleware: the forwarding headers of the module doc, then uvicorn's
    `ProxyHeadersMiddleware` for `scope["client"]` when any proxy is trusted."""

    def __init__(self, app: ASGIApp, trusted_proxies: Sequence[str] = ()) -> None:
        self._app: ASGIApp = app
        self._trusted = None
        if trusted_proxies:
            # uvicorn types its middleware with its own (narrower) ASGI aliases.
            headers = ProxyHeadersMiddleware(cast(Any, app), trusted_hosts=list(trusted_proxies))
            self._app = cast(ASGIApp, headers)
            self._trusted = headers.trusted_hosts
        self._plain: set[bytes] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            client = scope.get("client")
            peer = client[0] if client else ""
            trusted = self._trusted is not None and peer in self._trusted
            scope["headers"] = forwarded_headers(
                scope["headers"],
                peer,
                scope.get("scheme", "http"),
                trusted=trusted,
                plain=self._plain,
            )
        await self._app(scope, receive, send)


def forwarded_headers(
    headers: Sequence[tuple[bytes, bytes]],
    peer: str,
    scheme: str,
    *,
    trusted: bool,
    plain: set[bytes] | None = None,
) -> list[tuple[bytes, bytes]]:
    """`headers` with the client's forwarding headers replaced by ours (module doc); `plain`:
    names known to be no forwarding header, added to (up to `PLAIN_NAMES`)."""
    if plain is None:
        plain = set()
    kept: list[tuple[bytes, bytes]] = []
    chain: list[bytes] = []
    proto = host = None
    own_host = None
    for name, value in headers:
        if name in plain:
            pass
        elif name in CLIENT_FORWARDING or name.startswith(_PREFIX):
            if trusted:
                if name == b"x-forwarded-for":
                    chain.append(value.strip())
                elif name == b"x-forwarded-proto" and proto is None:
                    proto = value.strip().lower()
                elif name == b"x-forwarded-host" and host is None:
                    host = value.strip()
            continue
        elif len(plain) < PLAIN_NAMES:
            plain.add(name)
        if name == b"host" and own_host is None:
            own_host = value
        kept.append((name, value))
    chain.append(peer.encode("latin-1"))
    kept.append((b"x-forwarded-for", b", ".join(part for part in chain if part)))
    if proto is None or proto not in _SCHEMES:
        proto = scheme.encode("latin-1")
    kept.append((b"x-forwarded-proto", proto))
    forwarded_host = host or own_host
    if forwarded_host:
        kept.append((b"x-forwarded-host", forwarded_host))
    return kept
