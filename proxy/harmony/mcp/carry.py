"""The `mcp_*` items a request carries in `input` (its own, or a stored chain's), read.

`mcp_list_tools` items say what a server listed: reused for that server label instead of
listing again, as OpenAI's API does across a chain. An `mcp_call` goes to the model as the call
and its result. An `mcp_approval_request` is what the model asked for; an
`mcp_approval_response` answers one. A denial is the call and its "declined" result, in the
answer's place (in every later request of a chain or a WebSocket session too, as it leaves no
output item); an approval not yet acted on (no `mcp_call` names it) is run by the shell before
generating.
What remains goes to the request renderer, which knows none of the `mcp_*` types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.harmony.mcp.items import as_input, declined_call
from proxy.harmony.request.check import (
    at,
    fail,
    missing,
    present,
    want_bool,
    want_list,
    want_object,
    want_str,
)

MCP_TYPES = frozenset(
    {"mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response"}
)


@dataclass(slots=True)
class Carried:
    """`items`: the input without `mcp_*` items (calls turned into call + output); `listed`:
    the last listing per server label; `requests`: approval requests by id; `answers`: approvals
    (`approval_request_id`, True) in order, those not yet acted on."""

    items: list[Any] = field(default_factory=list)
    listed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    answers: list[tuple[str, bool]] = field(default_factory=list)


def carry(value: Any) -> Carried:
    """Read the `mcp_*` items out of an `input` list (a string input carries none)."""
    carried = Carried()
    if not isinstance(value, list):
        carried.items = value
        return carried
    answered: set[str] = set()
    declined: set[str] = set()
    for index, item in enumerate(value):
        kind = present(item, "type") if isinstance(item, dict) else None
        if kind not in MCP_TYPES:
            carried.items.append(item)
            continue
        path = at("input", index)
        if kind == "mcp_list_tools":
            label = want_str(_required(item, "server_label", path), at(path, "server_label"))
            tools = present(item, "tools")
            if tools is not None and not present(item, "error"):
                carried.listed[label] = _listed(tools, at(path, "tools"))
        elif kind == "mcp_call":
            for key in ("server_label", "name", "arguments", "id"):
                want_str(_required(item, key, path), at(path, key))
            answer_to = present(item, "approval_request_id")
            if answer_to is not None:
                answered.add(want_str(answer_to, at(path, "approval_request_id")))
            carried.items.extend(as_input(item))
        elif kind == "mcp_approval_request":
            for key in ("server_label", "name", "arguments", "id"):
                want_str(_required(item, key, path), at(path, key))
            carried.requests[item["id"]] = item
        else:
            request_id = want_str(
                _required(item, "approval_request_id", path), at(path, "approval_request_id")
            )
            approve = want_bool(_required(item, "approve", path), at(path, "approve"))
            if request_id not in carried.requests:
                fail(
                    at(path, "approval_request_id"),
                    request_id,
                    "no mcp_approval_request with this id precedes it in the input or the "
                    "previous responses",
                )
            if not approve:
                if request_id not in declined:
                    declined.add(request_id)
                    carried.items.extend(as_input(declined_call(carried.requests[request_id])))
            elif all(request_id != known for known, _ in carried.answers):
                carried.answers.append((request_id, approve))
    # An answer a later `mcp_call` acted on (by its `approval_request_id`) is done.
    carried.answers = [answer for answer in carried.answers if answer[0] not in answered]
    return carried


def pending_answers(carried: Carried) -> list[tuple[dict[str, Any], bool]]:
    """The approval requests approved and not yet run, with the answer (True)."""
    return [(carried.requests[request_id], approve) for request_id, approve in carried.answers]


def _listed(tools: Any, path: str) -> list[dict[str, Any]]:
    """A carried listing's tools, checked as the model will see them (they are rendered)."""
    listed = []
    for number, tool in enumerate(want_list(tools, path)):
        where = at(path, number)
        tool = want_object(tool, where)
        want_str(_required(tool, "name", where), at(where, "name"))
        if present(tool, "input_schema") is not None:
            want_object(tool["input_schema"], at(where, "input_schema"))
        if present(tool, "description") is not None:
            want_str(tool["description"], at(where, "description"))
        listed.append(tool)
    return listed


def _required(item: dict[str, Any], key: str, path: str) -> Any:
    value = present(item, key)
    if value is None:
        missing(at(path, key))
    return value


__all__: Sequence[str] = ("MCP_TYPES", "Carried", "carry", "pending_answers")
