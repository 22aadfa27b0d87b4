"""Everything the proxy does not serve itself goes to upstream untouched (relay.py): any path
without a route of its own, `/upstream/metrics` (upstream's own `/metrics`, its JSON iteration
stats), a `/v1/responses` the proxy does not repair (a model outside the repair set, or an
upstream that cannot give token ids with `passthrough_when_incapable`), and a stored response
id the proxy's store does not know while some models pass through."""

from __future__ import annotations

from starlette.types import Receive, Scope, Send

from proxy.server import asgi, relay
from proxy.server.routes.answers import Unlogged, services_in
from proxy.server.services import Services


async def forward(
    services: Services,
    scope: Scope,
    inbound: asgi.Inbound,
    send: Send,
    request_id: str,
    started: float,
    *,
    body: bytes | None = None,
    strip: str = "",
) -> None:
    """Pass one request to upstream under the settings' timeouts and limits; `body` when it
    was read already, `strip` a path prefix upstream does not have."""
    settings = services.settings
    await relay.forward(
        scope,
        inbound,
        send,
        upstream=services.upstream,
        metrics=services.metrics,
        request_id=request_id,
        timeout=settings.first_token_timeout,
        idle_timeout=settings.idle_timeout,
        send_timeout=settings.send_timeout,
        max_body_bytes=settings.max_body_bytes,
        log=services.log,
        started=started,
        monotonic=services.monotonic,
        body=body,
        path_prefix_strip=strip,
        state=services.state,
        tracing=services.deps.tracing,
    )


async def everything_else(scope: Scope, receive: Receive, send: Send) -> None:
    """The app's last route: any path, any method."""
    if scope["type"] != "http":  # websockets and friends: not ours to proxy
        return
    services = services_in(scope)
    strip = "/upstream" if scope["path"] == "/upstream/metrics" else ""
    inbound = asgi.Inbound(receive)
    started = services.monotonic()
    await forward(services, scope, inbound, send, asgi.request_id(scope), started, strip=strip)


class Forwarded(Unlogged):
    """A request/response route's answer that hands the request to upstream instead (which
    logs it): a stored response id the proxy's store does not know."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        services = services_in(scope)
        inbound = asgi.Inbound(receive)
        started = services.monotonic()
        await forward(services, scope, inbound, send, asgi.request_id(scope), started)
