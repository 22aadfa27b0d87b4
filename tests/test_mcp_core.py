"""Hosted MCP tools in the sans-IO core: the `mcp` tool read and echoed, the namespace the model
sees, the `mcp_*` items and events (valid against OpenAI's spec), the items a chain carries."""

from __future__ import annotations

from typing import Any

import pytest
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    Role,
    ToolDescription,
    ToolNamespaceConfig,
)

from proxy.errors import ClientError
from proxy.harmony.mcp import carry, declare, items
from proxy.simulator.model import EACH_TOOL, ScriptedModel
from tests.openapi import assert_events_match_spec, assert_matches_spec

LISTED = [
    {"name": "echo", "description": "Echo.", "input_schema": {"type": "object"}},
    {
        "name": "read",
        "description": None,
        "input_schema": {"type": "object"},
        "annotations": {"readOnlyHint": True},
    },
    {"name": "write", "input_schema": {"type": "object"}, "annotations": None},
]


def mcp_tool(**extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "srv", "server_url": "https://m.example/mcp", **extra}


def test_a_server_is_read_with_its_credentials_kept_out_of_the_echo() -> None:
    tool = mcp_tool(headers={"X-Key": "k1"}, authorization="tok", require_approval="never")
    server = declare.read_server(tool, "tools[0]")
    assert server.label == "srv"
    assert dict(server.headers) == {"X-Key": "k1", "Authorization": "Bearer tok"}
    echoed = declare.echo(tool)
    assert "headers" not in echoed
    assert "authorization" not in echoed
    assert echoed["server_url"] == "https://m.example/mcp"
    assert_matches_spec(echoed, "MCPTool")


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "mcp", "server_url": "https://m.example/mcp"}, "tools[0].server_label"),
        ({"type": "mcp", "server_label": "srv"}, "tools[0].server_url"),
        (mcp_tool(server_label="a.b"), "tools[0].server_label"),
        (mcp_tool(connector_id="connector_gmail"), "tools[0].connector_id"),
        (mcp_tool(headers={"a": 1}), "tools[0].headers.a"),
        (mcp_tool(require_approval="sometimes"), "tools[0].require_approval"),
        (mcp_tool(allowed_tools={"names": ["x"]}), "tools[0].allowed_tools.names"),
        (mcp_tool(bogus=1), "tools[0].bogus"),
    ],
)
def test_a_bad_server_is_a_400_naming_the_field(tool: dict[str, Any], param: str) -> None:
    with pytest.raises(ClientError) as refused:
        declare.read_server(tool, "tools[0]")
    assert refused.value.param == param


def test_allowed_tools_and_approval_filters() -> None:
    server = declare.read_server(
        mcp_tool(
            allowed_tools={"read_only": True},
            require_approval={"never": {"tool_names": ["read"]}},
        ),
        "tools[0]",
    )
    assert [tool["name"] for tool in LISTED if server.allows(tool)] == ["read"]
    assert not server.needs_approval(LISTED[1])
    assert server.needs_approval(LISTED[0])
    names = declare.read_server(mcp_tool(allowed_tools=["echo", "write"]), "t")
    assert [tool["name"] for tool in LISTED if names.allows(tool)] == ["echo", "write"]
    assert names.needs_approval(LISTED[0])  # the spec's default: always
    never = declare.read_server(mcp_tool(require_approval="never"), "t")
    assert not never.needs_approval(LISTED[2])


def test_the_namespace_holds_the_allowed_tools() -> None:
    server = declare.read_server(mcp_tool(allowed_tools=["echo"]), "t")
    namespace = declare.as_namespace(server, LISTED)
    assert namespace["name"] == "srv"
    assert [member["name"] for member in namespace["tools"]] == ["echo"]
    assert namespace["tools"][0]["parameters"] == {"type": "object"}


