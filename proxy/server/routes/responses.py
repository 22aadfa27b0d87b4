"""`POST /v1/responses`: the route every Responses create takes. A raw ASGI handler (it streams
and watches the client's disconnect itself):

    draining? ─▶ 503 server_shutting_down (+ Connection: close), its body read and dropped
    read the body within the body budget (http/budget.py): 413, 415, 400, 503 on the way
    first capability probe not ended yet? ─▶ wait for it (capability.py), at most a few seconds
    model outside the repair set, or upstream incapable and `passthrough_when_incapable`
        ─▶ upstream untouched (routes/passthrough.py)
    else ─▶ the repaired answer (routes/repair.py); the body budget is released once rendered

Other methods on the path go to upstream untouched.
"""

from __future__ import annotations

from starlette.types import Receive, Scope, Send

from proxy.errors import ClientError, ProxyError, UnavailableError
from proxy.harmony.request.prepare import parse_body
from proxy.server import asgi
from proxy.server.deps import SHUTTING_DOWN
from proxy.server.http.budget import discard_body, read_body
from proxy.server.routes.answers import refuse, services_in
from proxy.server.routes.passthrough import forward
from proxy.server.routes.repair import passes_through, probed, serve_repaired


async def create(scope: Scope, receive: Receive, send: Send) -> None:
    """The route (module doc)."""
    services = services_in(scope)
    settings, state = services.settings, services.state
    started = services.monotonic()
    request_id = asgi.request_id(scope)
    inbound = asgi.Inbound(receive)
    if scope["method"] != "POST":
        await forward(services, scope, inbound, send, request_id, started)
        return
    if state.draining:  # a new request during the drain goes to another replica
        error = UnavailableError(
            "the proxy is shutting down; retry on another replica", code=SHUTTING_DOWN
        )
        if asgi.body_coming(scope):
            await discard_body(inbound, settings.max_body_bytes)
        await refuse(services, send, error, request_id, started, outcome="rejected", close=True)
        return
    async with services.budget.reservation() as hold:
        try:
            raw = await read_body(scope, inbound, hold, settings.max_body_bytes)
            asgi.require_json(scope)
            body = parse_body(raw)
        except asgi.ClientDisconnected:
            services.metrics.disconnects.labels("before_upstream").inc()
            return
        except (ClientError, UnavailableError) as error:
            close = error.status == 413 and not asgi.body_coming(scope)
            if isinstance(error, UnavailableError) and asgi.body_coming(scope):
                hold.release()
                await discard_body(inbound, settings.max_body_bytes)
            outcome = _outcome(error)
            await refuse(services, send, error, request_id, started, outcome=outcome, close=close)
            return
        try:
            await probed(state)  # a new worker: what upstream can do is not known yet
        except UnavailableError as error:
            await refuse(services, send, error, request_id, started, outcome=_outcome(error))
            return
        if passes_through(settings, state, body.get("model")):
            hold.release()
            await forward(services, scope, inbound, send, request_id, started, body=raw)
            return
        del raw  # not kept for the life of the stream
        await serve_repaired(
            services, scope, inbound, send, body, request_id, started, on_prepared=hold.release
        )


def _outcome(error: ProxyError) -> str:
    return "rejected" if error.status == 503 else "client_error"
