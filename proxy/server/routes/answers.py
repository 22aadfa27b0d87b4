"""What every route answers the same way: the app's `Services` found from a request, the count of
requests in flight (`Counted`), OpenAI's JSON error, the one log line per request, and the query
parameters the list calls share.

The raw-ASGI routes (`POST /v1/responses`, the pass-through) write their own answers and log
lines (`refuse` here for an error before anything else was sent); the request/response routes
(stored responses, conversations, probes) are plain `async def handler(request)` functions,
wrapped by `answered` for the error answers and the log line.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, cast

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import ClientError, ProxyError
from proxy.server import asgi
from proxy.server.services import Services

Handler = Callable[[Request], Awaitable[Response]]


def services_in(scope: Scope) -> Services:
    """The `Services` of the app serving `scope` (`create_app` keeps them on its state)."""
    return cast(Services, scope["app"].state.services)


def services_of(request: Request) -> Services:
    return services_in(request.scope)


class Counted:
    """A raw ASGI route whose requests the drain waits for (`ServerState.active`)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = services_in(scope).state
        state.active += 1
        try:
            await self._app(scope, receive, send)
        finally:
            state.active -= 1


def error_answer(error: ProxyError) -> Response:
    """A `ProxyError` as OpenAI's JSON error."""
    return JSONResponse(error.to_body(), status_code=error.status)


class Unlogged(Response):
    """An answer whose route writes no log line here: it logs its own (the pass-through)."""


def answered(handler: Handler) -> Handler:
    """`handler`, with every `ProxyError` answered as OpenAI's JSON error, a client gone while
    sending its body counted (nothing was done), the `X-Request-Id` header, and one log line."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        services = services_of(request)
        started = services.monotonic()
        request_id = asgi.request_id(request.scope)
        try:
            response = await handler(request)
        except ProxyError as error:
            response = error_answer(error)
        except asgi.ClientDisconnected:
            services.metrics.disconnects.labels("before_upstream").inc()
            response = Response(status_code=400)
        if isinstance(response, Unlogged):
            return response
        response.headers["x-request-id"] = request_id
        services.log(
            "request",
            request_id=request_id,
            route=request.scope["route"].path,
            method=request.method,
            status=response.status_code,
            duration_ms=round((services.monotonic() - started) * 1000, 2),
        )
        return response

    return endpoint


async def refuse(
    services: Services,
    send: Send,
    error: ProxyError,
    request_id: str,
    started: float,
    *,
    outcome: str,
    stream: str = "unknown",
    model: str | None = None,
    close: bool = False,
) -> None:
    """Answer a `/v1/responses` request with `error` before anything else was sent (`close`:
    with `Connection: close`), count it with `outcome` and write its log line."""
    headers = [(b"x-request-id", request_id.encode())]
    if error.status in (429, 503):
        headers.append((b"retry-after", b"1"))
    if close:
        headers.append((b"connection", b"close"))
    await asgi.send_error(send, error, headers)
    count_refusal(services, error, request_id, started, outcome=outcome, stream=stream, model=model)


def count_refusal(
    services: Services,
    error: ProxyError,
    request_id: str,
    started: float,
    *,
    outcome: str,
    stream: str = "unknown",
    model: str | None = None,
    **extra: Any,
) -> None:
    """Count a `/v1/responses` refusal with `outcome` and write its log line (`extra`: more
    fields of it, e.g. the WebSocket transport)."""
    metrics = services.metrics
    label = "other" if model is None else metrics.model_label(model)
    metrics.requests.labels("responses", stream, outcome, label).inc()
    fields: dict[str, Any] = {} if model is None else {"model": model}
    services.log(
        "request",
        request_id=request_id,
        route="/v1/responses",
        **fields,
        status=error.status,
        outcome=outcome,
        error=error.code or error.error_type,
        duration_ms=round((services.monotonic() - started) * 1000, 2),
        **extra,
    )


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


def query_flag(value: str | None, name: str) -> bool:
    """A query parameter as a boolean (absent: false), else a 400."""
    if value is None or value in ("false", "False", "0"):
        return False
    if value in ("true", "True", "1"):
        return True
    raise ClientError(f"'{name}' is {value[:20]!r}: expected true or false", param=name)


def query_order(query: QueryParams) -> str:
    """A list call's `order`: `asc` or `desc` (the default), else a 400."""
    order = query.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise ClientError(f"'order' is {order[:20]!r}: expected 'asc' or 'desc'", param="order")
    return order
