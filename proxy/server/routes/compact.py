"""`POST /v1/responses/compact`: the conversation so far → a `response.compaction` object.

    draining? 503 ─▶ read the body within the body budget (413, 415; 400: not a compact
    body) ─▶ merge the stored chain (`previous_response_id`) and `item_reference`s into the
    input, as a create does ─▶ render the summarisation pass (request/compaction.py; `mcp_*`
    items as the plain renderer reads them) ─▶ run it through upstream and the core
    (server/compaction.py; 502 `compaction_failed`) ─▶ answer the kept user messages (the
    newest, within `kept_budget`) + one sealed `compaction` item, with the pass's `usage`

Nothing is stored: the answer is the client's to keep. Counted in
`proxy_compactions_total{trigger="endpoint"}` and logged (ids, counts and sizes, never text).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import UnavailableError, UpstreamError
from proxy.harmony.request import compaction
from proxy.harmony.request.prepare import PreparedRequest, parse_body
from proxy.server import asgi
from proxy.server.compaction import plain_items, summarise, watched
from proxy.server.deps import SHUTTING_DOWN
from proxy.server.http.budget import read_body
from proxy.server.routes.answers import answered, services_of
from proxy.server.services import Services
from proxy.server.stateful.scope import refuse_without_store, scope_of


@answered
async def compact(request: Request) -> Response:
    """The route (module doc): a 4xx is the client's; a failed pass is counted."""
    services = services_of(request)
    started = services.monotonic()
    if services.state.draining:  # a new request during the drain goes to another replica
        raise UnavailableError(
            "the proxy is shutting down; retry on another replica", code=SHUTTING_DOWN
        )
    inbound = asgi.Inbound(request.receive)
    async with services.budget.reservation() as hold:  # as every body: within the budget
        raw = await read_body(request.scope, inbound, hold, services.settings.max_body_bytes)
        asgi.require_json(request.scope)
        body = compaction.read_compact_body(parse_body(raw))
    try:
        answer = await _compact(services, request, inbound, body, started)
    except UpstreamError:
        services.metrics.compactions.labels("endpoint", "failed").inc()
        raise
    services.metrics.compactions.labels("endpoint", "ok").inc()
    return JSONResponse(answer)


async def _compact(
    services: Services,
    request: Request,
    inbound: asgi.Inbound,
    body: dict[str, Any],
    started: float,
) -> dict[str, Any]:
    deps, stateful = services.deps, services.stateful
    pass_request = compaction.pass_body(body)

    async def render(merged: dict[str, Any]) -> PreparedRequest:
        return await deps.renderer.prepare(plain_items(merged))

    if body.get("previous_response_id") is not None:
        pass_request["previous_response_id"] = body["previous_response_id"]
    if stateful is not None:
        scope_key = scope_of(request.scope["headers"], deps.settings.store_scope_header)
        prepared, context = await stateful.prepare(pass_request, scope_key, render)
        history = list(context.body.get("input") or [])[:-1]  # without the instruction
    else:
        refuse_without_store(pass_request)
        prepared = await render(pass_request)
        history = list(pass_request["input"])[:-1]
    request_id = asgi.request_id(request.scope)
    # A client that goes away cancels the pass and its upstream request.
    done = await watched(
        inbound, summarise(deps, prepared, request_id, started, request.scope["headers"])
    )
    keys = deps.reasoning_keys
    kept = compaction.kept(
        history, keys, compaction.kept_budget(None, deps.settings.max_prompt_tokens)
    )
    item = compaction.compaction_item(deps.ids("cmp"), compaction.seal(keys, done.summary, kept))
    services.log(
        "compaction",
        request_id=request_id,
        trigger="endpoint",
        input_items=len(history),
        kept_items=len(kept),
        input_tokens=done.usage.get("input_tokens"),
        summary_chars=len(done.summary),
    )
    return {
        "id": deps.ids("resp"),
        "object": "response.compaction",
        "created_at": int(deps.clock()),
        "output": [*(compaction.kept_item(t, deps.ids("msg")) for t in kept), item],
        "usage": done.usage,
    }
