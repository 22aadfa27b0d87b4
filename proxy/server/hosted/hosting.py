"""The route's hook for hosted MCP tools: plan before rendering, answer with the loop.

`Hosting.render` is the render callable the route hands the stateful context (or calls itself):
a body without `mcp` tools or `mcp_*` items renders as before; one with them is planned first
(plan.py) and its planned body rendered. `answer` then runs the loop (loop.py) in place of the
exchange's own answer.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from starlette.types import Send

from proxy.harmony.request.prepare import PreparedRequest
from proxy.server.exchange import Exchange
from proxy.server.hosted.answer import answer
from proxy.server.hosted.loop import Loop
from proxy.server.hosted.plan import Plan, involves_mcp, plan
from proxy.server.hosted.tools import Hosted
from proxy.server.rendering.renderer import Renderer


class Hosting:
    """One request's hosted-tool state: its plan, once rendered (None: no MCP involved)."""

    def __init__(self, hosted: Hosted | None, renderer: Renderer) -> None:
        self.hosted = hosted
        self.renderer = renderer
        self.plan: Plan | None = None

    async def render(self, body: dict[str, Any]) -> PreparedRequest:
        renderer, hosted = self.renderer, self.hosted
        if hosted is None or not involves_mcp(body):
            return await renderer.prepare(body)
        self.plan = await plan(hosted, body)
        return await renderer.prepare(self.plan.body)

    def answer(self, exchange: Exchange, send: Send, *, stream: bool) -> Coroutine[Any, Any, None]:
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

        loop = Loop(
            self.hosted,
            self.plan,
            exchange,
            deps.renderer.prepare,
            make,
            deps.settings.keepalive_interval,
        )
        return answer(loop, exchange, send, stream=stream)
