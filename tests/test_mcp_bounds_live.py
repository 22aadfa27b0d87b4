"""The bounds of hosted MCP tools before and between the passes, end to end: the `mcp` tools a
request may declare, their servers listed concurrently, approved calls within the call budget and
the loop's time, the planning cancelled with its client; and each upstream pass giving its
connection back to the pool. The openai SDK and httpx against the proxy on real sockets, the
simulator upstream (it records each request's client port), a real MCP server beside it (it
records the requests in flight per tag header)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai_harmony import HarmonyEncoding

from tests.harmony import ids_of
from tests.mcp_servers import IN_FLIGHT, LOOPBACK, PEAK_TAGS, SEEN_AUTH, mcp_server, mcp_tool
from tests.stateful_support import MODEL, Stack, stack, until


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with mcp_server() as url:
        yield url


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding, server_url: str) -> Iterator[Stack]:
    with stack(
        encoding,
        None,
        **LOOPBACK,
        mcp_call_timeout=5.0,
        mcp_max_servers=4,
        mcp_list_cache_seconds=0.0,
    ) as running:
        yield running


mcp = mcp_tool


#: A model that calls `tools.echo` whatever its prompt says (every pass replays it).
CALLS_AGAIN = (
    "<|channel|>analysis<|message|>I call echo again.<|end|><|start|>assistant<|channel|>"
    'commentary to=tools.echo <|constrain|>json<|message|>{"text": "again"}<|call|>'
)


@pytest.mark.parametrize("stream", [False, True])
def test_the_passes_of_one_response_reuse_one_upstream_connection(
    live: Stack, server_url: str, encoding: HarmonyEncoding, stream: bool
) -> None:
    replayed = ids_of(encoding, CALLS_AGAIN)
    headers = {
        "X-Sim-Replay": ",".join(map(str, replayed)),
        # After each pass's last token (its finish frame), its usage frame and [DONE] come
        # later: a pass that stops reading at its terminal event cannot reuse the connection.
        "X-Sim-Fault": f"stall@{len(replayed)}:0.05",
    }
    before = len(live.completions())
    response: Any = live.client().responses.create(
        model=MODEL,
        input="call it",
        tools=[mcp(server_url, allowed_tools=["echo"])],
        max_tool_calls=2,
        store=False,
        stream=stream,
        extra_headers=headers,
    )
    if stream:
        response = list(response)[-1].response
    calls = [item.status for item in response.output if item.type == "mcp_call"]
    assert calls == ["completed", "completed", "incomplete"]
    passes = live.completions()[before:]
    assert len(passes) == 3
    assert all(record.completed for record in passes)
    # Each pass read to its end: its connection went back to the pool for the next one.
    assert len({record.peer for record in passes}) == 1, [r.peer for r in passes]


def tagged(url: str, label: str, tag: str, delay: float = 0.0) -> dict[str, Any]:
    """An `mcp` tool whose requests the test server sees tagged (and delayed)."""
    headers = {"x-test-tag": tag, "x-test-delay": str(delay)}
    return mcp(url, server_label=label, allowed_tools=["echo"], headers=headers)


def test_more_mcp_tools_than_the_cap_are_a_400_before_any_is_listed(
    live: Stack, server_url: str
) -> None:
    seen = len(SEEN_AUTH)
    tools = [tagged(server_url, f"s{n}", f"cap-{n}") for n in range(5)]
    with pytest.raises(openai.BadRequestError) as refused:
        live.client().responses.create(model=MODEL, input="x", tools=tools, store=False)
    assert refused.value.param == "tools"
    assert refused.value.code == "array_above_max_length"
    assert "mcp_max_servers" in refused.value.message
    assert len(SEEN_AUTH) == seen  # no server was reached
    listed = live.client().responses.create(
        model=MODEL, input="x", tools=tools[:4], store=False, max_tool_calls=0
    )
    assert [item.type for item in listed.output][:4] == ["mcp_list_tools"] * 4


def test_distinct_servers_are_listed_concurrently(live: Stack, server_url: str) -> None:
    PEAK_TAGS[0] = 0
    tools = [tagged(server_url, f"s{n}", f"list-{n}", delay=0.2) for n in range(4)]
    response = live.client().responses.create(
        model=MODEL, input="x", tools=tools, store=False, max_tool_calls=0
    )
    listings = [item for item in response.output if item.type == "mcp_list_tools"]
    assert [item.server_label for item in listings] == ["s0", "s1", "s2", "s3"]
    assert all(item.error is None and item.tools for item in listings)
    # Each server's requests were in flight while the others' were (in series: one at a time).
    assert PEAK_TAGS[0] == 4


def test_one_server_under_several_labels_is_listed_once(live: Stack, server_url: str) -> None:
    seen = len(SEEN_AUTH)
    one = tagged(server_url, "a", "same")
    response = live.client().responses.create(
        model=MODEL,
        input="x",
        tools=[one, {**one, "server_label": "b"}],
        store=False,
        max_tool_calls=0,
    )
    listings = [item for item in response.output if item.type == "mcp_list_tools"]
    assert [item.server_label for item in listings] == ["a", "b"]
    assert listings[0].tools == listings[1].tools
    assert listings[0].tools
    # One MCP session (its initialize, notification, stream and list requests), not two.
    session = len(SEEN_AUTH) - seen
    live.client().responses.create(
        model=MODEL, input="x", tools=[one], store=False, max_tool_calls=0
    )
    assert len(SEEN_AUTH) - seen == 2 * session


def approvals(count: int, arguments: str, name: str = "echo") -> list[dict[str, Any]]:
    """`count` approval requests of the model's and the client's approving answers."""
    pairs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(count):
        pairs.append(
            {
                "type": "mcp_approval_request",
                "id": f"mcpr_{n}",
                "server_label": "tools",
                "name": name,
                "arguments": arguments,
            }
        )
    for n in range(count):
        pairs.append(
            {"type": "mcp_approval_response", "approval_request_id": f"mcpr_{n}", "approve": True}
        )
    return pairs


def test_approved_calls_count_against_the_budget(live: Stack, server_url: str) -> None:
    tool = mcp(server_url, allowed_tools=["echo"], require_approval="always")
    response = live.client().responses.create(
        model=MODEL,
        input=approvals(50, '{"text": "ok"}'),  # type: ignore[arg-type]
        tools=[tool],
        store=False,
        max_tool_calls=3,
    )
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [call.status for call in calls][:4] == ["completed"] * 3 + ["incomplete"]
    assert sum(call.status == "completed" for call in calls) == 3
    assert "max_tool_calls" in str(calls[3].error)
    assert response.status == "completed"


def test_approved_calls_stop_at_the_loop_timeout(
    encoding: HarmonyEncoding, server_url: str
) -> None:
    with stack(
        encoding,
        None,
        **LOOPBACK,
        mcp_loop_timeout=0.5,
    ) as running:
        tool = mcp(server_url, allowed_tools=["sleep"], require_approval="always")
        response = running.client().responses.create(
            model=MODEL,
            input=approvals(6, '{"seconds": 0.3}', name="sleep"),  # type: ignore[arg-type]
            tools=[tool],
            store=False,
        )
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert len(calls) == 6
    ran = [call for call in calls if call.status == "completed"]
    assert 1 <= len(ran) <= 2  # 0.3 s each: the third starts past the 0.5 s
    assert all("mcp_loop_timeout" in str(call.error) for call in calls[len(ran) :])


def test_a_client_gone_while_approved_calls_run_cancels_them(live: Stack, server_url: str) -> None:
    gone = live.metric("proxy_client_disconnects_total", phase="before_upstream")
    passes = len(live.completions())
    IN_FLIGHT.clear()
    tool = tagged(server_url, "tools", "leaving")
    tool["allowed_tools"], tool["require_approval"] = ["slow"], "always"
    body = {
        "model": MODEL,
        "input": approvals(3, "{}", name="slow"),
        "tools": [tool],
        "store": False,
        "stream": True,
    }
    with pytest.raises(httpx.ReadTimeout):  # the slow call (30 s, cut at 5 s) holds the answer
        httpx.post(live.base_url + "/responses", json=body, timeout=1.0)
    # The client left: the call in flight is cancelled, its MCP session closed, and no other
    # call nor any pass runs (before, three calls of up to 5 s each, then a pass).
    until(
        lambda: live.metric("proxy_client_disconnects_total", phase="before_upstream") > gone,
        timeout=3,
    )
    until(lambda: IN_FLIGHT["leaving"] == 0, timeout=3)
    assert len(live.completions()) == passes


def test_a_websocket_closed_while_approved_calls_run_cancels_them(
    live: Stack, server_url: str
) -> None:
    gone = live.metric("proxy_client_disconnects_total", phase="before_upstream")
    passes = len(live.completions())
    IN_FLIGHT.clear()
    tool = tagged(server_url, "tools", "ws-leaving")
    tool["allowed_tools"], tool["require_approval"] = ["slow"], "always"
    with live.client().responses.connect() as connection:
        connection.response.create(
            model=MODEL,
            input=approvals(3, "{}", name="slow"),  # type: ignore[arg-type]
            tools=[tool],  # type: ignore[list-item]
            store=False,
        )
        until(lambda: IN_FLIGHT["ws-leaving"] > 0, timeout=5)  # listing, then the slow call
        time.sleep(0.5)
    # The socket closed: the call in flight is cancelled, its MCP session closed, and no other
    # call nor any pass runs; the turn is counted as a client gone before upstream, as over HTTP.
    until(
        lambda: live.metric("proxy_client_disconnects_total", phase="before_upstream") > gone,
        timeout=3,
    )
    until(lambda: IN_FLIGHT["ws-leaving"] == 0, timeout=3)
    assert len(live.completions()) == passes
