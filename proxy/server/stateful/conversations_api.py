"""The Conversations API (issue 16; OpenAI's reference is the contract, the `openai` SDK's
`client.conversations` calls are the test), on the response store:

    POST   /v1/conversations                        create (`items` up to 20, `metadata`)
    GET    /v1/conversations/{id}                   the conversation object
    POST   /v1/conversations/{id}                   update its `metadata`
    DELETE /v1/conversations/{id}                   {"id", "object": "conversation.deleted", …}
    GET    /v1/conversations/{id}/items             list (`after`, `limit`, `order`, `include[]`)
    POST   /v1/conversations/{id}/items             append up to 20 items (the list of them)
    GET    /v1/conversations/{id}/items/{item_id}   one item
    DELETE /v1/conversations/{id}/items/{item_id}   remove it (answers the conversation)

A conversation is a store entry scoped by credential like a response (stateful/state.py: another
credential's conversation is a 404), kept `store_ttl` from its creation and evicted oldest first
under `store_max_bytes`. Items are checked as a response's input is (gpt-oss renders them later;
a 400 now, not on every later turn), `item_reference`s resolved from stored responses, each
given an id when it has none. An append is one `Push`: it costs the same at any length of the
conversation, and concurrent appends — from any process or replica — land whole, one after the
other. Bodies are read within the app's body budget (budget.py). A malformed id is a 400, an
unknown one a 404, a store that does not answer a 503, all before anything is written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.errors import ClientError, ProxyError
from proxy.harmony.history import chain as history
from proxy.harmony.history import conversation as conv
from proxy.harmony.request.prepare import parse_body
from proxy.server import asgi
from proxy.server.http.budget import BodyBudget, read_body
from proxy.server.stateful.responses_api import error_answer, logged, query_integer
from proxy.server.stateful.scope import scope_of
from proxy.server.stateful.state import Stateful
from proxy.store import Create, Delete, Push, Remove, Update

if TYPE_CHECKING:
    from proxy.server.deps import RepairDeps

Handler = Callable[[Request], Awaitable[Response]]


def routes(deps: RepairDeps, budget: BodyBudget) -> list[Route]:
    """The routes of the module docstring. With the store off they all answer a 400 saying so
    (upstream has no conversations to pass them to)."""
    settings = deps.settings

    def store() -> Stateful:
        if deps.stateful is None:
            raise ClientError(
                "Conversations are kept in the response store, which is off on this proxy "
                "(store_url = off).",
                code="unsupported_parameter",
            )
        return deps.stateful

    def scope_key(request: Request) -> str:
        return scope_of(request.scope["headers"], settings.store_scope_header)

    def answering(handler: Handler) -> Handler:
        """Every `ProxyError` as OpenAI's JSON error; one log line per call."""

        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except ProxyError as error:
                return error_answer(error)
            except asgi.ClientDisconnected:  # gone while sending its body: nothing was done
                deps.metrics.disconnects.labels("before_upstream").inc()
                return Response(status_code=400)

        return logged(deps, endpoint)

    async def body_of(request: Request) -> Any:
        """The JSON body, read within the body budget (None: no body)."""
        async with budget.reservation() as hold:
            raw = await read_body(
                request.scope, asgi.Inbound(request.receive), hold, settings.max_body_bytes
            )
            if not raw.strip():
                return None
            asgi.require_json(request.scope)
            return parse_body(raw)

    async def conversation(request: Request) -> tuple[Stateful, str, conv.ConversationRecord]:
        """The conversation of the path as the caller sees it (400, 404, 503 otherwise)."""
        stateful = store()
        key = conv.check_conversation_id(request.path_params["conversation_id"], "conversation_id")
        entry = await stateful.guard(stateful.store.get(scope_key(request), key))
        if entry is None:
            raise conv.not_found(key)
        return stateful, key, conv.ConversationRecord.decode(entry.doc)

    async def new_items(stateful: Stateful, scope: str, raw: list[Any]) -> list[dict[str, Any]]:
        """Items to add, as the conversation keeps them (module docstring)."""
        found = await stateful.references(scope, raw, "items")
        items = [found.get(index, item) for index, item in enumerate(raw)]
        conv.check_new_items(items, deps.reasoning_keys)
        return history.stored_input(items, deps.ids)

    def shown(request: Request, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Items as a read with the request's `include[]` shows them."""
        query = request.query_params
        include = conv.read_includes([*query.getlist("include[]"), *query.getlist("include")])
        return [conv.included(item, include, deps.reasoning_keys.seal) for item in items]

    async def create(request: Request) -> Response:
        stateful = store()
        scope = scope_key(request)
        raw, metadata = conv.read_create(await body_of(request))
        items = await new_items(stateful, scope, raw)
        now = stateful.clock()
        record = conv.ConversationRecord(deps.ids("conv"), int(now), metadata)
        created = Create(record.id, scope, record.encode(), now, now + settings.store_ttl)
        await stateful.guard(
            stateful.store.apply([created, Push(record.id, conv.encode_items(items))])
        )
        return JSONResponse(record.resource())

    async def retrieve(request: Request) -> Response:
        _, _, record = await conversation(request)
        return JSONResponse(record.resource())

    async def update(request: Request) -> Response:
        stateful, key, record = await conversation(request)
        metadata = conv.read_update(await body_of(request))
        record = conv.ConversationRecord(key, record.created_at, metadata)
        await stateful.guard(stateful.store.apply([Update(key, record.encode())]))
        return JSONResponse(record.resource())

    async def delete(request: Request) -> Response:
        stateful, key, _ = await conversation(request)
        await stateful.guard(stateful.store.apply([Delete(key)]))
        return JSONResponse(conv.deleted(key))

    async def list_items(request: Request) -> Response:
        stateful, key, _ = await conversation(request)
        query = request.query_params
        limit = query_integer(query.get("limit"), "limit", low=1, high=conv.LIMIT_MAX)
        limit = limit or conv.LIMIT_DEFAULT
        order = query.get("order") or "desc"
        if order not in ("asc", "desc"):
            raise ClientError(f"'order' is {order[:20]!r}: expected 'asc' or 'desc'", param="order")
        items = [item for _, item in await stateful.conversation_items(scope_key(request), key)]
        listed = conv.page(items, after=query.get("after"), limit=limit, order=order)
        listed["data"] = shown(request, listed["data"])
        return JSONResponse(listed)

    async def append(request: Request) -> Response:
        stateful, key, _ = await conversation(request)
        raw = conv.read_append(await body_of(request))
        items = await new_items(stateful, scope_key(request), raw)
        await stateful.guard(stateful.store.apply([Push(key, conv.encode_items(items))]))
        return JSONResponse(conv.item_list(shown(request, items)))

    async def found_item(
        request: Request,
    ) -> tuple[Stateful, conv.ConversationRecord, int, dict[str, Any]]:
        """The item of the path (the first with that id) and its mark."""
        stateful, key, record = await conversation(request)
        item_id = request.path_params["item_id"]
        for mark, item in await stateful.conversation_items(scope_key(request), key):
            if item.get("id") == item_id:
                return stateful, record, mark, item
        raise conv.item_not_found(item_id)

    async def retrieve_item(request: Request) -> Response:
        _, _, _, item = await found_item(request)
        return JSONResponse(shown(request, [item])[0])

    async def delete_item(request: Request) -> Response:
        stateful, record, mark, _ = await found_item(request)
        await stateful.guard(stateful.store.apply([Remove(record.id, mark)]))
        return JSONResponse(record.resource())

    one = "/v1/conversations/{conversation_id}"
    return [
        Route("/v1/conversations", answering(create), methods=["POST"]),
        Route(one, answering(retrieve), methods=["GET"]),
        Route(one, answering(update), methods=["POST"]),
        Route(one, answering(delete), methods=["DELETE"]),
        Route(one + "/items", answering(list_items), methods=["GET"]),
        Route(one + "/items", answering(append), methods=["POST"]),
        Route(one + "/items/{item_id}", answering(retrieve_item), methods=["GET"]),
        Route(one + "/items/{item_id}", answering(delete_item), methods=["DELETE"]),
    ]
