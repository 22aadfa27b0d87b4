"""The client side of hosted MCP tools: the safety policy, the tool-list cache, the calls.

Separate from the sans-IO core: this package owns the sockets to MCP servers (the official MCP
Python SDK, streamable HTTP or SSE; never stdio). The shell passes its limits in, so the package
needs no settings of its own.
"""

from proxy.mcp.cache import ToolCache, credential_key
from proxy.mcp.client import CallOutcome, Limits, McpFailure, call_tool, list_tools
from proxy.mcp.policy import Policy, Refused

__all__ = [
    "CallOutcome",
    "Limits",
    "McpFailure",
    "Policy",
    "Refused",
    "ToolCache",
    "call_tool",
    "credential_key",
    "list_tools",
]
