"""The ASGI app: routes, lifespan (owns the upstream client and the capability probe), health.

POST /v1/responses   repaired when the model is in the repair set (repair.py), else passed on
GET  /healthz        liveness: 200, or 503 once draining
GET  /readyz         readiness: the first capability probe has run (capability.py), upstream
                     reachable (its /health) and able to return token ids, a render worker up
                     (rendering/pool.py), not draining
GET  /metrics        Prometheus metrics of the proxy
*    /v1/responses/…   the stored responses (responses_api.py, issue 13), on the store the
                     lifespan opens from `store_url` (background runs: background.py)
*    /v1/conversations…  conversations and their items (conversations_api.py, issue 16)
*    /upstream/metrics  upstream's own /metrics (JSON iteration stats), passed through
*    anything else   passed through to upstream untouched (passthrough.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from openai_harmony import HarmonyEncoding
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import Receive, Scope, Send

from proxy.config import Settings
from proxy.errors import ClientError, ProxyError, UnavailableError, UpstreamError
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.request.prepare import parse_body
from proxy.harmony.response import IdFactory, random_id
from proxy.harmony.stream.parser import TokenTable
from proxy.logs import get_logger
from proxy.metrics import Metrics
from proxy.server import asgi, passthrough
from proxy.server.capability import decoder, first_probe, probe_forever
from proxy.server.deps import RepairDeps, ServerState, until_drained
from proxy.server.http.budget import BodyBudget, discard_body, read_body
from proxy.server.http.forwarding import ForwardingMiddleware
from proxy.server.rendering.pool import Renderer, default_renderer
from proxy.server.rendering.worker import RenderOptions
from proxy.server.repair import serve_repaired
from proxy.server.stateful import conversations_api, responses_api
from proxy.server.stateful.background import Background
from proxy.server.stateful.state import Stateful
from proxy.store import OFF, Store, StoreError, open_store
from proxy.upstream.client import Upstream
from proxy.upstream.transport import Transport


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
    transport: Transport | None = None,
    registry: CollectorRegistry | None = None,
    ids: IdFactory = random_id,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    state: ServerState | None = None,
    logger: logging.Logger | None = None,
    renderer: Renderer | None = None,
    reasoning_keys: ReasoningKeys | None = None,
    store: Store | None = None,
) -> Starlette:
    """Build the proxy app. Every seam is a parameter: the upstream transport, the metrics
    registry, ids and clocks, the shared state (draining), the logger, the renderer (default:
    a `RenderPool` of `render_workers` processes, or inline when that is 0), the keys that seal
    reasoning (default: `settings.reasoning_keys`, else one random key, with a warning), the
    response store (None: the lifespan opens the one `store_url` names)."""
    if settings.upstream_url is None:
        raise ValueError("create_app needs settings.upstream_url (serve starts the simulator)")
    registry = registry or CollectorRegistry()
    metrics = Metrics(registry, models=settings.metrics_models, harmony_version=_harmony_version())
    state = state or ServerState()
    log_to = logger or get_logger()

    def log(message: str, **fields: Any) -> None:
        log_to.info(message, extra=fields)

    if reasoning_keys is None and settings.reasoning_keys:
        reasoning_keys = ReasoningKeys(settings.reasoning_keys)
    if reasoning_keys is None:
        # Issue 14: sealed reasoning must work out of the box, but a key made here dies with
        # the process and differs per replica: say so once (never the key itself).
        reasoning_keys = ReasoningKeys.generate()
        log_to.warning(
            "reasoning key generated",
            extra={
                "detail": "no reasoning_keys set: encrypted_content blobs will not open after "
                "a restart or on another replica (set PROXY_REASONING_KEYS)"
            },
        )

    upstream = Upstream(
        settings.upstream_url, connect_timeout=settings.connect_timeout, transport=transport
    )
    prefixes = PrefixCache(encoding)
    if renderer is None:
        options = RenderOptions(reasoning_keys, settings.max_prompt_tokens)
        renderer = default_renderer(settings, encoding, prefixes, options, metrics, log)
    budget = BodyBudget(settings.body_budget_bytes, settings.body_budget_wait)
    stateful = None
    if store is not None or settings.store_url != OFF:
        stateful = Stateful(settings, metrics, ids=ids, clock=clock, logger=log_to)
    deps = RepairDeps(
        settings=settings,
        encoding=encoding,
        upstream=upstream,
        metrics=metrics,
        state=state,
        log=log,
        ids=ids,
        prefixes=prefixes,
        reasoning_keys=reasoning_keys,
        tokens=TokenTable(encoding),
        clock=clock,
        monotonic=monotonic,
        renderer=renderer,
        stateful=stateful,
    )
    background = Background(deps) if stateful is not None else None
    deps = dataclasses.replace(deps, background=background)

    async def open_the_store() -> None:
        if stateful is None:
            return
        opened = store
        if opened is None:
            try:
                opened = await open_store(
                    settings.store_url,
                    data_dir=Path(settings.data_dir),
                    max_bytes=settings.store_max_bytes,
                    clock=clock,
                )
            except StoreError as exc:
                raise RuntimeError(f"cannot open the response store: {exc}") from exc
        assert opened is not None  # `off` made no Stateful
        stateful.start(opened)
        log_to.info("response store", extra={"backend": opened.kind})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await renderer.start()
        await open_the_store()
        probe = asyncio.create_task(
            probe_forever(upstream, settings, state, metrics, log_to, decoder(encoding))
        )
        try:
            yield
        finally:
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
            if background is not None:
                await background.aclose(settings.drain_timeout)
            if stateful is not None:
                await stateful.aclose()
            await renderer.aclose()
            await upstream.aclose()

    def counted(
        handler: Callable[[Scope, Receive, Send], Awaitable[None]],
    ) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        """Count the requests being handled: the drain waits for none (runner.py)."""

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            state.active += 1
            try:
                await handler(scope, receive, send)
            finally:
                state.active -= 1

        return run

    async def responses(scope: Scope, receive: Receive, send: Send) -> None:
        started = monotonic()
        request_id = asgi.request_id(scope)
        inbound = asgi.Inbound(receive)
        if scope["method"] != "POST":
            await _forward(scope, inbound, send, request_id, started)
            return
        if state.draining:  # issue 12: a new request during the drain goes to another replica
            error = UnavailableError(
                "the proxy is shutting down; retry on another replica",
                code="server_shutting_down",
            )
            if asgi.body_coming(scope):
                await discard_body(inbound, settings.max_body_bytes)
            await _reject(send, error, request_id, started, close=True)
            return
        # The body is read, parsed and rendered within its share of the body budget (budget.py).
        async with budget.reservation() as hold:
            try:
                raw = await read_body(scope, inbound, hold, settings.max_body_bytes)
                asgi.require_json(scope)
                body = parse_body(raw)
            except asgi.ClientDisconnected:
                metrics.disconnects.labels("before_upstream").inc()
                return
            except (ClientError, UnavailableError) as error:
                close = error.status == 413 and not asgi.body_coming(scope)
                if isinstance(error, UnavailableError) and asgi.body_coming(scope):
                    hold.release()
                    await discard_body(inbound, settings.max_body_bytes)
                await _reject(send, error, request_id, started, close=close)
                return
            model = body.get("model")
            if not state.probed.is_set():  # a new worker: what upstream can do is not known yet
                try:
                    await until_drained(state, first_probe(state))
                except UnavailableError as error:
                    await _reject(send, error, request_id, started)
                    return
            if (isinstance(model, str) and not settings.repairs(model)) or (
                not state.capability.token_ids and settings.passthrough_when_incapable
            ):
                hold.release()
                await _forward(scope, inbound, send, request_id, started, body=raw)
                return
            del raw  # not kept for the life of the stream
            await serve_repaired(
                deps, scope, inbound, send, body, request_id, started, on_prepared=hold.release
            )

    async def _reject(
        send: Send, error: ProxyError, request_id: str, started: float, *, close: bool = False
    ) -> None:
        headers = [(b"x-request-id", request_id.encode())]
        if error.status in (429, 503):
            headers.append((b"retry-after", b"1"))
        if close:
            headers.append((b"connection", b"close"))
        await asgi.send_error(send, error, headers)
        outcome = "rejected" if error.status == 503 else "client_error"
        metrics.requests.labels("responses", "unknown", outcome, "other").inc()
        log(
            "request",
            request_id=request_id,
            route="/v1/responses",
            status=error.status,
            outcome=outcome,
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
            idle_timeout=settings.idle_timeout,
            send_timeout=settings.send_timeout,
            max_body_bytes=settings.max_body_bytes,
            log=log,
            started=started,
            monotonic=monotonic,
            body=body,
            path_prefix_strip=strip,
            state=state,
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
            except UpstreamError as exc:
                detail = f"upstream /health: {exc.message}"
        rendering = renderer.ready()
        if not rendering and reachable:
            detail = "no render worker is ready yet"
        capability = state.capability
        probed = state.probed.is_set()
        ready = probed and reachable and capability.token_ids and rendering and not state.draining
        metrics.ready.set(1 if ready else 0)
        body = {
            "ready": ready,
            "draining": state.draining,
            "upstream": settings.upstream_url,
            "probed": probed,
            "upstream_reachable": reachable,
            "token_ids": capability.token_ids,
            "logprobs": capability.logprobs,
            "guided_decoding": capability.guided_decoding,
            "unenforced_constraints": settings.unenforced_constraints,
            "render_ready": rendering,
            "detail": "draining" if state.draining else detail,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def forward_unknown(scope: Scope, receive: Receive, send: Send) -> None:
        await _forward(scope, asgi.Inbound(receive), send, asgi.request_id(scope), monotonic())

    app = Starlette(
        routes=[
            Route("/v1/responses", _Raw(counted(responses)), methods=None),
            *responses_api.routes(deps, forward_unknown),
            *conversations_api.routes(deps, budget),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            Mount("/", counted(everything_else)),
        ],
        # Forwarding headers set from the connection, never the client's (issue 12).
        middleware=[Middleware(ForwardingMiddleware, trusted_proxies=settings.trusted_proxies)],
        lifespan=lifespan,
    )
    app.state.proxy = state
    app.state.metrics = metrics
    app.state.registry = registry
    app.state.renderer = renderer
    return app
