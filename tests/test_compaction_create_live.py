"""Compaction on `POST /v1/responses`, on a real server with the real openai SDK:
`context_management`'s `compact_threshold` (past it the proxy compacts, then answers) and the
`compaction_trigger` item (compact now), streamed and not; the compaction item is the first
output item, `input_tokens` the compacted prompt's, and a stored chain keeps it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.request import compaction
from proxy.simulator.prompt import CHECKPOINT_ASK
from proxy.store.memory import MemoryStore
from tests.openapi import assert_response_matches_spec
from tests.stateful_support import MODEL, TOOLS, Stack, stack
from tests.wellformed import assert_well_formed

KEY = ("k1", b"5" * 32)
#: A history of well over 1,000 prompt tokens (the spec's least threshold).
LONG_NOTES = " ".join(f"note {n}: the café opens at nine, 東京 branch." for n in range(120))
HISTORY: list[Any] = [
    {"role": "user", "content": "Plan the launch."},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": LONG_NOTES}],
    },
    {"role": "user", "content": "What is left to do?"},
]
THRESHOLD = [{"type": "compaction", "compact_threshold": 1000}]


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding) -> Iterator[Stack]:
    with stack(encoding, MemoryStore(), reasoning_keys=(KEY,)) as running:
        yield running


def _post(live: Stack, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": "Bearer key-alice"}  # the SDK client's scope
    return httpx.post(live.base_url + "/responses", json=body, headers=headers, timeout=30)


def _events(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    lines = answer.content.split(b"\n")
    return [orjson.loads(line[6:]) for line in lines if line.startswith(b"data: ")]


def _full_tokens(live: Stack, items: list[Any]) -> int:
    plain = _post(live, {"model": MODEL, "input": items, "store": False}).json()
    return int(plain["usage"]["input_tokens"])


def test_past_the_threshold_the_proxy_compacts_then_answers(live: Stack) -> None:
    full = _full_tokens(live, HISTORY)
    assert full > 1000
    before = live.metric("proxy_compactions_total", trigger="threshold", outcome="ok")
    answer = _post(
        live, {"model": MODEL, "input": HISTORY, "context_management": THRESHOLD, "store": False}
    )
    assert answer.status_code == 200, answer.text
    response = answer.json()
    assert_response_matches_spec(response)
    kinds = [item["type"] for item in response["output"]]
    assert kinds[0] == "compaction"
    assert kinds[-1] == "message"
    assert response["usage"]["input_tokens"] < full / 3  # the compacted prompt
    # Two upstream requests: the pass (the instruction last), then the answer to the summary.
    pass_prompt, answer_prompt = (list(r.prompt_ids) for r in live.completions()[-2:])
    assert CHECKPOINT_ASK in _text(live, pass_prompt)
    assert compaction.SUMMARY_HEADING.strip() in _text(live, answer_prompt)
    assert "note 100" not in _text(live, answer_prompt)
    assert live.metric("proxy_compactions_total", trigger="threshold", outcome="ok") == before + 1
    # Sent back with the next turn (store: false), the history before it is dropped.
    follow = [*HISTORY, *response["output"], {"role": "user", "content": "Next?"}]
    again = _post(live, {"model": MODEL, "input": follow, "store": False}).json()
    assert again["usage"]["input_tokens"] < full / 3


def _text(live: Stack, ids: list[int]) -> str:
    return str(live.app.state.services.deps.encoding.decode(ids))


def test_under_the_threshold_nothing_is_compacted(live: Stack) -> None:
    body = {
        "model": MODEL,
        "input": "Short question?",
        "context_management": [{"type": "compaction", "compact_threshold": 100000}],
        "store": False,
    }
    response = _post(live, body).json()
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]


def test_the_threshold_streamed_carries_the_compaction_item_first(live: Stack) -> None:
    body = {"model": MODEL, "input": HISTORY, "context_management": THRESHOLD, "stream": True}
    events = _events(_post(live, body))
    final = assert_well_formed(events)
    kinds = [e["type"] for e in events[:4]]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert events[2]["item"]["type"] == "compaction"
    assert final["output"][0] == events[3]["item"]
    assert final["status"] == "completed"
    # Stored: the chain keeps the compaction item, so a continuation renders from it.
    client = live.client()
    after = client.responses.create(model=MODEL, previous_response_id=final["id"], input="And?")
    assert after.usage is not None
    assert after.usage.input_tokens < _full_tokens(live, HISTORY) / 3
    listed = client.responses.input_items.list(after.id)
    assert "compaction" in [item.type for item in listed.data]


@pytest.mark.parametrize("stream", [False, True])
def test_a_trigger_item_compacts_now(live: Stack, stream: bool) -> None:
    before = live.metric("proxy_compactions_total", trigger="item", outcome="ok")
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "compaction_trigger"},
    ]
    body = {"model": MODEL, "input": items, "tools": TOOLS, "stream": stream, "store": False}
    answer = _post(live, body)
    response = assert_well_formed(_events(answer)) if stream else answer.json()
    assert_response_matches_spec(response)
    assert response["output"][0]["type"] == "compaction"
    assert live.metric("proxy_compactions_total", trigger="item", outcome="ok") == before + 1


def test_a_trigger_that_is_not_last_is_a_400(live: Stack) -> None:
    client = live.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=MODEL,
            input=[{"type": "compaction_trigger"}, {"role": "user", "content": "hi"}],
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "input[0]"


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (
            [{"type": "compaction", "compact_threshold": 10}],
            "context_management[0].compact_threshold",
        ),
        ([{"type": "other"}], "context_management[0].type"),
        ([{"type": "compaction", "threshold": 5000}], "context_management[0].threshold"),
        ({"type": "compaction"}, "context_management"),
    ],
)
def test_bad_context_management_is_a_400(live: Stack, value: Any, param: str) -> None:
    answer = _post(live, {"model": MODEL, "input": "hi", "context_management": value})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_a_failed_pass_is_a_502_before_any_byte(live: Stack) -> None:
    before = live.metric("proxy_compactions_total", trigger="threshold", outcome="failed")
    answer = httpx.post(
        live.base_url + "/responses",
        json={"model": MODEL, "input": HISTORY, "context_management": THRESHOLD, "stream": True},
        headers={"X-Sim-Fault": "cut@3"},
        timeout=30,
    )
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "compaction_failed"
    after = live.metric("proxy_compactions_total", trigger="threshold", outcome="failed")
    assert after == before + 1


def test_a_conversation_keeps_the_compaction_item(live: Stack) -> None:
    client = live.client()
    conversation = client.conversations.create(items=HISTORY)
    first = _post(
        live,
        {
            "model": MODEL,
            "conversation": conversation.id,
            "input": [{"type": "compaction_trigger"}],
        },
    ).json()
    assert first["output"][0]["type"] == "compaction"
    kept = [item.type for item in client.conversations.items.list(conversation.id, order="asc")]
    assert "compaction" in kept
    second = client.responses.create(model=MODEL, conversation=conversation.id, input="And now?")
    assert second.usage is not None
    assert second.usage.input_tokens < _full_tokens(live, HISTORY) / 3  # rendered from it


def test_the_compaction_is_logged_without_content(
    live: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="responses_repair_proxy"):
        _post(
            live,
            {"model": MODEL, "input": HISTORY, "context_management": THRESHOLD, "store": False},
        )
    lines = [r for r in caplog.records if r.getMessage() == "compaction"]
    assert len(lines) == 1
    fields = vars(lines[0])
    assert fields["trigger"] == "threshold"
    assert fields["compacted_tokens"] < fields["prompt_tokens"]
    assert fields["kept_items"] == 2
    assert "note 1" not in repr(fields)  # never content
