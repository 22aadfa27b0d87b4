"""Compaction with hosted MCP tools, on a real server with a real MCP server beside it: a request
past its `compact_threshold` that answers an `mcp_approval_response` compacts first, then runs
the approved call exactly once, after the compaction, and answers 200."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.request import compaction
from proxy.simulator.prompt import CHECKPOINT_ASK
from proxy.store.memory import MemoryStore
from tests.mcp_servers import LOOPBACK, mcp_server
from tests.openapi import assert_response_matches_spec
from tests.stateful_support import MODEL, Stack, stack

KEY = ("k1", b"6" * 32)
#: Well over 1,000 prompt tokens (the spec's least threshold).
LONG_NOTES = " ".join(f"note {n}: the café opens at nine, 東京 branch." for n in range(120))
EARLIER: list[Any] = [
    {"role": "user", "content": "Plan the launch."},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": LONG_NOTES}],
    },
]
THRESHOLD = [{"type": "compaction", "compact_threshold": 1000}]


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding) -> Iterator[tuple[Stack, str]]:
    with (
        mcp_server() as url,
        stack(
            encoding,
            MemoryStore(),
            reasoning_keys=(KEY,),
            **LOOPBACK,
            mcp_call_timeout=5.0,
        ) as running,
    ):
        yield running, url


def _tool(url: str) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "tools",
        "server_url": url,
        "allowed_tools": ["echo"],
        "require_approval": "always",
    }


def _post(live: Stack, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": "Bearer key-alice"}
    return httpx.post(live.base_url + "/responses", json=body, headers=headers, timeout=30)


def _calls(live: Stack) -> float:
    return live.metric("proxy_mcp_calls_total", server_label="tools", outcome="ok")


def _text(live: Stack, ids: list[int]) -> str:
    return str(live.app.state.services.deps.encoding.decode(ids))


def _asked(live: Stack, url: str, store: bool) -> dict[str, Any]:
    """A first turn that ends with an approval request for `echo`."""
    body = {
        "model": MODEL,
        "input": [*EARLIER, {"role": "user", "content": "approve me"}],
        "tools": [_tool(url)],
        "store": store,
    }
    asked = _post(live, body)
    assert asked.status_code == 200, asked.text
    response: dict[str, Any] = asked.json()
    assert response["output"][-1]["type"] == "mcp_approval_request"
    return response


def _check_answered(live: Stack, answer: httpx.Response, request_id: str, calls: float) -> None:
    assert answer.status_code == 200, answer.text
    response = answer.json()
    assert_response_matches_spec(response)
    kinds = [item["type"] for item in response["output"]]
    assert kinds[0] == "compaction", kinds
    assert kinds[-1] == "message"
    call = next(item for item in response["output"] if item["type"] == "mcp_call")
    assert call["approval_request_id"] == request_id
    assert call["output"] == "echo: approve me"
    assert _calls(live) == calls + 1  # exactly once
    # The pass, then the answer from the compaction with the call's result after it.
    pass_prompt, answer_prompt = (_text(live, list(r.prompt_ids)) for r in live.completions()[-2:])
    assert CHECKPOINT_ASK in pass_prompt
    assert "echo: approve me" not in pass_prompt  # the call ran after the pass
    assert compaction.SUMMARY_HEADING.strip() in answer_prompt
    assert "echo: approve me" in answer_prompt
    assert "note 100" not in answer_prompt


def test_an_approval_past_the_threshold_runs_its_call_once_after_compacting(
    live: tuple[Stack, str],
) -> None:
    running, url = live
    asked = _asked(running, url, store=False)
    request = asked["output"][-1]
    carried = [item for item in asked["output"] if item["type"] != "reasoning"]
    before = _calls(running)
    compactions = running.metric("proxy_compactions_total", trigger="threshold", outcome="ok")
    body = {
        "model": MODEL,
        "tools": [_tool(url)],
        "store": False,
        "context_management": THRESHOLD,
        "input": [
            *EARLIER,
            {"role": "user", "content": "approve me"},
            *carried,
            {
                "type": "mcp_approval_response",
                "approval_request_id": request["id"],
                "approve": True,
            },
        ],
    }
    _check_answered(running, _post(running, body), request["id"], before)
    after = running.metric("proxy_compactions_total", trigger="threshold", outcome="ok")
    assert after == compactions + 1


def test_an_approval_on_a_stored_chain_past_the_threshold_runs_once(
    live: tuple[Stack, str],
) -> None:
    running, url = live
    asked = _asked(running, url, store=True)
    request = asked["output"][-1]
    before = _calls(running)
    body = {
        "model": MODEL,
        "tools": [_tool(url)],
        "previous_response_id": asked["id"],
        "context_management": THRESHOLD,
        "input": [
            {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
        ],
    }
    answer = _post(running, body)
    _check_answered(running, answer, request["id"], before)
    # The chain continues from the compaction; the call is history and does not run again.
    follow = _post(
        running,
        {
            "model": MODEL,
            "tools": [_tool(url)],
            "previous_response_id": answer.json()["id"],
            "input": "thanks",
            "context_management": THRESHOLD,
        },
    )
    assert follow.status_code == 200, follow.text
    assert _calls(running) == before + 1


def test_a_declined_approval_with_a_trigger_runs_nothing_and_is_summarised(
    live: tuple[Stack, str],
) -> None:
    running, url = live
    asked = _asked(running, url, store=False)
    request = asked["output"][-1]
    carried = [item for item in asked["output"] if item["type"] != "reasoning"]
    before = _calls(running)
    body = {
        "model": MODEL,
        "tools": [_tool(url)],
        "store": False,
        "input": [
            {"role": "user", "content": "approve me"},
            *carried,
            {
                "type": "mcp_approval_response",
                "approval_request_id": request["id"],
                "approve": False,
            },
            {"type": "compaction_trigger"},
        ],
    }
    answer = _post(running, body)
    assert answer.status_code == 200, answer.text
    response = answer.json()
    assert response["output"][0]["type"] == "compaction"
    assert "mcp_call" not in [item["type"] for item in response["output"]]
    assert _calls(running) == before
    # The decline is history like any call: the pass summarises it, the answer reads the summary.
    pass_prompt, answer_prompt = (
        _text(running, list(r.prompt_ids)) for r in running.completions()[-2:]
    )
    assert CHECKPOINT_ASK in pass_prompt
    assert "the user declined this call" in pass_prompt
    assert compaction.SUMMARY_HEADING.strip() in answer_prompt
    assert "declined" not in answer_prompt
