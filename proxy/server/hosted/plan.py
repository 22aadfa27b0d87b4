"""Before rendering: a body's `mcp` tools checked, listed and turned into namespaces, the `mcp_*`
items of its input read, answered approvals run.

What comes out (`Plan`) is a body the request renderer knows (no `mcp` tool, no `mcp_*` item),
the declared servers and their tools, the output items that open the response (the listings
made now, the calls approved now), and the order of the tools' echo.

The call budget is the request's `max_tool_calls` or the operator's `mcp_max_calls`, the
smaller; an approved call counts, and so does its time: `mcp_loop_timeout` runs from the start of
the plan, so an approved call past it (or past the budget) is shown unrun. Spent before the first
pass (`max_tool_calls: 0`), the servers are still listed but their namespaces are withdrawn from
the prompt (`withdrawn`), as the loop withdraws them once spent later (`Plan.withdraw`).

Planning is bounded: at most `mcp_max_servers` `mcp` tools (more is a 400), listed concurrently
(hosted/tools.py, `Hosted.listings`), and the approved calls within the budget. The route cancels
it when its client goes away (hosting.py), closing the MCP sessions it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from proxy.errors import ClientError
from proxy.harmony.mcp import declare, items
from proxy.harmony.mcp.carry import MCP_TYPES, carry, pending_answers
from proxy.harmony.mcp.declare import Server
from proxy.harmony.request.prepare import PreparedRequest
from proxy.mcp import Refused
from proxy.server.hosted.tools import Hosted


@dataclass
class Plan:
    """`body`: what the renderer gets; `servers` and `listed` by label; `opening`: output items
    before the first pass; `echoes`: per declared tool, its echo (an `mcp` tool) or None (the
    renderer's echo, in order)."""

    body: dict[str, Any]
    servers: dict[str, Server] = field(default_factory=dict)
    listed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    opening: list[dict[str, Any]] = field(default_factory=list)
    echoes: list[dict[str, Any] | None] = field(default_factory=list)
    #: An `mcp` tool_choice as given (the renderer got it as a function choice in the server's
    #: namespace); it binds the first pass only.
    tool_choice: dict[str, Any] | None = None
    #: MCP calls the response may run (module doc), and those run before the first pass.
    max_calls: int = 0
    calls: int = 0
    #: The budget was spent before the first pass: `body` holds none of the servers' tools.
    withdrawn: bool = False
    #: When planning began (the hosted clock): `mcp_loop_timeout` counts from it.
    started: float = 0.0

    def spent(self, hosted: Hosted, calls: int) -> str | None:
        """Why no call may run once `calls` have (None: one may): the budget, or the time."""
        if calls >= self.max_calls:
            return not_run(self.max_calls)
        if hosted.monotonic() - self.started > hosted.loop_timeout:
            return (
                f"not run: this response's tool loop passed its time limit of "
                f"{hosted.loop_timeout:g} s (the proxy's mcp_loop_timeout)"
            )
        return None

    def withdraw(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` without the servers' namespaces, its `tool_choice` auto: the model may only
        answer (or call the client's own functions)."""
        withdrawn = {**body, "tool_choice": "auto"}
        tools = body.get("tools")
        if isinstance(tools, list):
            withdrawn["tools"] = [tool for tool in tools if not self._is_namespace(tool)]
        return withdrawn

    def reading_calls(self, prepared: PreparedRequest) -> PreparedRequest:
        """`prepared` (rendered withdrawn) reading a call the model still addresses to a
        server as a call, which the loop shows unrun, not as reasoning."""
        namespaces = prepared.namespaces | self.servers.keys()
        return replace(prepared, namespaces=frozenset(namespaces))

    def _is_namespace(self, tool: Any) -> bool:
        return (
            isinstance(tool, dict)
            and tool.get("type") == "namespace"
            and tool.get("name") in self.servers
        )

    def tools_echo(self, rendered: list[Any]) -> list[Any]:
        """The response's `tools`: the declared order, `mcp` tools without credentials."""
        others = iter(rendered)
        return [echo if echo is not None else next(others) for echo in self.echoes]


def involves_mcp(body: dict[str, Any]) -> bool:
    tools, given = body.get("tools"), body.get("input")
    return (
        isinstance(tools, list)
        and any(isinstance(tool, dict) and tool.get("type") == "mcp" for tool in tools)
    ) or (
        isinstance(given, list)
        and any(isinstance(item, dict) and item.get("type") in MCP_TYPES for item in given)
    )


async def plan(hosted: Hosted, body: dict[str, Any]) -> Plan:
    """The plan of a body that `involves_mcp` (module doc); 400 for a bad or refused server."""
    declared = body.get("tools")
    tools: list[Any] = declared if isinstance(declared, list) else []
    result = Plan(body=body, started=hosted.monotonic())
    _within_cap(tools, hosted.max_servers)
    for index, tool in enumerate(tools):
        if not (isinstance(tool, dict) and tool.get("type") == "mcp"):
            result.echoes.append(None)
            continue
        path = f"tools[{index}]"
        server = declare.read_server(tool, path)
        if server.label in result.servers:
            raise ClientError(
                f"'{path}.server_label' repeats the label {server.label!r}",
                param=f"{path}.server_label",
                code="invalid_value",
            )
        if body.get("background") is True:
            raise ClientError(
                "'mcp' tools are not supported with background: true behind this proxy",
                param="background",
                code="unsupported_value",
            )
        try:
            await hosted.policy.check(server.url)
        except Refused as refused:
            raise ClientError(
                refused.message, param=f"{path}.server_url", code=refused.code
            ) from None
        result.servers[server.label] = server
        result.echoes.append(declare.echo(tool))
    carried = carry(body.get("input"))
    unlisted = [s for label, s in result.servers.items() if label not in carried.listed]
    found = await hosted.listings(unlisted)
    for label in result.servers:
        reused = carried.listed.get(label)
        if reused is not None:
            result.listed[label] = reused
            continue
        listed, error = found[label]
        result.listed[label] = listed
        result.opening.append(items.list_tools_item(hosted.ids("mcpl"), label, listed, error))
    given: Any = carried.items
    result.max_calls = budget(body, hosted.max_calls)
    for request, _ in pending_answers(carried):
        answered = result.servers.get(request["server_label"])
        if answered is None:
            raise ClientError(
                f"an mcp_approval_response answers a call to the server "
                f"{request['server_label']!r}, which this request's tools do not declare",
                param="tools",
                code="invalid_value",
            )
        spent = result.spent(hosted, result.calls)
        if spent is not None:
            call = items.unrun_call_item(
                hosted.ids("mcp"),
                answered.label,
                request["name"],
                request["arguments"],
                spent,
                approval_request_id=request["id"],
            )
            hosted.count_unrun(answered)
            result.opening.append(call)
        else:
            call = await hosted.call(
                answered, request["name"], request["arguments"], approval_request_id=request["id"]
            )
            result.calls += 1
            result.opening.append(call)
        given = [*given, *items.as_input(call)]
    rendered = [
        tool for tool in tools if not (isinstance(tool, dict) and tool.get("type") == "mcp")
    ]
    # The time alone never withdraws the first pass: the model sees the tools it was given.
    result.withdrawn = result.calls >= result.max_calls
    for label, server in result.servers.items():
        namespace = declare.as_namespace(server, result.listed[label])
        if namespace["tools"] and not result.withdrawn:
            rendered.append(namespace)
    result.body = {**body, "input": given}
    if "tools" in body:
        result.body["tools"] = rendered
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "mcp":
        result.tool_choice = choice
        function_choice = _as_function_choice(choice, result.servers)
        # No call may run: the model answers (`max_tool_calls` wins over the choice).
        result.body["tool_choice"] = "auto" if result.withdrawn else function_choice
    return result


def _within_cap(tools: list[Any], cap: int) -> None:
    """A 400 for more than `cap` `mcp` tools, before any is checked or listed."""
    count = sum(1 for tool in tools if isinstance(tool, dict) and tool.get("type") == "mcp")
    if count > cap:
        raise ClientError(
            f"'tools' declares {count} 'mcp' tools; this proxy takes at most {cap} per request "
            "(its mcp_max_servers)",
            param="tools",
            code="array_above_max_length",
        )


def budget(body: dict[str, Any], max_calls: int) -> int:
    """The MCP calls a response may run: `max_tool_calls` (when a valid count; the renderer
    refuses any other value) or the operator's `mcp_max_calls`, the smaller."""
    value = body.get("max_tool_calls")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return min(value, max_calls)
    return max_calls


def not_run(max_calls: int) -> str:
    """The error of a call the budget leaves unrun."""
    return (
        f"not run: this response's budget of {max_calls} MCP tool call(s) is spent "
        "(max_tool_calls, or the proxy's mcp_max_calls when smaller)"
    )


def _as_function_choice(choice: dict[str, Any], servers: dict[str, Server]) -> dict[str, Any]:
    """`{"type": "mcp", "server_label", "name"}` as the function choice the renderer knows."""
    label, name = choice.get("server_label"), choice.get("name")
    if label not in servers:
        raise ClientError(
            f"'tool_choice.server_label' names {label!r}, which no 'mcp' tool declares",
            param="tool_choice.server_label",
            code="invalid_value",
        )
    if not isinstance(name, str):
        raise ClientError(
            "an 'mcp' tool_choice needs the 'name' of the tool to call behind this proxy",
            param="tool_choice.name",
            code="missing_required_parameter",
        )
    return {"type": "function", "name": name, "namespace": label}
