"""The routes' hook for hosted MCP tools, shared by `POST /v1/responses` and WebSocket turns:
plan before rendering, answer with the loop.

`Hosting.render` is the render callable a route hands `admit` (routes/repair.py): a body
without `mcp` tools or `mcp_*` items renders as before; one with them is planned first
(plan.py) and its planned body rendered. When a plan was made (`plan` not None), the route
answers with `answer` (a stream to its sink: SSE, or WebSocket messages) or `answer_json`
(`stream: false`) in place of the exchange's own answer.

The planning lists servers and may run approved calls: given the route's `inbound` (an HTTP
request's, or a WebSocket session's `asgi.Closed`), it is cancelled when the client goes away
first (`asgi.ClientDisconnected`), its MCP sessions closed.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Send

from proxy.harmony.request.prepare import PreparedRequest
from proxy.server import asgi
from proxy.server.exchange import Exchange
from proxy.server.hosted.answer import answer as run_loop
from proxy.server.hosted.loop import Loop
from proxy.server.hosted.plan import Plan, involves_mcp, plan
from proxy.server.hosted.tools import Hosted
from proxy.server.rendering.renderer import Renderer
from proxy.server.sink import NO_SINK, EventSink


class Hosting:
    """One request's hosted-tool state: its plan, once rendered (None: no MCP involved)."""

    def __init__(
        self,
        hosted: Hosted | None,
        renderer: Renderer,
        inbound: asgi.Disconnects | None = None,
    ) -> None:
        self.hosted = hosted
        self.renderer = renderer
        self.inbound = inbound
        self.plan: Plan | None = None

    async def render(self, body: dict[str, Any]) -> PreparedRequest:
        renderer, hosted = self.renderer, self.hosted
        if hosted is None or not involves_mcp(body):
            return await renderer.prepare(body)
        self.plan = await self._planned(hosted, body)
        prepared = await renderer.prepare(self.plan.body)
        return self.plan.reading_calls(prepared) if self.plan.withdrawn else prepared

    async def _planned(self, hosted: Hosted, body: dict[str, Any]) -> Plan:
        """`plan`, cancelled when the client goes away first."""
        if self.inbound is None:
            return await plan(hosted, body)
        made: list[Plan] = []

        async def planning() -> None:
            made.append(await plan(hosted, body))

        if await asgi.run_until_disconnect(self.inbound, planning()):
            raise asgi.ClientDisconnected("the client went away while its MCP tools were planned")
        return made[0]

    async def answer(self, exchange: Exchange, sink: EventSink, *, generate: bool = True) -> None:
        """The response's events to `sink`; `generate=False`: settled without an upstream pass
        (a WebSocket warm-up: the listings and approved calls only)."""
        await run_loop(self._loop(exchange), exchange, sink, generate=generate)
        exchange.delivered = True

    async def answer_json(self, exchange: Exchange, send: Send) -> None:
        """`stream: false`: the final response as JSON."""
        await run_loop(self._loop(exchange), exchange, NO_SINK)
        assert exchange.snapshot is not None
        headers = [(b"x-request-id", exchange.request_id.encode())]
        await asgi.send_json(send, 200, exchange.snapshot, headers)
        exchange.delivered = True

    def _loop(self, exchange: Exchange) -> Loop:
        assert self.plan is not None
        assert self.hosted is not None
        deps = exchange.deps

        def make(prepared: PreparedRequest) -> Exchange:
            return Exchange(
                deps,
                prepared,
                exchange.request_id,
                exchange.started,
                exchange.headers,
                guided=exchange.guided,
                takes_response_format=exchange.takes_response_format,
            )

        return Loop(
            self.hosted,
            self.plan,
            exchange,
            deps.renderer.prepare,
            make,
            deps.settings.keepalive_interval,
        )
