"""The stored-response calls of the Responses API (issue 13; OpenAI's reference is the
contract, the `openai` SDK's calls are the test):

    GET    /v1/responses/{id}                 the response as it stands (JSON), or with
           ?stream=true[&starting_after=N]    its events as SSE from N+1, live until it ends
    DELETE /v1/responses/{id}                 {"id", "object": "response", "deleted": true}
    GET    /v1/responses/{id}/input_items     the items it was generated from (list object)
    POST   /v1/responses/{id}/cancel          a background response ends `cancelled`
    POST   /v1/responses/input_tokens         the prompt length the proxy would send upstream

Every call is scoped by credential (stateful/state.py): another credential's response is a 404. A
store that does not answer is a 503 before anything else is sent. When some models pass through
to upstream (`repair_models` is not `*`), an id the store does not know goes to upstream, whose
own store may hold it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proxy import sse
from proxy.errors import ClientError, ProxyError, StoreUnavailableError
from proxy.harmony.history.stored import RUNNING, TERMINAL_EVENTS, StoredResponse, decode_events
from proxy.harmony.request.fields import check_response_id
from proxy.harmony.request.prepare import parse_body
from proxy.server import asgi
from proxy.server.stateful.scope import scope_of
from proxy.server.stateful.state import Loaded
from proxy.store import CANCEL, Delete, Op, Signal

if TYPE_CHECKING:
    from proxy.server.deps import RepairDeps

#: Pass-through of a request the store cannot answer: (scope, receive, send).
Forward = Callable[[Scope, Receive, Send], Awaitable[None]]
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


def _not_found(key: str) -> ClientError:
    return ClientError(
        f"Response with id '{key}' not found.", status=404, param="response_id", code=None
    )


async def follow(
    deps: RepairDeps,
    scope_key: str,
    key: str,
    after: int,
    inbound: asgi.Inbound,
    send: Send,
    headers: list[tuple[bytes, bytes]],
) -> None:
    """Stream a stored response's events after sequence number `after` as SSE, then follow it
    live until its terminal event (any process or replica may be running it)."""
    stateful = deps.stateful
    assert stateful is not None
    store, settings = stateful.store, deps.settings
    timed = asgi.with_send_timeout(send, settings.send_timeout)

    async def work() -> None:
        await timed(
            {"type": "http.response.start", "status": 200, "headers": [*asgi.SSE_HEADERS, *headers]}
        )
        last = after
        try:
            entries = await stateful.guard(store.read_log(key, after))
            while True:
                events = decode_events(entries, last)
                if events:
                    await timed(
                        {
                            "type": "http.response.body",
                            "body": sse.encode_all(events),
                            "more_body": True,
                        }
                    )
                    last = events[-1]["sequence_number"]
                    if events[-1]["type"] in TERMINAL_EVENTS:
                        break
                else:
                    # Quiet: is it still running somewhere? (ends it if its runner is gone)
                    loaded = await stateful.load(scope_key, key)
                    if loaded is None:
                        break  # deleted meanwhile
                    entries = await stateful.guard(store.read_log(key, last))
                    if not entries and loaded.response["status"] not in RUNNING:
                        break
                    if not entries:
                        await timed(
                            {"type": "http.response.body", "body": sse.KEEPALIVE, "more_body": True}
                        )
                    else:
                        continue
                entries = await stateful.guard(
                    store.wait_log(key, last, settings.keepalive_interval)
                )
        except StoreUnavailableError as error:
            event = {"type": "error", "code": error.code, "message": error.message, "param": None}
            await timed(
                {"type": "http.response.body", "body": sse.encode(event), "more_body": True}
            )
        await timed({"type": "http.response.body", "body": b"", "more_body": False})

    try:
        await asgi.run_until_disconnect(inbound, work())
    except OSError:  # the client's socket died, or it stopped reading: it can resume later
        return


class _Follow(Response):
    """A `GET ?stream=true` answer: `follow` on the raw ASGI connection."""

    def __init__(self, deps: RepairDeps, scope_key: str, key: str, after: int) -> None:
        super().__init__()
        self._args = (deps, scope_key, key, after)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        inbound = asgi.Inbound(receive)
        await inbound.body(0)  # a GET: reading its (empty) body frees the receive channel
        deps, scope_key, key, after = self._args
        headers = [(b"x-request-id", self.headers.get("x-request-id", "").encode())]
        await follow(deps, scope_key, key, after, inbound, send, headers)


def routes(deps: RepairDeps, forward: Forward) -> list[Route]:
    """The routes of the module docstring, over `deps.stateful` (the store must be on, except
    for `input_tokens`)."""
    settings = deps.settings
    pass_unknown = settings.repair_models != ("*",)

    def scope_key(request: Request) -> str:
        return scope_of(request.scope["headers"], settings.store_scope_header)

    async def loaded_or_answer(request: Request) -> Loaded | Response:
        """The response of the path, or the answer to give instead."""
        stateful = deps.stateful
        assert stateful is not None
        key = request.path_params["response_id"]
        try:
            check_response_id(key, "response_id")
            loaded = await stateful.load(scope_key(request), key)
        except ProxyError as error:
            return error_answer(error)
        if loaded is None:
            return _Forwarded(forward) if pass_unknown else error_answer(_not_found(key))
        return loaded

    def on_stored(
        handler: Callable[[Request, Loaded], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        """An endpoint for the response of the path: found (else 404, 503 or forwarded), and
        every `ProxyError` of the handler answered as OpenAI's JSON error."""

        async def endpoint(request: Request) -> Response:
            found = await loaded_or_answer(request)
            if not isinstance(found, Loaded):
                return found
            try:
                return await handler(request, found)
            except ProxyError as error:
                return error_answer(error)

        return logged(deps, endpoint)

    async def retrieve(request: Request, found: Loaded) -> Response:
        query = request.query_params
        stream = _flag(query.get("stream"), "stream")
        after = query_integer(query.get("starting_after"), "starting_after", low=-1)
        if not stream:
            return JSONResponse(found.response)
        return _Follow(deps, scope_key(request), found.key, -1 if after is None else after)

    async def delete(request: Request, found: Loaded) -> Response:
        stateful = deps.stateful
        assert stateful is not None
        if deps.background is not None:
            deps.background.cancel(found.key)
        # A run elsewhere hears the cancel first; its last writes then go nowhere.
        ops: list[Op] = [Signal(found.key, CANCEL), Delete(found.key)]
        await stateful.guard(stateful.store.apply(ops))
        return JSONResponse({"id": found.key, "object": "response", "deleted": True})

    async def input_items(request: Request, found: Loaded) -> Response:
        query = request.query_params
        limit = query_integer(query.get("limit"), "limit", low=1, high=100) or 20
        order = query.get("order") or "desc"
        if order not in ("asc", "desc"):
            raise ClientError(f"'order' is {order[:20]!r}: expected 'asc' or 'desc'", param="order")
        items = await _context_items(deps, scope_key(request), found.record)
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

    async def cancel(request: Request, found: Loaded) -> Response:
        stateful = deps.stateful
        assert stateful is not None
        if not found.record.background:
            raise ClientError(
                "Cannot cancel a synchronous response: only responses created with "
                "'background': true can be cancelled.",
                param="response_id",
            )
        if found.response["status"] not in RUNNING:
            return JSONResponse(found.response)  # cancelling again, or too late: as it ended
        if deps.background is None or not deps.background.cancel(found.key):
            await stateful.guard(stateful.store.apply([Signal(found.key, CANCEL)]))
        ended = await _wait_end(deps, scope_key(request), found.key)
        return JSONResponse(ended.response if ended is not None else found.response)

    async def input_tokens(request: Request) -> Response:
        try:
            body = parse_body(await request.body())
            count = await _count(deps, scope_key(request), body)
        except ProxyError as error:
            return error_answer(error)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": count})

    counting = Route("/v1/responses/input_tokens", logged(deps, input_tokens), methods=["POST"])
    if deps.stateful is None:  # store off: stored ids are upstream's business
        return [counting]
    return [
        counting,
        Route("/v1/responses/{response_id}", on_stored(retrieve), methods=["GET"]),
        Route("/v1/responses/{response_id}", on_stored(delete), methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", on_stored(input_items), methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", on_stored(cancel), methods=["POST"]),
    ]


