"""Hosted MCP tools over WebSocket turns: openai-python's `responses.connect()` against the proxy
(the HTTP guard, real uvicorn) in front of the simulator, with a real MCP server (the official
SDK's) beside it — the same loop, items and events as over `POST /v1/responses`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from proxy.simulator import SimulatorConfig, create_simulator_app
from proxy.simulator.model import EACH_TOOL
from tests.live import LiveServer
from tests.mcp_servers import LOOPBACK, SEEN_AUTH, mcp_server, mcp_tool
from tests.openapi import assert_events_match_spec
from tests.reliability import Proxy, running_proxy

SIM = SimulatorConfig(stream_interval=8, token_seconds=0.0005, first_token_seconds=0.001)
MODEL = "gpt-oss-120b"
_TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


@pytest.fixture(scope="module")
def upstream(encoding: HarmonyEncoding) -> Iterator[LiveServer]:
    with LiveServer(create_simulator_app(SIM, encoding)) as server:
        yield server


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with mcp_server() as url:
        yield url


@pytest.fixture(scope="module")
def proxy(upstream: LiveServer, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    with running_proxy(
        upstream.url,
        encoding,
        store_url="off",
        **LOOPBACK,
        mcp_call_timeout=5.0,
    ) as proxy:
        yield proxy


mcp = mcp_tool


def turn(connection: Any, **request: Any) -> list[dict[str, Any]]:
    """One `response.create` and its events, as dicts, to the terminal one."""
    connection.response.create(**request)
    events = []
    for event in connection:
        events.append(event.model_dump(mode="json", exclude_unset=True))
        if event.type in _TERMINAL:
            return events
    raise AssertionError("the connection ended without a terminal event")


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def output_types(events: list[dict[str, Any]]) -> list[str]:
    return [item["type"] for item in events[-1]["response"]["output"]]


def client_of(proxy: Proxy) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)


def test_a_turn_runs_an_mcp_call_as_a_post_stream_does(proxy: Proxy, server_url: str) -> None:
    SEEN_AUTH.clear()
    tool = mcp(server_url, allowed_tools=["echo"], headers={"Authorization": "Bearer sekrit-ws"})
    with client_of(proxy) as client, client.responses.connect() as connection:
        events = turn(connection, model=MODEL, input="over the socket", tools=[tool])
    seen = kinds(events)
    assert seen.count("response.created") == 1
    assert seen[-1] == "response.completed"
    assert sum(kind in _TERMINAL for kind in seen) == 1
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for needed in (
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
    ):
        assert needed in seen
    assert "response.function_call_arguments.delta" not in seen
    assert_events_match_spec(events)
    final = events[-1]["response"]
    assert output_types(events)[0] == "mcp_list_tools"
    assert output_types(events)[-1] == "message"
    call = next(item for item in final["output"] if item["type"] == "mcp_call")
    assert (call["name"], call["output"]) == ("echo", "echo: over the socket")
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == list(range(len(final["output"])))
    # The credential reached the server, and nothing the client sees or the proxy logs holds it.
    assert "Bearer sekrit-ws" in SEEN_AUTH
    assert final["tools"][0].get("headers") is None
    assert not any("sekrit" in str(event) for event in events)
    assert "sekrit" not in proxy.logs.text()
    assert proxy.metric("proxy_mcp_calls_total", server_label="tools", outcome="ok") >= 1


def test_an_approval_round_trip_over_one_connection_with_store_false(
    proxy: Proxy, server_url: str
) -> None:
    tool = mcp(server_url, allowed_tools=["echo"], require_approval="always")
    with client_of(proxy) as client, client.responses.connect() as connection:
        asked = turn(connection, model=MODEL, input="approve me", tools=[tool], store=False)
        request = asked[-1]["response"]["output"][-1]
        answer = {"type": "mcp_approval_response", "approval_request_id": request["id"]}
        done = turn(
            connection,
            model=MODEL,
            tools=[tool],
            store=False,
            previous_response_id=asked[-1]["response"]["id"],
            input=[{**answer, "approve": True}],
        )
        # The connection's last response now holds the request, its answer and the call: a
        # further turn continues it without running (or asking for) that call again.
        after = turn(
            connection,
            model=MODEL,
            tools=[mcp(server_url, allowed_tools=["echo"], require_approval="never")],
            store=False,
            previous_response_id=done[-1]["response"]["id"],
            input="thanks",
        )
    assert asked[-1]["type"] == "response.completed"
    assert request["type"] == "mcp_approval_request"
    assert request["name"] == "echo"
    assert done[-1]["type"] == "response.completed", done[-1]
    assert done[-1]["response"]["previous_response_id"] == asked[-1]["response"]["id"]
    call = next(i for i in done[-1]["response"]["output"] if i["type"] == "mcp_call")
    assert call["approval_request_id"] == request["id"]
    assert call["output"] == "echo: approve me"
    assert output_types(done) == ["mcp_call", "reasoning", "message"]  # the listing reused
    assert_events_match_spec([*asked, *done, *after])
    assert after[-1]["type"] == "response.completed", after[-1]
    # This turn's model called echo anew with the last user text: one new call, no old one.
    calls = [i for i in after[-1]["response"]["output"] if i["type"] == "mcp_call"]
    assert [c["output"] for c in calls] == ["echo: thanks"]
    assert calls[0]["approval_request_id"] is None


def test_a_budget_of_one_withdraws_the_tools_and_the_model_answers(
    proxy: Proxy, upstream: LiveServer, encoding: HarmonyEncoding, server_url: str
) -> None:
    tool = mcp(server_url, allowed_tools=["echo", "add"])
    records = upstream.server.config.app.state.simulator.requests
    with client_of(proxy) as client, client.responses.connect() as connection:
        events = turn(
            connection,
            model=MODEL,
            input=f"both of them {EACH_TOOL}",
            tools=[tool],
            max_tool_calls=1,
            store=False,
        )
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert final["max_tool_calls"] == 1
    calls = [item for item in final["output"] if item["type"] == "mcp_call"]
    assert [(c["name"], c["status"]) for c in calls] == [("echo", "completed")]
    assert output_types(events)[-1] == "message"
    assert_events_match_spec(events)
    passes = [r for r in records if r.path == "/v1/completions"][-2:]
    first, second = (encoding.decode(list(r.prompt_ids)) for r in passes)
    assert "both of them" in first
    assert "namespace tools" in first
    assert "namespace tools" not in second  # withdrawn: the model could only answer


def test_a_warm_up_with_mcp_tools_lists_them_and_generates_nothing(
    proxy: Proxy, upstream: LiveServer, server_url: str
) -> None:
    records = upstream.server.config.app.state.simulator.requests
    before = len([r for r in records if r.path == "/v1/completions"])
    tool = mcp(server_url, allowed_tools=["echo"], headers={"Authorization": "Bearer sekrit-w"})
    with client_of(proxy) as client, client.responses.connect() as connection:
        connection.send(
            {
                "type": "response.create",
                "model": MODEL,
                "input": "hi",
                "tools": [tool],
                "generate": False,
            }
        )
        events = []
        for event in connection:
            events.append(event.model_dump(mode="json", exclude_unset=True))
            if event.type in _TERMINAL:
                break
        later = turn(
            connection,
            model=MODEL,
            input="now go",
            tools=[tool],
            previous_response_id=events[-1]["response"]["id"],
        )
    assert events[-1]["type"] == "response.completed"
    assert output_types(events) == ["mcp_list_tools"]
    assert not any("sekrit" in str(event) for event in events)
    assert_events_match_spec(events)
    after = len([r for r in records if r.path == "/v1/completions"])
    assert after - before == 2  # the later turn's two passes; the warm-up reached no upstream
    assert "mcp_list_tools" not in output_types(later)  # the warm-up's listing reused
    assert "mcp_call" in output_types(later)


def test_a_denial_is_told_to_the_model_once_across_later_turns(
    proxy: Proxy, upstream: LiveServer, encoding: HarmonyEncoding, server_url: str
) -> None:
    tool = mcp(server_url, allowed_tools=["echo"], require_approval="always")
    records = upstream.server.config.app.state.simulator.requests
    with client_of(proxy) as client, client.responses.connect() as connection:
        asked = turn(connection, model=MODEL, input="deny me", tools=[tool], store=False)
        request = asked[-1]["response"]["output"][-1]
        denied = turn(
            connection,
            model=MODEL,
            tools=[tool],
            store=False,
            previous_response_id=asked[-1]["response"]["id"],
            input=[
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": request["id"],
                    "approve": False,
                }
            ],
        )
        later = turn(
            connection,
            model=MODEL,
            store=False,
            previous_response_id=denied[-1]["response"]["id"],
            input="and now?",
        )
    assert "mcp_call" not in output_types(denied)
    assert "declined" in str(denied[-1]["response"]["output"])
    assert later[-1]["type"] == "response.completed", later[-1]
    (prompt,) = [encoding.decode(list(r.prompt_ids)) for r in records][-1:]
    # Told once, as the tool's answer (the model's reply quotes it too).
    assert prompt.count("error: the user declined this call<|end|>") == 1
    assert prompt.endswith("and now?<|end|><|start|>assistant")
