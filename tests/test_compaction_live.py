"""`POST /v1/responses/compact` on a real server, called with the real openai SDK: the pass runs
through the simulator, the answer validates against the spec, the compaction item carries the
conversation on (also with `store: false` and through a stored chain), a tampered one is a 400,
an upstream that fails is a 502 `compaction_failed`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request import compaction
from proxy.simulator.prompt import read_prompt
from proxy.store.memory import MemoryStore
from tests.openapi import assert_matches_spec, assert_response_matches_spec
from tests.stateful_support import LONG, MODEL, TOOLS, Stack, stack, until

KEY = ("k1", b"7" * 32)
KEYS = ReasoningKeys((KEY,))

HISTORY: list[Any] = [
    {"role": "user", "content": "Plan the launch of the café app."},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "First, list the features."}],
    },
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21 °C"},
    {"role": "user", "content": "Now write the checklist for Tokyo 東京."},
]


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding) -> Iterator[Stack]:
    with stack(encoding, MemoryStore(), reasoning_keys=(KEY,)) as running:
        yield running


def _sdk(live: Stack, **kwargs: Any) -> OpenAI:
    """The SDK as clients use it. Not the strict mode of `Stack.client`: the SDK types
    `CompactedResponse.output` as output items, whose messages are the assistant's, while the
    spec (`CompactResource.output`: `ItemField`, a `Message` of any role, as its own example
    shows) and the SDK's own doc ("a list of all user messages, followed by a single compaction
    item") have the kept user messages there; the spec check below is the strict one."""
    made = OpenAI(base_url=live.base_url, api_key="key-alice", **kwargs)
    live.clients.append(made)
    return made


