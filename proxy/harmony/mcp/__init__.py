"""Hosted MCP tools as data: the declared servers, their tools as a Harmony namespace, the
`mcp_*` output items and events, and a call's result as the next pass's input. No I/O: the
shell lists and calls the servers (`proxy/mcp/`)."""
