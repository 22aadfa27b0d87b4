"""The probes of the proxy itself:

GET /healthz   liveness: 200, or 503 once draining
GET /readyz    readiness: the first capability probe has run (capability.py), upstream
               reachable (its /health) and able to return token ids, a render worker up
               (rendering/pool.py), not draining; the body says which is missing
GET /metrics   the proxy's Prometheus metrics (with worker processes: all of theirs)
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import UpstreamError
from proxy.metrics.exposition import exposition
from proxy.server.routes.answers import services_of


async def healthz(request: Request) -> Response:
    if services_of(request).state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    services = services_of(request)
    state, settings = services.state, services.settings
    reachable = False
    detail = state.capability.detail
    if not state.draining:
        try:
            answer = await services.upstream.get_health()
            reachable = answer == 200
            if not reachable:
                detail = f"upstream /health answered {answer}"
        except UpstreamError as exc:
            detail = f"upstream /health: {exc.message}"
    rendering = services.renderer.ready()
    if not rendering and reachable:
        detail = "no render worker is ready yet"
    capability = state.capability
    probed = state.probed.is_set()
    ready = probed and reachable and capability.token_ids and rendering and not state.draining
    services.metrics.ready.set(1 if ready else 0)
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


async def metrics(request: Request) -> Response:
    """Prometheus' text format, or OpenMetrics (with exemplars) when the scraper asks for it."""
    text, content_type = exposition(
        services_of(request).registry, request.headers.get("accept", "")
    )
    return Response(text, media_type=content_type)