def _compacted(client: OpenAI, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """`responses.compact`: the SDK's object and the JSON as sent (the items a client keeps)."""
    answer = client.responses.with_raw_response.compact(**kwargs)
    raw = answer.http_response.json()
    assert_matches_spec(raw, "CompactResource")
    return answer.parse(), raw


def _raw(live: Stack, body: dict[str, Any]) -> dict[str, Any]:
    answer = live.client().post("/responses/compact", body=body, cast_to=object)
    assert isinstance(answer, dict)
    return answer


def test_compact_with_the_sdk_validates_and_keeps_the_user_messages(live: Stack) -> None:
    client = _sdk(live)
    before = live.metric("proxy_compactions_total", trigger="endpoint", outcome="ok")
    compacted, _ = _compacted(client, model=MODEL, input=HISTORY)
    assert compacted.object == "response.compaction"
    kinds = [item.type for item in compacted.output]
    assert kinds == ["message", "message", "compaction"]
    texts = [item.content[0].text for item in compacted.output[:2]]  # type: ignore[union-attr]
    assert texts == [HISTORY[0]["content"], HISTORY[4]["content"]]
    assert compacted.usage.input_tokens > 0
    assert compacted.usage.output_tokens > 0
    assert compacted.usage.output_tokens_details.reasoning_tokens > 0  # the pass reasons
    # The pass: the history, then the instruction as the last message, no tool declared.
    pass_prompt = list(live.completions()[-1].prompt_ids)
    assert "CONTEXT CHECKPOINT COMPACTION" in _text(live, pass_prompt)
    # The sealed summary is the scripted model's: it quotes the history.
    blob = compacted.output[-1].encrypted_content  # type: ignore[union-attr]
    opened = compaction.open_sealed(KEYS, blob, "x")
    assert "sunny, 21 °C" in opened.summary
    assert "Tokyo 東京" in opened.summary
    assert opened.users == ((HISTORY[0]["content"],), (HISTORY[4]["content"],))
    after = live.metric("proxy_compactions_total", trigger="endpoint", outcome="ok")
    assert after == before + 1


def _text(live: Stack, ids: list[int]) -> str:
    encoding = live.app.state.services.deps.encoding
    return str(encoding.decode(ids))


def test_the_compacted_window_continues_with_store_false(
    live: Stack, encoding: HarmonyEncoding
) -> None:
    client = _sdk(live)
    _, raw = _compacted(client, model=MODEL, input=HISTORY)
    window = raw["output"]
    follow = {"role": "user", "content": "And the budget?"}
    full = client.responses.create(model=MODEL, input=[*HISTORY, follow], store=False)
    short = client.responses.create(
        model=MODEL, input=[*window, follow], store=False, tools=TOOLS[:0]
    )
    assert_response_matches_spec(short.model_dump(mode="json", exclude_unset=True))
    assert short.status == "completed"
    assert "And the budget?" in short.output_text
    assert short.usage is not None
    assert full.usage is not None
    # The prompt the model read: the summary, as a developer message, in place of the history.
    prompt = read_prompt(encoding, list(live.completions()[-1].prompt_ids))
    assert prompt.user_text == "And the budget?"
    text = _text(live, list(live.completions()[-1].prompt_ids))
    assert compaction.SUMMARY_HEADING.strip() in text
    assert "First, list the features." not in text  # the assistant's message is summarised
    assert "Plan the launch of the café app." in text  # the kept user message, re-rendered
    # Items before the compaction item are dropped: sending only the compaction item renders
    # the same prompt as the whole window.
    alone = client.responses.create(model=MODEL, input=[window[-1], follow], store=False)
    assert alone.usage is not None
    assert alone.usage.input_tokens == short.usage.input_tokens


def test_compact_a_stored_chain_and_keep_the_item_in_it(live: Stack) -> None:
    client = _sdk(live)
    first = client.responses.create(model=MODEL, input=HISTORY)
    _, raw = _compacted(client, model=MODEL, previous_response_id=first.id)
    window = raw["output"]
    assert [item["type"] for item in window] == ["message", "message", "compaction"]
    # A stored response made from the compacted window keeps the compaction item in its chain.
    second = client.responses.create(
        model=MODEL, input=[*window, {"role": "user", "content": "Go"}]
    )
    third = client.responses.create(model=MODEL, previous_response_id=second.id, input="And then?")
    assert third.status == "completed"
    items = client.responses.input_items.list(third.id)
    assert "compaction" in [item.type for item in items.data]


def test_a_tampered_or_foreign_compaction_item_is_a_400(live: Stack) -> None:
    client = _sdk(live)
    compacted = client.responses.compact(model=MODEL, input=HISTORY)
    blob = compacted.output[-1].encrypted_content  # type: ignore[union-attr]
    altered = blob[:-6] + ("AAAAAA" if not blob.endswith("AAAAAA") else "BBBBBB")
    reasoning_blob = KEYS.seal(["a reasoning text"])  # another kind: not a compaction
    foreign = ReasoningKeys((("k1", b"8" * 32),)).seal_json(2, {"summary": "x", "users": []})
    for bad in (altered, reasoning_blob, foreign, "gAAAAABoXt1v"):
        item = {"type": "compaction", "id": "cmp_1", "encrypted_content": bad}
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model=MODEL, input=[item, {"role": "user", "content": "hi"}])
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["code"] == "invalid_encrypted_content"
        assert error["param"] == "input[0].encrypted_content"
    # Nor does a compaction blob open as reasoning.
    with pytest.raises(openai.BadRequestError):
        client.responses.create(
            model=MODEL,
            input=[
                {"type": "reasoning", "summary": [], "encrypted_content": blob},
                {"role": "user", "content": "hi"},
            ],
        )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "input": HISTORY, "tools": TOOLS}, "tools"),
        ({"input": HISTORY}, "model"),
        ({"model": MODEL}, "input"),
    ],
)
def test_bad_compact_bodies_are_400s(live: Stack, body: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _raw(live, body)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param


def test_an_upstream_failure_is_a_502_compaction_failed(live: Stack) -> None:
    client = _sdk(live, max_retries=0)
    before = live.metric("proxy_compactions_total", trigger="endpoint", outcome="failed")
    with pytest.raises(openai.APIStatusError) as caught:
        client.responses.compact(
            model=MODEL,
            input=HISTORY,
            extra_headers={"X-Sim-Fault": "cut@3"},
        )
    assert caught.value.status_code == 502
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "compaction_failed"
    after = live.metric("proxy_compactions_total", trigger="endpoint", outcome="failed")
    assert after == before + 1


def test_compact_bodies_are_bounded_like_every_body(live: Stack) -> None:
    url = live.base_url + "/responses/compact"
    huge = b'{"model": "m", "input": "' + b"x" * (live.app.state.services.settings.max_body_bytes)
    assert httpx.post(url, content=huge + b'"}', timeout=30).status_code == 413
    plain = httpx.post(url, content=b"{}", headers={"content-type": "text/plain"}, timeout=30)
    assert plain.status_code == 415
    broken = httpx.post(url, content=b"{", headers={"content-type": "application/json"})
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("route", ["compact", "create"])
def test_a_client_gone_during_the_pass_cancels_it_upstream(live: Stack, route: str) -> None:
    before = len(live.completions())
    body: dict[str, Any] = {"model": MODEL, "input": HISTORY}
    if route == "create":
        body["input"] = [*HISTORY, {"type": "compaction_trigger"}]
    path = "/responses/compact" if route == "compact" else "/responses"
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live.base_url + path, json=body, headers=LONG, timeout=0.5)
    passes = until(lambda: live.completions()[before:])
    record = passes[0]
    until(lambda: record.closed_at is not None)
    assert record.disconnected  # the proxy closed the pass's upstream request
    assert not record.completed
    assert len(live.completions()) == before + 1  # and answered nothing after it


def test_the_pass_counts_against_the_stream_limit(encoding: HarmonyEncoding) -> None:
    with stack(encoding, MemoryStore(), reasoning_keys=(KEY,), max_concurrent_streams=1) as one:
        busy = {"model": MODEL, "input": "hi", "stream": True}
        with httpx.stream(
            "POST",
            one.base_url + "/responses",
            json=busy,
            headers={"X-Sim-Fault": "stall@5:3"},
            timeout=30,
        ) as running:
            assert running.status_code == 200
            lines = running.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # in flight
            answer = httpx.post(
                one.base_url + "/responses/compact",
                json={"model": MODEL, "input": HISTORY},
                timeout=30,
            )
            assert answer.status_code == 429
            assert answer.json()["error"]["code"] == "too_many_streams"
