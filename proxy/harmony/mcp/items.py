"""The `mcp_*` output items and their stream events, and a finished call as the next pass's input.

Events are built without `sequence_number`: the one who writes them stamps it (as
`stream/events.py`'s `EventLog` does), so the events of several upstream passes stay one dense
sequence. A call's result goes back to the model as Harmony has it for any tool: the call as an
assistant message to `label.tool`, the result as a message from that tool (the
`function_call` / `function_call_output` input items with the server's namespace, which
`request/items.py` renders so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Item = dict[str, Any]
Event = dict[str, Any]

#: What an `mcp_call` error's kind is: the tool answered with an error, or the server could
#: not be reached or did not answer in time.
TOOL_ERROR = "mcp_tool_execution_error"
PROTOCOL_ERROR = "mcp_protocol_error"


def list_tools_item(
    item_id: str, label: str, tools: Sequence[Mapping[str, Any]], error: str | None = None
) -> Item:
    return {
        "type": "mcp_list_tools",
        "id": item_id,
        "server_label": label,
        "tools": [dict(tool) for tool in tools],
        "error": error,
    }


def call_item(
    item_id: str,
    label: str,
    name: str,
    arguments: str,
    *,
    status: str = "in_progress",
    output: str | None = None,
    error: Mapping[str, Any] | None = None,
    approval_request_id: str | None = None,
) -> Item:
    return {
        "type": "mcp_call",
        "id": item_id,
        "server_label": label,
        "name": name,
        "arguments": arguments,
        "output": output,
        "error": dict(error) if error is not None else None,
        "status": status,
        "approval_request_id": approval_request_id,
    }


def unrun_call_item(
    item_id: str,
    label: str,
    name: str,
    arguments: str,
    reason: str,
    *,
    approval_request_id: str | None = None,
) -> Item:
    """A call the model made that is not run (a budget spent): `incomplete`, `reason` its
    error, so the response shows it."""
    return call_item(
        item_id,
        label,
        name,
        arguments,
        status="incomplete",
        error=call_error(PROTOCOL_ERROR, reason),
        approval_request_id=approval_request_id,
    )


def declined_call(request: Mapping[str, Any]) -> Item:
    """The call an `mcp_approval_request` asked for, declined by the user (what the model is
    told; never an output item)."""
    return call_item(
        request["id"],
        request["server_label"],
        request["name"],
        request["arguments"],
        status="failed",
        error=call_error(TOOL_ERROR, "the user declined this call"),
        approval_request_id=request["id"],
    )


def call_error(kind: str, message: str) -> dict[str, Any]:
    """An `mcp_call` error object (`MCPToolExecutionError` or `MCPProtocolError`)."""
    if kind == TOOL_ERROR:
        return {"type": TOOL_ERROR, "content": [{"type": "text", "text": message}]}
    return {"type": PROTOCOL_ERROR, "code": -32603, "message": message}


def error_text(error: Mapping[str, Any]) -> str:
    """An error object's text, as the model is told it."""
    if error.get("type") == TOOL_ERROR:
        content = error.get("content") or []
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(error.get("message", ""))


def approval_request_item(item_id: str, label: str, name: str, arguments: str) -> Item:
    return {
        "type": "mcp_approval_request",
        "id": item_id,
        "server_label": label,
        "name": name,
        "arguments": arguments,
    }


def item_event(kind: str, output_index: int, item: Item) -> Event:
    """`response.output_item.added` / `.done` (`kind`: "added" or "done")."""
    return {"type": f"response.output_item.{kind}", "output_index": output_index, "item": item}


def list_tools_events(output_index: int, item: Item) -> list[Event]:
    """A listing from start to end: added, in_progress, completed or failed, done."""
    pending = {**item, "tools": [], "error": None}
    stage = "failed" if item.get("error") else "completed"
    return [
        item_event("added", output_index, pending),
        _stage("mcp_list_tools", "in_progress", output_index, item["id"]),
        _stage("mcp_list_tools", stage, output_index, item["id"]),
        item_event("done", output_index, item),
    ]


def call_start_events(output_index: int, item: Item) -> list[Event]:
    """A call up to running it: added, in_progress, the arguments (one delta and done)."""
    pending = {**item, "status": "in_progress", "output": None, "error": None}
    item_id = item["id"]
    return [
        item_event("added", output_index, pending),
        _stage("mcp_call", "in_progress", output_index, item_id),
        {
            "type": "response.mcp_call_arguments.delta",
            "output_index": output_index,
            "item_id": item_id,
            "delta": item["arguments"],
        },
        {
            "type": "response.mcp_call_arguments.done",
            "output_index": output_index,
            "item_id": item_id,
            "arguments": item["arguments"],
        },
    ]


def call_end_events(output_index: int, item: Item) -> list[Event]:
    """A call once run: completed (or failed), done."""
    stage = "failed" if item.get("error") is not None else "completed"
    return [
        _stage("mcp_call", stage, output_index, item["id"]),
        item_event("done", output_index, item),
    ]


def unrun_call_events(output_index: int, item: Item) -> list[Event]:
    """A call not run: added, its arguments, done — no `mcp_call.in_progress`, as it never
    ran."""
    item_id = item["id"]
    return [
        item_event("added", output_index, item),
        {
            "type": "response.mcp_call_arguments.delta",
            "output_index": output_index,
            "item_id": item_id,
            "delta": item["arguments"],
        },
        {
            "type": "response.mcp_call_arguments.done",
            "output_index": output_index,
            "item_id": item_id,
            "arguments": item["arguments"],
        },
        item_event("done", output_index, item),
    ]


def approval_request_events(output_index: int, item: Item) -> list[Event]:
    return [item_event("added", output_index, item), item_event("done", output_index, item)]


def as_input(item: Mapping[str, Any]) -> list[Item]:
    """A finished `mcp_call` as the input items the model reads on the next pass."""
    call_id = f"call_{item['id']}"
    error = item.get("error")
    output = item.get("output")
    text = output if isinstance(output, str) else ""
    if error:
        text = f"error: {error_text(error)}"
    return [
        {
            "type": "function_call",
            "call_id": call_id,
            "name": item["name"],
            "namespace": item["server_label"],
            "arguments": item["arguments"],
        },
        {"type": "function_call_output", "call_id": call_id, "output": text},
    ]


def _stage(kind: str, stage: str, output_index: int, item_id: str) -> Event:
    return {"type": f"response.{kind}.{stage}", "output_index": output_index, "item_id": item_id}
