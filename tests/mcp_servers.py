"""Real MCP servers for tests, built with the official SDK's `MCPServer` and served by uvicorn on
loopback: tools that echo, fail, sleep and return large output; streamable HTTP and SSE."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from tests.live import LiveServer

#: The proxy settings that let a request's `mcp` tool reach these servers on loopback.
LOOPBACK: dict[str, Any] = {
    "mcp_allowed_servers": ("127.0.0.1",),
    "mcp_allow_private_addresses": True,
}


def mcp_tool(url: str, **extra: Any) -> dict[str, Any]:
    """A request's `mcp` tool for the server at `url`: label `tools`, no approval asked."""
    return {
        "type": "mcp",
        "server_label": "tools",
        "server_url": url,
        "require_approval": "never",
        **extra,
    }


#: Characters `big` returns.
BIG = 200_000

#: The `authorization` header values the servers saw, newest last.
SEEN_AUTH: list[str | None] = []

#: Requests in flight by their `x-test-tag` header (an `mcp` tool's `headers` sets it).
IN_FLIGHT: collections.Counter[str] = collections.Counter()
#: The most distinct tags seen in flight at once (reset it to 0 before a measure).
PEAK_TAGS = [0]


def build() -> MCPServer:
    server = MCPServer(name="test-tools")

    @server.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        return f"echo: {text}"

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> str:
        return str(a + b)

    @server.tool(description="Always fails.")
    def fail() -> str:
        raise ToolError("the tool broke")

    @server.tool(description="Sleep for some seconds, then answer.")
    async def sleep(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    @server.tool(description="Take 30 seconds to answer.")
    async def slow() -> str:
        await asyncio.sleep(30)
        return "late"

    @server.tool(description="Return a large text.")
    def big() -> str:
        return "x" * BIG

    return server


class _SeeAuth:
    """ASGI middleware recording the `authorization` header of each request and the requests
    in flight per `x-test-tag`; an `x-test-delay` header (seconds) delays the request."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            value = headers.get(b"authorization")
            SEEN_AUTH.append(value.decode() if value is not None else None)
            tag, delay = headers.get(b"x-test-tag"), headers.get(b"x-test-delay")
            if tag is not None:
                IN_FLIGHT[tag.decode()] += 1
                PEAK_TAGS[0] = max(PEAK_TAGS[0], len(+IN_FLIGHT))
            try:
                if delay is not None:
                    await asyncio.sleep(float(delay))
                await self.app(scope, receive, send)
            finally:
                if tag is not None:
                    IN_FLIGHT[tag.decode()] -= 1
            return
        await self.app(scope, receive, send)


@contextlib.contextmanager
def mcp_server(transport: str = "http") -> Iterator[str]:
    """Serve the test tools; yields the endpoint URL (`/mcp`, or `/sse` for SSE)."""
    server = build()
    if transport == "sse":
        app: Any = server.sse_app()
        path = "/sse"
    else:
        app = server.streamable_http_app()
        path = "/mcp"
    with LiveServer(_SeeAuth(app)) as live:
        yield live.url + path
