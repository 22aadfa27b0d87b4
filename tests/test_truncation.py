"""`truncation` and `max_prompt_tokens` (proxy/harmony/request/fit.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from openai_harmony import Conversation, HarmonyEncoding, Message, Role

from proxy.config.settings import Settings
from proxy.errors import ClientError
from proxy.harmony.request.fit import fit_prompt
from proxy.harmony.request.items import input_messages
from proxy.harmony.request.prefix import system_message
from proxy.harmony.request.prepare import prepare_request
from proxy.server.app import create_app
from proxy.simulator import simulator_state
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from tests.live import LiveServer, wait_for
from tests.openapi import spec_errors
from tests.request_clients import CODEX_AFTER_TOOL

MODEL = "openai/gpt-oss-120b"


def _turns(count: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for number in range(count):
        items.append({"role": "user", "content": f"Question {number}: " + "why? " * 40})
        items.append({"role": "assistant", "content": f"Answer {number}: " + "because. " * 40})
    items.append({"role": "user", "content": "And finally?"})
    return items


def _prompt(encoding: HarmonyEncoding, items: Any, **fields: Any) -> list[int]:
    """The prompt with no limit: what a client sending only these items gets."""
    return prepare_request({"model": MODEL, "input": items, **fields}, encoding).prompt_token_ids


def _prepared(encoding: HarmonyEncoding, items: Any, limit: int, **fields: Any) -> list[int]:
    body = {"model": MODEL, "input": items, **fields}
    return prepare_request(body, encoding, max_prompt_tokens=limit).prompt_token_ids


def test_message_lengths_add_up(encoding: HarmonyEncoding) -> None:
    """What the single re-render relies on: the prompt is as long as its pieces."""
    prepared = prepare_request(CODEX_AFTER_TOOL, encoding)
    inputs = input_messages(CODEX_AFTER_TOOL["input"])
    pieces = [len(encoding.render_conversation(Conversation.from_messages([m]))) for m in inputs]
    without = prepare_request({**CODEX_AFTER_TOOL, "input": []}, encoding).prompt_token_ids
    assert len(prepared.prompt_token_ids) == len(without) + sum(pieces)


def test_a_prompt_that_fits_is_left_alone(encoding: HarmonyEncoding) -> None:
    items = _turns(3)
    full = _prompt(encoding, items)
    assert _prepared(encoding, items, len(full) + 1, truncation="auto") == full
    assert _prepared(encoding, items, len(full) + 1) == full


def test_disabled_is_a_400_naming_the_sizes(encoding: HarmonyEncoding) -> None:
    items = _turns(3)
    size = len(_prompt(encoding, items))
    with pytest.raises(ClientError) as caught:
        _prepared(encoding, items, size + 100, max_output_tokens=200)
    error = caught.value
    assert (error.status, error.param, error.code) == (400, "input", "context_length_exceeded")
    for figure in (f"{size:,}", "200", f"{size + 200:,}", f"{size + 100:,}"):
        assert figure in error.message
    assert "truncation" in error.message


def test_auto_drops_the_oldest_items_until_it_fits(encoding: HarmonyEncoding) -> None:
    items = [{"role": "developer", "content": "Be brief."}, *_turns(4)]
    full = len(_prompt(encoding, items))
    limit = full - 250  # about two items too long
    prompt = _prepared(encoding, items, limit, truncation="auto", max_output_tokens=50)
    assert len(prompt) + 50 <= limit
    # exactly the prompt of the newest items that fit, the developer message kept
    for dropped in range(1, len(items)):
        kept = [items[0], *items[1 + dropped :]]
        if len(_prompt(encoding, kept)) + 50 <= limit:
            assert prompt == _prompt(encoding, kept)
            assert dropped >= 2
            break
    else:
        pytest.fail("nothing fits")


def test_a_tool_output_goes_with_its_call(encoding: HarmonyEncoding) -> None:
    call = {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"}
    items = [
        {"role": "user", "content": "Look it up. " * 60},
        call,
        {"type": "function_call_output", "call_id": "c1", "output": "found " * 60},
        {"role": "user", "content": "Thanks, now summarise."},
    ]
    tools = [{"type": "function", "name": "f"}]
    tail = _prompt(encoding, items[3:], tools=tools)
    # one token short of keeping the call: the output alone would fit, but it goes with its call
    limit = len(_prompt(encoding, items[1:], tools=tools))
    prompt = _prepared(encoding, items, limit, truncation="auto", tools=tools)
    assert prompt == tail


def test_auto_is_a_400_when_even_the_last_item_does_not_fit(encoding: HarmonyEncoding) -> None:
    items = _turns(2)
    last = len(_prompt(encoding, items[-1:]))
    with pytest.raises(ClientError) as caught:
        _prepared(encoding, items, last - 1, truncation="auto")
    assert caught.value.code == "context_length_exceeded"
    assert f"{last:,}" in caught.value.message


def test_truncation_renders_twice_not_once_per_dropped_item(encoding: HarmonyEncoding) -> None:
    inputs = [Message.from_role_and_content(Role.USER, "word " * 50) for _ in range(40)]
    head = [system_message(None)]
    calls: list[int] = []

    def render(messages: Sequence[Message]) -> list[int]:
        calls.append(len(messages))
        conversation = Conversation.from_messages([*head, *messages])
        return encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)

    full = len(render(inputs))
    calls.clear()
    prompt = fit_prompt(
        encoding, inputs, render, context=full // 4, max_output_tokens=10, truncation="auto"
    )
    assert len(prompt) + 10 <= full // 4
    assert len(calls) == 2  # the whole conversation, then the kept part: 30 items dropped
    assert calls[1] < 40


# -- through the proxy ----------------------------------------------------------------------------


def test_the_setting_reaches_the_request_end_to_end(encoding: HarmonyEncoding) -> None:
    config = SimulatorConfig(stream_interval=20, token_seconds=0.0, first_token_seconds=0.0)
    simulator_app = create_simulator_app(config, encoding)
    items = _turns(6)
    limit = len(_prompt(encoding, items)) // 2
    with LiveServer(simulator_app) as simulator:
        app = create_app(Settings(upstream_url=simulator.url, max_prompt_tokens=limit), encoding)
        with LiveServer(app) as proxy:
            assert wait_for(lambda: app.state.proxy.capability.token_ids, 10)
            body = {"model": MODEL, "input": items, "max_output_tokens": 64}
            refused = httpx.post(proxy.url + "/v1/responses", json=body, timeout=20)
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "context_length_exceeded"
            assert spec_errors(refused.json(), "ErrorResponse") == []
            served = httpx.post(
                proxy.url + "/v1/responses", json={**body, "truncation": "auto"}, timeout=20
            )
            assert served.status_code == 200, served.text
            assert served.json()["truncation"] == "auto"
            prompt = simulator_state(simulator_app).requests[-1].prompt_ids
            assert len(prompt) + 64 <= limit
            assert served.json()["usage"]["input_tokens"] == len(prompt)


def test_a_cut_is_checked_by_rendering_it(encoding: HarmonyEncoding) -> None:
    """Were message lengths ever not additive, the next cut is tried, rendered and checked."""
    inputs = [Message.from_role_and_content(Role.USER, f"item {n} " * 20) for n in range(6)]
    calls: list[int] = []

    def render(messages: Sequence[Message]) -> list[int]:
        calls.append(len(messages))
        conversation = Conversation.from_messages(list(messages))
        ids = encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)
        return ids + [0] * 40 * (len(messages) == 2)  # two kept items render 40 tokens longer

    lengths = len(render(inputs[4:5]))
    calls.clear()
    context = 2 * lengths + 10  # room for two items by their lengths
    prompt = fit_prompt(
        encoding, inputs, render, context=context, max_output_tokens=5, truncation="auto"
    )
    assert calls == [6, 2, 1]  # the whole, the first cut (too long after all), the next
    assert len(prompt) + 5 <= context