def logged(
    deps: RepairDeps, endpoint: Callable[[Request], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    """One log line per call, as every route has, and the `X-Request-Id` header (the
    conversation routes use it too)."""

    async def with_log(request: Request) -> Response:
        started = deps.monotonic()
        request_id = asgi.request_id(request.scope)
        response = await endpoint(request)
        if not isinstance(response, _Forwarded):  # the pass-through logs its own
            response.headers["x-request-id"] = request_id
            deps.log(
                "request",
                request_id=request_id,
                route=request.scope["route"].path,
                method=request.method,
                status=response.status_code,
                duration_ms=round((deps.monotonic() - started) * 1000, 2),
            )
        return response

    return with_log


def error_answer(error: ProxyError) -> Response:
    """A `ProxyError` as OpenAI's JSON error."""
    return JSONResponse(error.to_body(), status_code=error.status)


class _Forwarded(Response):
    """An id the store does not know, while some models pass through: upstream answers."""

    def __init__(self, forward: Forward) -> None:
        super().__init__()
        self._forward = forward

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._forward(scope, receive, send)


async def _context_items(deps: RepairDeps, scope_key: str, record: StoredResponse) -> list[Any]:
    """The items a response was generated from: its chain's inputs and outputs, then its own
    input (what a client continuing it would have sent in full)."""
    stateful = deps.stateful
    assert stateful is not None
    items: list[Any] = []
    for entry in await stateful.guard(stateful.store.get_many(scope_key, list(record.chain))):
        if entry is not None:  # an ancestor deleted since: its items are gone with it
            earlier = StoredResponse.decode(entry.doc)
            items += earlier.input
            items += earlier.response.get("output") or []
    return items + record.input


async def _wait_end(deps: RepairDeps, scope_key: str, key: str) -> Loaded | None:
    """The response once its run recorded its end (bounded by `CANCEL_WAIT`): woken by each
    append to its log, wherever the run is."""
    stateful = deps.stateful
    assert stateful is not None
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


async def _count(deps: RepairDeps, scope_key: str, body: dict[str, Any]) -> int:
    """`input_tokens`: the body as a create request, rendered as one (module docstring)."""
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

    from proxy.server.repair import render_body

    render = functools.partial(render_body, deps)
    if deps.stateful is None:
        prepared = await render(create)
    else:
        prepared, _ = await deps.stateful.prepare(create, scope_key, render)
    return len(prepared.prompt_token_ids)


def _flag(value: str | None, name: str) -> bool:
    if value is None or value in ("false", "False", "0"):
        return False
    if value in ("true", "True", "1"):
        return True
    raise ClientError(f"'{name}' is {value[:20]!r}: expected true or false", param=name)


def query_integer(value: str | None, name: str, *, low: int, high: int = 2**62) -> int | None:
    """A query parameter as an integer from `low` to `high` (None: absent), else a 400."""
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise ClientError(
            f"'{name}' is {value[:20]!r}: expected an integer from {low} to {high}", param=name
        )
    return number
