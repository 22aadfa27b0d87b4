"""The stored-response calls of the Responses API (OpenAI's reference is the contract, the
`openai` SDK's calls are the test):

    GET    /v1/responses/{id}                 the response as it stands (JSON), or with
           ?stream=true[&starting_after=N]    its events as SSE from N+1, live until it ends
    DELETE /v1/responses/{id}                 {"id", "object": "response", "deleted": true}
    GET    /v1/responses/{id}/input_items     the items it was generated from (list object)
    POST   /v1/responses/{id}/cancel          a background response ends `cancelled`
    POST   /v1/responses/input_tokens         the prompt length the proxy would send upstream

Every call is scoped by credential (stateful/scope.py): another credential's response is a 404.
A store that does not answer is a 503 before anything else is sent. When some models pass
through to upstream (`repair_models` is not `*`), an id the store does not know goes to
upstream, whose own store may hold it. With the store off only `input_tokens` is the proxy's
(`create_app` routes the rest to upstream).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from proxy.errors import ClientError
from proxy.harmony.history.stored import RUNNING, StoredResponse
from proxy.harmony.request.fields import check_response_id
from proxy.harmony.request.prepare import parse_body
from proxy.server import asgi
from proxy.server.routes.answers import (
    answered,
    query_flag,
    query_integer,
    query_order,
    services_of,
)
from proxy.server.routes.passthrough import Forwarded
from proxy.server.services import Services
from proxy.server.stateful.follow import follow
from proxy.server.stateful.scope import scope_of
from proxy.server.stateful.state import Loaded, Stateful
from proxy.store import CANCEL, Delete, Op, Signal

#: `POST /v1/responses/input_tokens` body fields (the spec's `TokenCountsBody`).
_COUNT_FIELDS = frozenset(
    {
        "conversation",
        "input",
        "instructions",
        "model",
        "parallel_tool_calls",
        "personality",
        "previous_response_id",
        "reasoning",
        "text",
        "tool_choice",
        "tools",
        "truncation",
    }
)
#: Seconds a cancel waits for the run to record its end before answering as it stands.
CANCEL_WAIT = 10.0

#: A handler of the response of the path: the request, its services' store, the response.
OnStored = Callable[[Request, Stateful, Loaded], Awaitable[Response]]


def _scope_key(request: Request) -> str:
    settings = services_of(request).settings
    return scope_of(request.scope["headers"], settings.store_scope_header)


def _not_found(key: str) -> ClientError:
    return ClientError(
        f"Response with id '{key}' not found.", status=404, param="response_id", code=None
    )


def on_stored(handler: OnStored) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint for the response of the path: found (else 404, 503 or forwarded, module
    doc), answered and logged as every route is (`answered`)."""

    @answered
    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        services = services_of(request)
        stateful = services.stateful
        assert stateful is not None  # routed only with the store on
        key = request.path_params["response_id"]
        check_response_id(key, "response_id")
        loaded = await stateful.load(_scope_key(request), key)
        if loaded is None:
            if services.settings.repair_models != ("*",):
                return Forwarded()
            raise _not_found(key)
        return await handler(request, stateful, loaded)

    return endpoint


@on_stored
async def retrieve(request: Request, stateful: Stateful, found: Loaded) -> Response:
    query = request.query_params
    stream = query_flag(query.get("stream"), "stream")
    after = query_integer(query.get("starting_after"), "starting_after", low=-1)
    if not stream:
        return JSONResponse(found.response)
    return _Follow(stateful, _scope_key(request), found.key, -1 if after is None else after)


@on_stored
async def delete(request: Request, stateful: Stateful, found: Loaded) -> Response:
    background = services_of(request).background
    if background is not None:
        background.cancel(found.key)
    # A run elsewhere hears the cancel first; its last writes then go nowhere.
    ops: list[Op] = [Signal(found.key, CANCEL), Delete(found.key)]
    await stateful.guard(stateful.store.apply(ops))
    return JSONResponse({"id": found.key, "object": "response", "deleted": True})