def test_items_and_events_match_the_spec() -> None:
    listing = items.list_tools_item("mcpl_1", "srv", LISTED)
    assert_matches_spec(listing, "MCPListTools")
    call = items.call_item("mcp_1", "srv", "echo", '{"text":"hi"}')
    done = {**call, "status": "completed", "output": "echo: hi"}
    failed = {
        **call,
        "status": "failed",
        "error": items.call_error(items.PROTOCOL_ERROR, "the MCP tool call timed out"),
    }
    tool_failed = {**call, "status": "failed", "error": items.call_error(items.TOOL_ERROR, "x")}
    for item in (call, done, failed, tool_failed):
        assert_matches_spec(item, "MCPToolCall")
    request = items.approval_request_item("mcpr_1", "srv", "echo", "{}")
    assert_matches_spec(request, "MCPApprovalRequest")
    events = [
        *items.list_tools_events(0, listing),
        *items.list_tools_events(1, {**listing, "tools": [], "error": "no"}),
        *items.call_start_events(2, call),
        *items.call_end_events(2, done),
        *items.call_end_events(3, failed),
        *items.approval_request_events(4, request),
    ]
    for number, event in enumerate(events):
        event["sequence_number"] = number
    assert_events_match_spec(events)
    assert [event["type"] for event in events[:4]] == [
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
    ]
    assert events[6]["type"] == "response.mcp_list_tools.failed"


def test_a_call_goes_back_to_the_model_as_call_and_output() -> None:
    done = items.call_item("mcp_1", "srv", "echo", "{}", status="completed", output="ok")
    call, output = items.as_input(done)
    assert (call["namespace"], call["name"], output["output"]) == ("srv", "echo", "ok")
    failed = items.call_item(
        "mcp_2", "srv", "echo", "{}", error=items.call_error(items.TOOL_ERROR, "broke")
    )
    assert items.as_input(failed)[1]["output"] == "error: broke"


def test_carried_items_are_read_out_of_the_input() -> None:
    listing = items.list_tools_item("mcpl_1", "srv", LISTED)
    done = items.call_item("mcp_1", "srv", "echo", "{}", status="completed", output="ok")
    request = items.approval_request_item("mcpr_1", "srv", "write", '{"a":1}')
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    user = {"role": "user", "content": "hi"}
    carried = carry.carry([user, listing, done, request, answer])
    assert carried.listed == {"srv": LISTED}
    assert [item.get("type") for item in carried.items] == [
        None,
        "function_call",
        "function_call_output",
    ]
    assert carry.pending_answers(carried) == [(request, True)]
    ran = items.call_item("mcp_2", "srv", "write", '{"a":1}', approval_request_id="mcpr_1")
    assert carry.pending_answers(carry.carry([request, answer, ran])) == []
    # A denial is told in its place, however many requests carry it later; nothing to run.
    denied = {**answer, "approve": False}
    reply = {"type": "message", "role": "assistant", "content": "declined, so…"}
    later = carry.carry([user, request, denied, reply, user])
    assert carry.pending_answers(later) == []
    kinds = [item.get("type") or item["role"] for item in later.items]
    assert kinds == ["user", "function_call", "function_call_output", "message", "user"]
    assert later.items[2]["output"] == "error: the user declined this call"
    with pytest.raises(ClientError) as refused:
        carry.carry([{**answer, "approval_request_id": "mcpr_x"}])
    assert refused.value.param == "input[0].approval_request_id"
    assert carry.carry("hello").items == "hello"


def test_the_scripted_model_calls_a_namespaced_tool_and_each_in_turn(
    encoding: HarmonyEncoding,
) -> None:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    tools = [ToolDescription.new(name, "", schema) for name in ("echo", "add")]
    developer = DeveloperContent.new().with_tools(
        ToolNamespaceConfig(name="srv", description="S", tools=tools)
    )

    def called(*answers: str) -> str | None:
        messages = [
            Message.from_role_and_content(Role.DEVELOPER, developer),
            Message.from_role_and_content(Role.USER, f"hi {EACH_TOOL}"),
        ]
        for name in answers:
            author = Author.new(Role.TOOL, f"srv.{name}")
            answer = Message.from_author_and_content(author, "ok")
            messages.append(answer.with_recipient("assistant").with_channel("commentary"))
        ids = encoding.render_conversation_for_completion(
            Conversation.from_messages(messages), Role.ASSISTANT
        )
        return ScriptedModel(encoding).complete(ids).messages[-1][1]

    assert called() == "srv.echo"
    assert called("echo") == "srv.add"
    assert called("echo", "add") is None
