"""The hosted-tool loop's plumbing bounds end to end: each upstream pass gives its connection back
to the pool. The openai SDK against the proxy on real sockets, the simulator upstream (it records
each request's client port), a real MCP server beside it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from tests.harmony import ids_of
from tests.mcp_servers import mcp_server
from tests.stateful_support import MODEL, Stack, stack


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with mcp_server() as url:
        yield url


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding, server_url: str) -> Iterator[Stack]:
    with stack(
        encoding,
        None,
        mcp_allowed_servers=("127.0.0.1",),
        mcp_allow_private_addresses=True,
        mcp_call_timeout=5.0,
    ) as running:
        yield running


def mcp(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "tools",
        "server_url": url,
        "require_approval": "never",
        **extra,
    }


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