@on_stored
async def input_items(request: Request, stateful: Stateful, found: Loaded) -> Response:
    query = request.query_params
    limit = query_integer(query.get("limit"), "limit", low=1, high=100) or 20
    order = query_order(query)
    items = await _context_items(stateful, _scope_key(request), found.record)
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise ClientError(f"No input item with id '{after[:100]}'.", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


@on_stored
async def cancel(request: Request, stateful: Stateful, found: Loaded) -> Response:
    if not found.record.background:
        raise ClientError(
            "Cannot cancel a synchronous response: only responses created with "
            "'background': true can be cancelled.",
            param="response_id",
        )
    if found.response["status"] not in RUNNING:
        return JSONResponse(found.response)  # cancelling again, or too late: as it ended
    background = services_of(request).background
    if background is None or not background.cancel(found.key):
        await stateful.guard(stateful.store.apply([Signal(found.key, CANCEL)]))
    ended = await _wait_end(stateful, _scope_key(request), found.key)
    return JSONResponse(ended.response if ended is not None else found.response)


@answered
async def input_tokens(request: Request) -> Response:
    body = parse_body(await request.body())
    count = await _count(services_of(request), _scope_key(request), body)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": count})


class _Follow(Response):
    """A `GET ?stream=true` answer: `follow` on the raw ASGI connection."""

    def __init__(self, stateful: Stateful, scope_key: str, key: str, after: int) -> None:
        super().__init__()
        self._args = (stateful, scope_key, key, after)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        inbound = asgi.Inbound(receive)
        await inbound.body(0)  # a GET: reading its (empty) body frees the receive channel
        stateful, scope_key, key, after = self._args
        headers = [(b"x-request-id", self.headers.get("x-request-id", "").encode())]
        await follow(stateful, scope_key, key, after, inbound, send, headers)


async def _context_items(stateful: Stateful, scope_key: str, record: StoredResponse) -> list[Any]:
    """The items a response was generated from: its chain's inputs and outputs, then its own
    input (what a client continuing it would have sent in full)."""
    items: list[Any] = []
    for entry in await stateful.guard(stateful.store.get_many(scope_key, list(record.chain))):
        if entry is not None:  # an ancestor deleted since: its items are gone with it
            earlier = StoredResponse.decode(entry.doc)
            items += earlier.input
            items += earlier.response.get("output") or []
    return items + record.input


async def _wait_end(stateful: Stateful, scope_key: str, key: str) -> Loaded | None:
    """The response once its run recorded its end (bounded by `CANCEL_WAIT`): woken by each
    append to its log, wherever the run is."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CANCEL_WAIT
    last = -1
    while True:
        loaded = await stateful.load(scope_key, key)
        left = deadline - loop.time()
        if loaded is None or loaded.response["status"] not in RUNNING or left <= 0:
            return loaded
        entries = await stateful.guard(stateful.store.read_log(key, last))
        if entries:
            last = entries[-1][0]
        await stateful.guard(stateful.store.wait_log(key, last, min(left, 1.0)))


async def _count(services: Services, scope_key: str, body: dict[str, Any]) -> int:
    """`input_tokens`: the body as a create request, rendered as one (the same body, the same
    prompt ids)."""
    for key in body:
        if key not in _COUNT_FIELDS:
            raise ClientError(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
    if body.get("personality") is not None:
        raise ClientError(
            "'personality' presets are not supported for gpt-oss",
            param="personality",
            code="unsupported_parameter",
        )
    create = {k: v for k, v in body.items() if k != "personality"}
    create["model"] = body.get("model") or "gpt-oss"
    if create.get("input") is None:
        create["input"] = []
    create["store"] = False  # counting stores nothing
    render = services.renderer.prepare
    if services.stateful is None:
        prepared = await render(create)
    else:
        prepared, _ = await services.stateful.prepare(create, scope_key, render)
    return len(prepared.prompt_token_ids)
