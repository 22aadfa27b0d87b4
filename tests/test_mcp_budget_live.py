"""The hosted-tool loop's bounds end to end: `max_tool_calls` with the operator's
`mcp_max_calls` (the smaller wins) and `mcp_loop_timeout`. Once spent, the MCP tools are
withdrawn from the next pass; a call the model makes anyway is shown unrun, never dropped.
The openai SDK (strict) against the proxy on real sockets, the simulator upstream (its replay
header makes a model that calls a tool on every pass), a real MCP server beside it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from proxy.simulator.model import EACH_TOOL
from tests.harmony import ids_of
from tests.mcp_servers import mcp_server, mcp_tool
from tests.openapi import assert_events_match_spec, assert_response_matches_spec
from tests.stateful_support import MODEL, Stack, dumped, stack

#: A model that calls `tools.echo` whatever its prompt says (every pass replays it).
CALLS_AGAIN = (
    "<|channel|>analysis<|message|>I call echo again.<|end|><|start|>assistant<|channel|>"
    'commentary to=tools.echo <|constrain|>json<|message|>{"text": "again"}<|call|>'
)


#: A tool_choice forcing `tools.echo`.
FORCED: Any = {"type": "mcp", "server_label": "tools", "name": "echo"}


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with mcp_server() as url:
        yield url


def settings(**extra: Any) -> dict[str, Any]:
    return {
        "mcp_allowed_servers": ("127.0.0.1",),
        "mcp_allow_private_addresses": True,
        "mcp_call_timeout": 5.0,
        **extra,
    }


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding, server_url: str) -> Iterator[Stack]:
    with stack(encoding, None, **settings(mcp_max_calls=3)) as running:
        yield running


def mcp(url: str) -> Any:
    return mcp_tool(url, allowed_tools=["echo", "add"])


def replaying(encoding: HarmonyEncoding) -> dict[str, str]:
    return {"X-Sim-Replay": ",".join(map(str, ids_of(encoding, CALLS_AGAIN)))}


def prompts(live: Stack, encoding: HarmonyEncoding, count: int) -> list[str]:
    return [encoding.decode(list(r.prompt_ids)) for r in live.completions()[-count:]]


def test_a_call_past_the_budget_is_shown_unrun_and_ends_the_response(
    live: Stack, server_url: str, encoding: HarmonyEncoding
) -> None:
    client = live.client()
    unrun_before = live.metric("proxy_mcp_calls_total", server_label="tools", outcome="not_run")
    events = dumped(
        client.responses.create(
            model=MODEL,
            input="call it",
            tools=[mcp(server_url)],
            max_tool_calls=1,
            store=False,
            stream=True,
            extra_headers=replaying(encoding),
        )
    )
    assert_events_match_spec(events)
    final = events[-1]
    assert final["type"] == "response.completed"
    calls = [item for item in final["response"]["output"] if item["type"] == "mcp_call"]
    assert [(c["status"], c["output"]) for c in calls] == [
        ("completed", "echo: again"),
        ("incomplete", None),
    ]
    unrun = calls[1]
    assert final["response"]["output"][-1] == unrun  # the response ended with it
    assert "not run" in unrun["error"]["message"]
    assert "max_tool_calls" in unrun["error"]["message"]
    kinds = [event["type"] for event in events]
    assert kinds.count("response.mcp_call.in_progress") == 1  # the unrun one never ran
    assert kinds.count("response.mcp_call_arguments.done") == 2
    # The second pass had no MCP tool to call: withdrawn, its call read all the same.
    first, second = prompts(live, encoding, 2)
    assert "namespace tools" in first
    assert "namespace tools" not in second
    unrun_after = live.metric("proxy_mcp_calls_total", server_label="tools", outcome="not_run")
    assert unrun_after == unrun_before + 1


def test_the_operators_limit_wins_when_smaller(
    live: Stack, server_url: str, encoding: HarmonyEncoding
) -> None:
    client = live.client()
    response = client.responses.create(
        model=MODEL,
        input="call it",
        tools=[mcp(server_url)],
        max_tool_calls=10,
        store=False,
        extra_headers=replaying(encoding),
    )
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [call.status for call in calls] == ["completed"] * 3 + ["incomplete"]
    assert response.max_tool_calls == 10
    assert_response_matches_spec(response.model_dump(mode="json", exclude_unset=True))


def test_max_tool_calls_zero_lists_the_tools_and_the_model_answers(
    live: Stack, server_url: str, encoding: HarmonyEncoding
) -> None:
    client = live.client()
    response = client.responses.create(
        model=MODEL,
        input=f"no calls {EACH_TOOL}",
        tools=[mcp(server_url)],
        max_tool_calls=0,
        store=False,
    )
    assert [item.type for item in response.output] == ["mcp_list_tools", "reasoning", "message"]
    assert response.status == "completed"
    (prompt,) = prompts(live, encoding, 1)
    assert "namespace tools" not in prompt
    # A model that calls anyway: its call is shown unrun, nothing runs.
    insisted = client.responses.create(
        model=MODEL,
        input="no calls",
        tools=[mcp(server_url)],
        tool_choice=FORCED,
        max_tool_calls=0,
        store=False,
        extra_headers=replaying(encoding),
    )
    assert [item.type for item in insisted.output] == ["mcp_list_tools", "reasoning", "mcp_call"]
    call = insisted.output[-1]
    assert call.type == "mcp_call"
    assert call.status == "incomplete"
    assert call.output is None
    assert_response_matches_spec(insisted.model_dump(mode="json", exclude_unset=True))


def test_past_the_loop_timeout_the_call_is_unrun_and_the_model_told(
    encoding: HarmonyEncoding, server_url: str
) -> None:
    with stack(encoding, None, **settings(mcp_loop_timeout=1e-9)) as running:
        response = running.client().responses.create(
            model=MODEL, input="too late", tools=[mcp(server_url)], store=False
        )
        first, second = prompts(running, encoding, 2)
    types = [item.type for item in response.output]
    assert types == ["mcp_list_tools", "reasoning", "mcp_call", "reasoning", "message"]
    call = response.output[2]
    assert call.type == "mcp_call"
    assert call.status == "incomplete"
    assert "mcp_loop_timeout" in str(call.error)
    assert response.status == "completed"
    assert "namespace tools" in first
    # The last pass: the tools withdrawn, the model told why its call did not run.
    assert "namespace tools" not in second
    assert "<|start|>tools.echo<|message|>error: not run:" in second
    assert "mcp_loop_timeout" in second.rsplit("<|start|>tools.echo", 1)[1]
