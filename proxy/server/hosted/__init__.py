"""Hosted MCP tools in the shell: the servers listed and called, and the loop of generation
passes around the calls (docs/mcp.md)."""
