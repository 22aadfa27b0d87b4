"""An `mcp` entry of `tools`: validated, echoed without its secrets, filtered, rendered.

The model sees a server's tools as a Harmony namespace named after `server_label`, so it calls
`label.tool`; the shell hands the renderer that namespace (`as_namespace`) in place of the `mcp`
entry. `headers` and `authorization` are credentials for that server only: `Server.headers`
keeps them for the call, and the echo (`echo`) holds neither.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.harmony.request.check import (
    at,
    check_keys,
    fail,
    missing,
    present,
    want_bool,
    want_list,
    want_object,
    want_str,
    want_str_map,
)

#: The keys of an `mcp` tool (OpenAI's `MCPTool`).
_KEYS = frozenset(
    {
        "type",
        "server_label",
        "server_url",
        "connector_id",
        "tunnel_id",
        "authorization",
        "server_description",
        "headers",
        "allowed_tools",
        "allowed_callers",
        "require_approval",
        "defer_loading",
    }
)
#: Never echoed nor stored: credentials for the server.
SECRET_KEYS = frozenset({"headers", "authorization"})
_FILTER_KEYS = frozenset({"tool_names", "read_only"})
#: A label is a Harmony namespace name: the proxy splits `label.tool` at the first dot.
_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class ToolFilter:
    """`tool_names` (None: any name) and `read_only` (None: any tool)."""

    names: frozenset[str] | None = None
    read_only: bool | None = None

    def matches(self, tool: Mapping[str, Any]) -> bool:
        if self.names is not None and tool.get("name") not in self.names:
            return False
        if self.read_only is not None:
            annotations = tool.get("annotations") or {}
            hint = bool(annotations.get("readOnlyHint", annotations.get("read_only_hint", False)))
            return hint == self.read_only
        return True


@dataclass(frozen=True, slots=True)
class Server:
    """One declared MCP server. `approval`: "always", "never", or the filters of a filter
    object (`always` / `never`; a tool matching neither needs approval, the spec's default)."""

    label: str
    url: str
    description: str | None
    headers: Mapping[str, str]
    allowed: ToolFilter | None
    approval: str | tuple[ToolFilter | None, ToolFilter | None]

    def allows(self, tool: Mapping[str, Any]) -> bool:
        return self.allowed is None or self.allowed.matches(tool)

    def needs_approval(self, tool: Mapping[str, Any]) -> bool:
        if isinstance(self.approval, str):
            return self.approval == "always"
        always, never = self.approval
        if always is not None and always.matches(tool):
            return True
        return not (never is not None and never.matches(tool))


def read_server(tool: dict[str, Any], path: str) -> Server:
    """Validate one `mcp` tool (400 naming the field), as a `Server`."""
    check_keys(tool, _KEYS, path, "an 'mcp' tool")
    label = present(tool, "server_label")
    if label is None:
        missing(at(path, "server_label"))
    label = want_str(label, at(path, "server_label"))
    if not _LABEL.match(label):
        fail(
            at(path, "server_label"),
            label,
            "a server label is 1 to 64 letters, digits, '_' or '-'",
        )
    url = present(tool, "server_url")
    for other in ("connector_id", "tunnel_id"):
        if present(tool, other) is not None:
            fail(
                at(path, other),
                tool[other],
                "this proxy reaches MCP servers by 'server_url' only",
                code="unsupported_value",
            )
    if url is None:
        missing(at(path, "server_url"))
    url = want_str(url, at(path, "server_url"))
    description = present(tool, "server_description")
    if description is not None:
        want_str(description, at(path, "server_description"))
    headers = dict(want_str_map(present(tool, "headers") or {}, at(path, "headers")))
    token = present(tool, "authorization")
    if token is not None:
        token = want_str(token, at(path, "authorization"))
        if not any(name.lower() == "authorization" for name in headers):
            headers["Authorization"] = f"Bearer {token}"
    for key in ("defer_loading",):
        if present(tool, key) is not None:
            want_bool(tool[key], at(path, key))
    return Server(
        label=label,
        url=url,
        description=description,
        headers=headers,
        allowed=_filter(present(tool, "allowed_tools"), at(path, "allowed_tools")),
        approval=_approval(present(tool, "require_approval"), at(path, "require_approval")),
    )


def echo(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The tool as the response's `tools` holds it: everything but the credentials."""
    return {key: value for key, value in tool.items() if key not in SECRET_KEYS}


def as_namespace(server: Server, listed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The server's allowed tools as a `namespace` tool the request renderer reads."""
    members = [
        {
            "type": "function",
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
        }
        for tool in listed
        if server.allows(tool)
    ]
    namespace: dict[str, Any] = {"type": "namespace", "name": server.label, "tools": members}
    namespace["description"] = server.description or f"Tools of the MCP server {server.label}."
    return namespace


def find_tool(listed: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((tool for tool in listed if tool.get("name") == name), None)


def _filter(value: Any, path: str) -> ToolFilter | None:
    if value is None:
        return None
    if isinstance(value, list):
        listed = [want_str(name, at(path, index)) for index, name in enumerate(value)]
        return ToolFilter(names=frozenset(listed))
    obj = want_object(value, path)
    check_keys(obj, _FILTER_KEYS, path, "an MCP tool filter")
    names_value = present(obj, "tool_names")
    names: frozenset[str] | None = None
    if names_value is not None:
        items = want_list(names_value, at(path, "tool_names"))
        names = frozenset(
            want_str(name, at(at(path, "tool_names"), index)) for index, name in enumerate(items)
        )
    read_only = present(obj, "read_only")
    if read_only is not None:
        read_only = want_bool(read_only, at(path, "read_only"))
    return ToolFilter(names=names, read_only=read_only)


def _approval(value: Any, path: str) -> str | tuple[ToolFilter | None, ToolFilter | None]:
    if value is None:
        return "always"
    if isinstance(value, str):
        if value not in ("always", "never"):
            fail(path, value, "expected 'always', 'never' or a filter object")
        return value
    obj = want_object(value, path)
    check_keys(obj, ("always", "never"), path, "an MCP approval filter")
    always, never = (
        _filter(want_object(obj[key], at(path, key)), at(path, key))
        if present(obj, key) is not None
        else None
        for key in ("always", "never")
    )
    return (always, never)
