"""The Conversations API (OpenAI's reference is the contract, the `openai` SDK's
`client.conversations` calls are the test), on the response store:

    POST   /v1/conversations                        create (`items` up to 20, `metadata`)
    GET    /v1/conversations/{id}                   the conversation object
    POST   /v1/conversations/{id}                   update its `metadata`
    DELETE /v1/conversations/{id}                   {"id", "object": "conversation.deleted", …}
    GET    /v1/conversations/{id}/items             list (`after`, `limit`, `order`, `include[]`)
    POST   /v1/conversations/{id}/items             append up to 20 items (the list of them)
    GET    /v1/conversations/{id}/items/{item_id}   one item
    DELETE /v1/conversations/{id}/items/{item_id}   remove it (answers the conversation)

A conversation is a store entry scoped by credential like a response (stateful/scope.py: another
credential's conversation is a 404), kept `store_ttl` from its creation and evicted oldest first
under `store_max_bytes`. Items are checked as a response's input is (gpt-oss renders them later;
a 400 now, not on every later turn), `item_reference`s resolved from stored responses, each
given an id when it has none. An append is one `Push`: it costs the same at any length of the
conversation, and concurrent appends — from any process or replica — land whole, one after the
other. Bodies are read within the app's body budget (http/budget.py). A malformed id is a 400,
an unknown one a 404, a store that does not answer a 503, all before anything is written. With
the store off every call is a 400 saying so (upstream has no conversations to pass them to).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import ClientError
from proxy.harmony.history import chain as history
from proxy.harmony.history import conversation as conv
from proxy.harmony.request.prepare import parse_body
from proxy.server import asgi
from proxy.server.http.budget import read_body
from proxy.server.routes.answers import answered, query_integer, query_order, services_of
from proxy.server.stateful.scope import scope_of
from proxy.server.stateful.state import Stateful
from proxy.store import Create, Delete, Push, Remove, Update


@answered
async def create(request: Request) -> Response:
    stateful = _store(request)
    scope = _scope_key(request)
    raw, metadata = conv.read_create(await _body(request))
    items = await _new_items(request, stateful, scope, raw)
    now = stateful.clock()
    record = conv.ConversationRecord(stateful.ids("conv"), int(now), metadata)
    created = Create(record.id, scope, record.encode(), now, now + stateful.settings.store_ttl)
    await stateful.guard(stateful.store.apply([created, Push(record.id, conv.encode_items(items))]))
    return JSONResponse(record.resource())


@answered
async def retrieve(request: Request) -> Response:
    _, _, record = await _conversation(request)
    return JSONResponse(record.resource())


@answered
async def update(request: Request) -> Response:
    stateful, key, record = await _conversation(request)
    metadata = conv.read_update(await _body(request))
    record = conv.ConversationRecord(key, record.created_at, metadata)
    await stateful.guard(stateful.store.apply([Update(key, record.encode())]))
    return JSONResponse(record.resource())


@answered
async def delete(request: Request) -> Response:
    stateful, key, _ = await _conversation(request)
    await stateful.guard(stateful.store.apply([Delete(key)]))
    return JSONResponse(conv.deleted(key))


@answered
async def list_items(request: Request) -> Response:
    stateful, key, _ = await _conversation(request)
    query = request.query_params
    limit = query_integer(query.get("limit"), "limit", low=1, high=conv.LIMIT_MAX)
    limit = limit or conv.LIMIT_DEFAULT
    order = query_order(query)
    items = [item for _, item in await stateful.conversation_items(_scope_key(request), key)]
    listed = conv.page(items, after=query.get("after"), limit=limit, order=order)
    listed["data"] = _shown(request, listed["data"])
    return JSONResponse(listed)


@answered
async def append(request: Request) -> Response:
    stateful, key, _ = await _conversation(request)
    raw = conv.read_append(await _body(request))
    items = await _new_items(request, stateful, _scope_key(request), raw)
    await stateful.guard(stateful.store.apply([Push(key, conv.encode_items(items))]))
    return JSONResponse(conv.item_list(_shown(request, items)))


@answered
async def retrieve_item(request: Request) -> Response:
    _, _, _, item = await _item(request)
    return JSONResponse(_shown(request, [item])[0])


@answered
async def delete_item(request: Request) -> Response:
    stateful, record, mark, _ = await _item(request)
    await stateful.guard(stateful.store.apply([Remove(record.id, mark)]))
    return JSONResponse(record.resource())


def _store(request: Request) -> Stateful:
    stateful = services_of(request).stateful
    if stateful is None:
        raise ClientError(
            "Conversations are kept in the response store, which is off on this proxy "
            "(store_url = off).",
            code="unsupported_parameter",
        )
    return stateful


def _scope_key(request: Request) -> str:
    settings = services_of(request).settings
    return scope_of(request.scope["headers"], settings.store_scope_header)


async def _body(request: Request) -> Any:
    """The JSON body, read within the body budget (None: no body)."""
    services = services_of(request)
    async with services.budget.reservation() as hold:
        raw = await read_body(
            request.scope, asgi.Inbound(request.receive), hold, services.settings.max_body_bytes
        )
        if not raw.strip():
            return None
        asgi.require_json(request.scope)
        return parse_body(raw)


async def _conversation(request: Request) -> tuple[Stateful, str, conv.ConversationRecord]:
    """The conversation of the path as the caller sees it (400, 404, 503 otherwise)."""
    stateful = _store(request)
    key = conv.check_conversation_id(request.path_params["conversation_id"], "conversation_id")
    entry = await stateful.guard(stateful.store.get(_scope_key(request), key))
    if entry is None:
        raise conv.not_found(key)
    return stateful, key, conv.ConversationRecord.decode(entry.doc)


async def _item(request: Request) -> tuple[Stateful, conv.ConversationRecord, int, dict[str, Any]]:
    """The item of the path (the first with that id) and its mark."""
    stateful, key, record = await _conversation(request)
    item_id = request.path_params["item_id"]
    for mark, item in await stateful.conversation_items(_scope_key(request), key):
        if item.get("id") == item_id:
            return stateful, record, mark, item
    raise conv.item_not_found(item_id)


async def _new_items(
    request: Request, stateful: Stateful, scope: str, raw: list[Any]
) -> list[dict[str, Any]]:
    """Items to add, as the conversation keeps them (module docstring)."""
    keys = services_of(request).deps.reasoning_keys
    found = await stateful.references(scope, raw, "items")
    items = [found.get(index, item) for index, item in enumerate(raw)]
    conv.check_new_items(items, keys)
    return history.stored_input(items, stateful.ids)


def _shown(request: Request, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as a read with the request's `include[]` shows them."""
    keys = services_of(request).deps.reasoning_keys
    query = request.query_params
    include = conv.read_includes([*query.getlist("include[]"), *query.getlist("include")])
    return [conv.included(item, include, keys.seal) for item in items]
