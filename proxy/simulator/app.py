"""The simulated trtllm-serve as a Starlette app: routes, the per-request wrapper, the state.

    POST /v1/completions         route_completions.py
    POST /v1/chat/completions    route_chat.py
    POST /v1/responses           route_responses.py
    GET|DELETE /v1/responses/{id}  404: nothing is stored
    GET  /v1/models              {"object": "list", "data": [ModelCard]}
    GET  /health                 200, empty body
    GET  /health_generate        200 "Generation health check OK"
    GET  /version                {"version": …}
    GET  /metrics                iteration statistics as a JSON list (drained on each read)

Every request gets a `RequestRecord` (`app.state.simulator.requests`). Its `X-Sim-*` headers
(options.py) are read first: a bad one is a 400; an `http:CODE` fault answers before anything
else (on any route when sent as a header; the server's default fault only on generation routes).
Errors use upstream's shapes (validation.py). Unknown paths are 404 `{"detail": "Not Found"}`,
as FastAPI answers.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from openai_harmony import HarmonyEncoding
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proxy.harmony.response import IdFactory, random_id
from proxy.simulator.config import SimulatorConfig
from proxy.simulator.faults import http_fault
from proxy.simulator.options import OptionError, Options, read_options
from proxy.simulator.records import SimulatorState
from proxy.simulator.responses import not_found
from proxy.simulator.route_chat import serve_chat
from proxy.simulator.route_completions import serve_completions
from proxy.simulator.route_responses import serve_responses
from proxy.simulator.shell import BodyTooLarge, ClientGone, Exchange
from proxy.simulator.validation import error_body, error_type_for

Generation = Callable[[Exchange, Options, bytes], Awaitable[None]]
Simple = Callable[[Exchange], Awaitable[None]]


class _Endpoint:
    """A raw ASGI endpoint (Starlette's `Route` wraps functions as request/response handlers;
    these stream and watch disconnects themselves)."""

    def __init__(self, state: SimulatorState, handle: Callable[[Exchange], Awaitable[None]]):
        self._state = state
        self._handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(self._state, scope, receive, send)
        try:
            await self._handle(exchange)
        except ClientGone:
            return
        except BodyTooLarge:
            limit = self._state.config.max_body_bytes
            await exchange.json(413, error_body(f"request body exceeds {limit} bytes", 413))
        finally:
            if not exchange.record.closed:  # answered without `run`, or not at all
                exchange.record.close(self._state.monotonic(), cut=exchange.record.status is None)


async def _options(exchange: Exchange, *, generation: bool) -> Options | None:
    """The request's options, or None when they (or an http fault) already answered it."""
    try:
        options = read_options(exchange.headers, exchange.state.config, generation=generation)
    except OptionError as exc:
        await exchange.json(400, error_body(str(exc), 400))
        return None
    fault = http_fault(options.faults)
    if fault is not None:
        exchange.record.faults.append(fault.spec)
        message = f"simulated fault: HTTP {fault.status} (X-Sim-Fault)"
        await exchange.json(
            fault.status, error_body(message, fault.status, error_type_for(fault.status))
        )
        return None
    return options


def _generation(serve: Generation) -> Callable[[Exchange], Awaitable[None]]:
    async def handle(exchange: Exchange) -> None:
        raw = await exchange.body()
        options = await _options(exchange, generation=True)
        if options is not None:
            await serve(exchange, options, raw)

    return handle


def _simple(serve: Simple) -> Callable[[Exchange], Awaitable[None]]:
    async def handle(exchange: Exchange) -> None:
        await exchange.body()
        if await _options(exchange, generation=False) is not None:
            await serve(exchange)

    return handle


async def _models(exchange: Exchange) -> None:
    state = exchange.state
    card = {
        "id": state.config.model,
        "object": "model",
        "created": int(state.clock()),
        "owned_by": "tensorrt_llm",
    }
    await exchange.json(200, {"object": "list", "data": [card]})


async def _health(exchange: Exchange) -> None:
    await exchange.plain(200)


async def _health_generate(exchange: Exchange) -> None:
    await exchange.plain(200, "Generation health check OK")


async def _version(exchange: Exchange) -> None:
    await exchange.json(200, {"version": exchange.state.config.version})


async def _metrics(exchange: Exchange) -> None:
    await exchange.json(200, exchange.state.drain_stats())


async def _stored_response(exchange: Exchange) -> None:
    response_id = exchange.scope["path_params"]["response_id"]
    status, message, kind = not_found(response_id)
    await exchange.json(status, error_body(message, status, kind))


def create_simulator_app(
    config: SimulatorConfig,
    encoding: HarmonyEncoding,
    *,
    ids: IdFactory = random_id,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> Starlette:
    """The simulator app (module doc). Seams: the id factory of Responses ids (`resp_…`, `rs_…`),
    the wall clock (`created`, `created_at`), the monotonic clock (records)."""
    state = SimulatorState(config, encoding, ids=ids, clock=clock, monotonic=monotonic)

    def route(path: str, handle: Callable[[Exchange], Awaitable[None]], *methods: str) -> Route:
        return Route(path, _Endpoint(state, handle), methods=list(methods))

    app = Starlette(
        routes=[
            route("/v1/completions", _generation(serve_completions), "POST"),
            route("/v1/chat/completions", _generation(serve_chat), "POST"),
            route("/v1/responses", _generation(serve_responses), "POST"),
            route("/v1/responses/{response_id}", _simple(_stored_response), "GET", "DELETE"),
            route("/v1/models", _simple(_models), "GET"),
            route("/health", _simple(_health), "GET"),
            route("/health_generate", _simple(_health_generate), "GET"),
            route("/version", _simple(_version), "GET"),
            route("/metrics", _simple(_metrics), "GET"),
        ]
    )
    app.router.default = _not_found
    app.state.simulator = state
    return app


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """FastAPI's answer to an unknown path."""
    body = b'{"detail":"Not Found"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def simulator_state(app: Any) -> SimulatorState:
    """`app.state.simulator`, typed."""
    state: SimulatorState = app.state.simulator
    return state
