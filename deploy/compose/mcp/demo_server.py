"""A demo MCP server beside the proxy (compose profile `mcp`): two tools over streamable HTTP at
http://mcp-demo:8000/mcp, built with the official MCP Python SDK the proxy image carries."""

from __future__ import annotations

import datetime

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer(name="demo")


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    return f"echo: {text}"


@server.tool(description="The current UTC time, ISO 8601.")
def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


if __name__ == "__main__":
    uvicorn.run(server.streamable_http_app(host="0.0.0.0"), host="0.0.0.0", port=8000)
