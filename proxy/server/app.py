"""The ASGI app: routes, lifespan (owns the upstream client and the capability probe), health.

POST /v1/responses   repaired when the model is in the repair set (repair.py), else passed on
GET  /healthz        liveness: 200, or 503 once draining
GET  /readyz         readiness: upstream reachable (its /health) and able to return token ids
GET  /metrics        Prometheus metrics of the proxy
*    /upstream/metrics  upstream's own /metrics (JSON iteration stats), passed through
*    anything else   passed through to upstream untouched (passthrough.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from importlib import metadata
from typing import Any

import httpx
from openai_harmony import HarmonyEncoding
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import Receive, Scope, Send

from proxy.config import Settings
from proxy.errors import ClientError, ProxyError
from proxy.harmony.request import parse_body
from proxy.harmony.request_prefix import PrefixCache
from proxy.harmony.response import IdFactory, random_id
from proxy.logs import get_logger
from proxy.metrics import Metrics
from proxy.server import asgi, passthrough
from proxy.server.forwarding import ForwardingMiddleware
from proxy.server.repair import RepairDeps, ServerState, serve_repaired
from proxy.upstream.client import Upstream

#: Seconds between capability probes while upstream is not (yet) able to serve us.
PROBE_RETRY = 2.0
#: Seconds between probes once it is (an upstream restart may swap the server).
PROBE_PERIOD = 30.0


def _harmony_version() -> str:
    try:
        return metadata.version("openai-harmony")
    except metadata.PackageNotFoundError:  # pragma: no cover - installed with the package
        return "unknown"


class _Raw:
    """Marks a raw ASGI callable for Starlette's `Route` (it wraps plain functions as
    request/response handlers; we stream and watch disconnects ourselves)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Any]) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def create_app(
    settings: Settings,
    encoding: HarmonyEncoding,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    registry: CollectorRegistry | None = None,
    ids: IdFactory = random_id,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    state: ServerState | None = None,
    logger: logging.Logger | None = None,
) -> Starlette:
    """Build the proxy app. Every seam is a parameter: the upstream transport, the metrics
    registry, ids and clocks, the shared state (draining), the logger."""
    if settings.upstream_url is None:
        raise ValueError("create_app needs settings.upstream_url (serve starts the simulator)")
    registry = registry or CollectorRegistry()
    metrics = Metrics(registry, models=settings.metrics_models, harmony_version=_harmony_version())
    state = state or ServerState()
    # Read at scrape time, also by the separate metrics port's app.
    metrics.draining.set_function(lambda: 1.0 if state.draining else 0.0)
    log_to = logger or get_logger()

    def log(message: str, **fields: Any) -> None:
        log_to.info(message, extra=fields)

    upstream = Upstream(
        settings.upstream_url, connect_timeout=settings.connect_timeout, transport=transport
    )
    deps = RepairDeps(
        settings=settings,
        encoding=encoding,
        upstream=upstream,
        metrics=metrics,
        state=state,
        log=log,
        ids=ids,
        prefixes=PrefixCache(encoding),
        clock=clock,
        monotonic=monotonic,
    )

    async def probe_forever() -> None:
        last = None
        while True:
            capability = await upstream.probe()
            state.capability = capability
            metrics.upstream_capable.set(1 if capability.token_ids else 0)
            # /readyz refines this on every probe of the kubelet; without one it stays current.
            metrics.ready.set(1 if capability.token_ids and not state.draining else 0)
            if capability != last:
                level = logging.INFO if capability.token_ids else logging.WARNING
                log_to.log(
                    level,
                    "upstream capability",
                    extra={
                        "upstream": settings.upstream_url,
                        "capable": capability.token_ids,
                        "detail": capability.detail,
                        "model": capability.model,
                    },
                )
                last = capability
            await asyncio.sleep(PROBE_PERIOD if capability.token_ids else PROBE_RETRY)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        probe = asyncio.create_task(probe_forever())
        try:
            yield
        finally:
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
            await upstream.aclose()

    async def responses(scope: Scope, receive: Receive, send: Send) -> None:
        started = monotonic()
        request_id = asgi.request_id(scope)
        inbound = asgi.Inbound(receive)
        if scope["method"] != "POST":
            await _forward(scope, inbound, send, request_id, started)
            return
        try:
            raw = await inbound.body(settings.max_body_bytes)
            asgi.require_json(scope)
            body = parse_body(raw)
        except asgi.ClientDisconnected:
            metrics.disconnects.labels("before_upstream").inc()
            return
        except ClientError as error:
            await _reject(send, error, request_id, started)
            return
        model = body.get("model")
        if isinstance(model, str) and not settings.repairs(model):
            await _forward(scope, inbound, send, request_id, started, body=raw)
            return
        if not state.capability.token_ids and settings.passthrough_when_incapable:
            await _forward(scope, inbound, send, request_id, started, body=raw)
            return
        await serve_repaired(deps, scope, inbound, send, body, request_id, started)

    async def _reject(send: Send, error: ProxyError, request_id: str, started: float) -> None:
        await asgi.send_error(send, error, [(b"x-request-id", request_id.encode())])
        metrics.requests.labels("responses", "unknown", "client_error", "other").inc()
        log(
            "request",
            request_id=request_id,
            route="/v1/responses",
            status=error.status,
            outcome="client_error",
            error=error.code or error.error_type,
            duration_ms=round((monotonic() - started) * 1000, 2),
        )

    async def _forward(
        scope: Scope,
        inbound: asgi.Inbound,
        send: Send,
        request_id: str,
        started: float,
        *,
        body: bytes | None = None,
        strip: str = "",
    ) -> None:
        await passthrough.forward(
            scope,
            inbound,
            send,
            upstream=upstream,
            metrics=metrics,
            request_id=request_id,
            timeout=settings.first_token_timeout,
            send_timeout=settings.send_timeout,
            max_body_bytes=settings.max_body_bytes,
            log=log,
            started=started,
            monotonic=monotonic,
            body=body,
            path_prefix_strip=strip,
        )

    async def everything_else(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # websockets and friends: not ours to proxy
            return
        strip = "/upstream" if scope["path"] == "/upstream/metrics" else ""
        await _forward(
            scope, asgi.Inbound(receive), send, asgi.request_id(scope), monotonic(), strip=strip
        )

    async def healthz(request: Request) -> Response:
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        reachable = False
        detail = state.capability.detail
        if not state.draining:
            try:
                answer = await upstream.get_health()
                reachable = answer == 200
                if not reachable:
                    detail = f"upstream /health answered {answer}"
            except httpx.HTTPError as exc:
                detail = f"upstream /health unreachable: {type(exc).__name__}"
        ready = reachable and state.capability.token_ids and not state.draining
        metrics.ready.set(1 if ready else 0)
        body = {
            "ready": ready,
            "draining": state.draining,
            "upstream": settings.upstream_url,
            "upstream_reachable": reachable,
            "token_ids": state.capability.token_ids,
            "detail": "draining" if state.draining else detail,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(
        routes=[
            Route("/v1/responses", _Raw(responses), methods=None),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            Mount("/", everything_else),
        ],
        # Forwarding headers set from the connection, never the client's (issue 12).
        middleware=[Middleware(ForwardingMiddleware, trusted_proxies=settings.trusted_proxies)],
        lifespan=lifespan,
    )
    app.state.proxy = state
    app.state.metrics = metrics
    app.state.registry = registry
    return app
