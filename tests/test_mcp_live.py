"""Hosted MCP tools end to end: the openai SDK (strict) against the proxy on real sockets, in
front of the simulator, with real MCP servers (the official SDK's) beside it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import agents
import httpx
import openai
import pytest
from openai import AsyncOpenAI
from openai_harmony import HarmonyEncoding

from proxy.simulator.model import EACH_TOOL
from proxy.store.memory import MemoryStore
from tests.mcp_servers import LOOPBACK, SEEN_AUTH, mcp_server, mcp_tool
from tests.openapi import assert_events_match_spec, assert_response_matches_spec
from tests.stateful_support import MODEL, Stack, dumped, stack, until


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with mcp_server() as url:
        yield url


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding, server_url: str) -> Iterator[Stack]:
    with stack(
        encoding,
        MemoryStore(),
        **LOOPBACK,
        mcp_call_timeout=2.0,
        mcp_result_max_chars=500,
        keepalive_interval=0.5,
    ) as running:
        yield running


mcp = mcp_tool


def types_of(response: Any) -> list[str]:
    return [item.type for item in response.output]


def test_a_call_runs_inside_one_response(live: Stack, server_url: str) -> None:
    client = live.client()
    response = client.responses.create(
        model=MODEL, input="say hello", tools=[mcp(server_url, allowed_tools=["echo"])]
    )
    assert types_of(response)[0] == "mcp_list_tools"
    assert "mcp_call" in types_of(response)
    assert types_of(response)[-1] == "message"
    call = next(item for item in response.output if item.type == "mcp_call")
    assert (call.name, call.server_label, call.output) == ("echo", "tools", "echo: say hello")
    assert "echo: say hello" in response.output_text
    assert_response_matches_spec(response.model_dump(mode="json", exclude_unset=True))
    first, second = live.completions()[-2:]
    assert response.usage is not None
    assert response.usage.input_tokens == len(first.prompt_ids) + len(second.prompt_ids)
    assert response.usage.output_tokens == len(first.token_ids) + len(second.token_ids)


def test_streamed_events_are_one_response(live: Stack, server_url: str) -> None:
    client = live.client()
    events = dumped(
        client.responses.create(
            model=MODEL,
            input="stream it",
            tools=[mcp(server_url, allowed_tools=["echo"])],
            stream=True,
        )
    )
    kinds = [event["type"] for event in events]
    assert kinds.count("response.created") == 1
    assert kinds[-1] == "response.completed"
    assert sum(kind in {"response.completed", "response.failed"} for kind in kinds) == 1
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for needed in (
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
    ):
        assert needed in kinds
    assert "response.function_call_arguments.delta" not in kinds
    assert_events_match_spec(events)
    final = events[-1]["response"]
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == list(range(len(final["output"])))


def test_multi_call_loop(live: Stack, server_url: str) -> None:
    client = live.client()
    response = client.responses.create(
        model=MODEL,
        input=f"all of them {EACH_TOOL}",
        tools=[mcp(server_url, allowed_tools=["echo", "fail", "big"])],
    )
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [call.name for call in calls] == ["echo", "fail", "big"]
    assert calls[1].error is not None
    assert calls[1].output is None
    assert calls[2].output is not None
    assert calls[2].output.endswith("[output truncated at 500 characters]")
    assert response.status == "completed"
    assert types_of(response)[-1] == "message"


def test_a_slow_tool_is_an_error_not_a_hang(live: Stack, server_url: str) -> None:
    client = live.client()
    response = client.responses.create(
        model=MODEL, input="wait", tools=[mcp(server_url, allowed_tools=["slow"])]
    )
    call = next(item for item in response.output if item.type == "mcp_call")
    assert call.error is not None
    assert "timed out after 2 s" in str(call.error)
    assert response.status == "completed"
    assert "timed out" in response.output_text  # the model was told


def test_headers_reach_the_server_and_are_never_echoed_or_stored(
    live: Stack, server_url: str
) -> None:
    client = live.client()
    SEEN_AUTH.clear()
    tool = mcp(server_url, allowed_tools=["echo"], headers={"Authorization": "Bearer sekrit-1"})
    response = client.responses.create(model=MODEL, input="hi", tools=[tool], store=True)
    assert "Bearer sekrit-1" in SEEN_AUTH
    assert "sekrit" not in response.model_dump_json()
    stored = client.responses.retrieve(response.id)
    assert "sekrit" not in stored.model_dump_json()
    items = client.responses.input_items.list(response.id)
    assert "sekrit" not in items.model_dump_json()


def test_approval_round_trip_with_previous_response_id(live: Stack, server_url: str) -> None:
    client = live.client()
    tool = mcp(server_url, allowed_tools=["echo"], require_approval="always")
    asked = client.responses.create(model=MODEL, input="approve me", tools=[tool])
    assert types_of(asked)[-1] == "mcp_approval_request"
    request = asked.output[-1]
    assert request.name == "echo"
    done = client.responses.create(
        model=MODEL,
        previous_response_id=asked.id,
        tools=[tool],
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
        ],
    )
    call = next(item for item in done.output if item.type == "mcp_call")
    assert call.approval_request_id == request.id
    assert call.output == "echo: approve me"
    assert types_of(done)[-1] == "message"
    assert "mcp_list_tools" not in types_of(done)  # the chain's listing is reused


def test_approval_round_trip_with_items_in_input(live: Stack, server_url: str) -> None:
    client = live.client()
    tool = mcp(server_url, allowed_tools=["echo"], require_approval="always")
    asked = client.responses.create(model=MODEL, input="by items", tools=[tool], store=False)
    carried = [item.model_dump(mode="json", exclude_none=True) for item in asked.output]
    request = asked.output[-1]
    denied = client.responses.create(
        model=MODEL,
        tools=[tool],
        store=False,
        input=[
            {"role": "user", "content": "by items"},
            *carried,
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False},
        ],
    )
    assert "mcp_call" not in types_of(denied)
    assert types_of(denied)[-1] == "message"
    assert "declined" in denied.output_text


def test_refusals_are_400_with_a_clear_code(live: Stack, server_url: str) -> None:
    client = live.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="x", tools=[mcp("https://mcp.example.com/mcp")])
    assert refused.value.code == "mcp_server_not_allowed"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(
            model=MODEL, input="x", tools=[{"type": "mcp", "server_label": "a"}]
        )
    assert bad.value.code == "missing_required_parameter"


@pytest.mark.parametrize(
    ("item", "param"),
    [
        (
            {"type": "mcp_list_tools", "server_label": "tools", "tools": [{}]},
            "input[0].tools[0].name",
        ),
        (
            {"type": "mcp_list_tools", "server_label": "tools", "tools": [{"name": 5}]},
            "input[0].tools[0].name",
        ),
        (
            {
                "type": "mcp_list_tools",
                "server_label": "tools",
                "tools": [{"name": "a", "input_schema": "x"}],
            },
            "input[0].tools[0].input_schema",
        ),
        ({"type": "mcp_list_tools", "server_label": "tools", "tools": ["a"]}, "input[0].tools[0]"),
        (
            {
                "type": "mcp_call",
                "server_label": "tools",
                "name": "echo",
                "arguments": "{}",
                "id": "mcp_1",
                "approval_request_id": ["x"],
            },
            "input[0].approval_request_id",
        ),
    ],
)
def test_malformed_carried_mcp_items_are_400_naming_the_field(
    live: Stack, server_url: str, item: dict[str, Any], param: str
) -> None:
    for stream in (False, True):
        answer = httpx.post(
            live.proxy.url + "/v1/responses",
            json={"model": MODEL, "input": [item], "tools": [mcp(server_url)], "stream": stream},
            timeout=30,
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == param


def test_private_addresses_are_refused_unless_allowed(
    encoding: HarmonyEncoding, server_url: str
) -> None:
    with stack(encoding, None, mcp_allowed_servers=("127.0.0.1",)) as closed:
        with pytest.raises(openai.BadRequestError) as refused:
            closed.client().responses.create(
                model=MODEL, input="x", tools=[mcp(server_url)], store=False
            )
        assert refused.value.code == "mcp_server_private_address"


@pytest.mark.parametrize("transport", ["http", "websocket"])
def test_agents_sdk_hosted_mcp_tool_with_approval(
    live: Stack, server_url: str, transport: str
) -> None:
    agents.set_tracing_disabled(True)
    asked: list[str] = []

    def approve(request: Any) -> Any:
        asked.append(request.data.name)
        return {"approve": True}

    async def run() -> Any:
        client = AsyncOpenAI(base_url=live.base_url, api_key="key-agents")
        model: Any = (
            agents.OpenAIResponsesWSModel(model=MODEL, openai_client=client)
            if transport == "websocket"
            else agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
        )
        try:
            agent = agents.Agent(
                name="hosted",
                instructions="Use the tools.",
                tools=[
                    agents.HostedMCPTool(
                        tool_config={
                            "type": "mcp",
                            "server_label": "tools",
                            "server_url": server_url,
                            "allowed_tools": ["echo"],
                            "require_approval": "always",
                        },
                        on_approval_request=approve,
                    )
                ],
                model=model,
            )
            return await agents.Runner.run(agent, "from the agent")
        finally:
            if isinstance(model, agents.OpenAIResponsesWSModel):
                await model.close()
            await client.close()

    sessions = live.metric("proxy_websocket_messages_total", direction="in")
    result = asyncio.run(run())
    assert asked == ["echo"]
    assert "echo: from the agent" in result.final_output
    turns = live.metric("proxy_websocket_messages_total", direction="in") - sessions
    assert (turns >= 2) if transport == "websocket" else (turns == 0)  # the approval: a turn
    kinds = [item.type for item in result.new_items]
    assert "mcp_approval_request_item" in kinds
    assert "mcp_approval_response_item" in kinds


def test_streamed_approval_request_ends_the_stream(live: Stack, server_url: str) -> None:
    client = live.client()
    tool = mcp(server_url, allowed_tools=["echo"], require_approval="always")
    events = dumped(client.responses.create(model=MODEL, input="s", tools=[tool], stream=True))
    assert_events_match_spec(events)
    final = events[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["output"][-1]["type"] == "mcp_approval_request"


def test_sse_transport_and_metrics(encoding: HarmonyEncoding) -> None:
    with (
        mcp_server("sse") as url,
        stack(
            encoding,
            None,
            **LOOPBACK,
        ) as running,
    ):
        client = running.client()
        response = client.responses.create(
            model=MODEL,
            input="over sse",
            tools=[mcp(url, allowed_tools=["echo"])],
            store=False,
        )
        call = next(item for item in response.output if item.type == "mcp_call")
        assert call.output == "echo: over sse"
        again = client.responses.create(
            model=MODEL, input="again", tools=[mcp(url, allowed_tools=["echo"])], store=False
        )
        assert "mcp_call" in types_of(again)
        metrics = httpx.get(running.proxy.url + "/metrics").text
        assert 'proxy_mcp_calls_total{outcome="ok",server_label="tools"} 2.0' in metrics
        assert 'proxy_mcp_list_tools_total{outcome="cached",server_label="tools"} 1.0' in metrics
        assert 'proxy_mcp_call_seconds_count{server_label="tools"} 2.0' in metrics


def test_a_client_gone_mid_call_leaves_a_cancelled_stored_response(
    live: Stack, server_url: str
) -> None:
    client = live.client()
    tool = mcp(server_url, allowed_tools=["slow"])
    stream = client.responses.create(
        model=MODEL, input="then leave", tools=[tool], store=True, stream=True
    )
    key = None
    for event in stream:
        if event.type == "response.created":
            key = event.response.id
        if event.type == "response.mcp_call.in_progress":
            break
    stream.close()
    assert key is not None

    def status() -> str | None:
        try:
            return str(client.responses.retrieve(key).status)
        except openai.NotFoundError:
            return None

    until(lambda: status() == "cancelled", timeout=5)
    stored = client.responses.retrieve(key)
    assert types_of(stored) == ["mcp_list_tools", "reasoning", "mcp_call"]
    assert stored.output[-1].status == "incomplete"  # cut while it ran


def test_keepalives_flow_while_a_call_runs_and_background_is_refused(
    live: Stack, server_url: str
) -> None:
    body = {
        "model": MODEL,
        "input": "slow one",
        "stream": True,
        "store": False,
        "tools": [mcp(server_url, allowed_tools=["slow"])],
    }
    with httpx.stream("POST", live.base_url + "/responses", json=body, timeout=30) as answer:
        text = "".join(answer.iter_text())
    call_part = text[
        text.index("response.mcp_call_arguments.done") : text.index("response.mcp_call.failed")
    ]
    assert ": keepalive" in call_part  # the 2 s call, keepalives every 0.5 s
    assert text.count("event: response.completed") == 1
    client = live.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=MODEL, input="x", tools=[mcp(server_url)], background=True, store=True
        )
    assert refused.value.code == "unsupported_value"
    assert refused.value.param == "background"


def test_an_mcp_tool_choice_forces_that_tool_once(live: Stack, server_url: str) -> None:
    client = live.client()
    choice = {"type": "mcp", "server_label": "tools", "name": "add"}
    response = client.responses.create(
        model=MODEL,
        input="add them",
        tools=[mcp(server_url, allowed_tools=["echo", "add"])],
        tool_choice=choice,  # type: ignore[arg-type]
    )
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [call.name for call in calls] == ["add"]
    assert types_of(response)[-1] == "message"
    assert response.tool_choice.model_dump(exclude_none=True) == choice  # type: ignore[union-attr]
    assert_response_matches_spec(response.model_dump(mode="json", exclude_unset=True))
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=MODEL,
            input="x",
            tools=[mcp(server_url)],
            tool_choice={"type": "mcp", "server_label": "other", "name": "add"},
        )
    assert refused.value.param == "tool_choice.server_label"
