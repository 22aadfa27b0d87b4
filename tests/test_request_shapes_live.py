"""Unknown keys inside request objects, end to end: the proxy on real uvicorn in front of the
simulator, raw HTTP and the strict `openai` SDK. A 400 before anything reaches upstream, with
the key quoted at most 200 characters long — never reflected back — on every route that reads
a Responses body; and a response object that echoes only what the spec defines."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.server.app import create_app
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from proxy.store.memory import MemoryStore
from tests.live import LiveServer, wait_for
from tests.openapi import assert_response_matches_spec

MODEL = "openai/gpt-oss-120b"
HUGE = "k" * 50_000


@pytest.fixture(scope="module")
def proxy(encoding: HarmonyEncoding) -> Iterator[tuple[str, list[Any]]]:
    """The proxy's URL, and the requests upstream received."""
    config = SimulatorConfig(token_seconds=0.0, first_token_seconds=0.0)
    simulator_app = create_simulator_app(config, encoding)
    with LiveServer(simulator_app) as simulator:
        app = create_app(Settings(upstream_url=simulator.url), encoding, store=MemoryStore())
        with LiveServer(app) as running:
            assert wait_for(lambda: app.state.proxy.capability.token_ids, 10)
            yield running.url, simulator_app.state.simulator.requests


def _refused(answer: httpx.Response, param_start: str) -> dict[str, Any]:
    assert answer.status_code == 400, answer.text[:300]
    assert answer.headers["content-type"] == "application/json"
    assert len(answer.content) < 1_000  # the 50 KB key is not reflected
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == "unknown_parameter"
    assert error["param"].startswith(param_start)
    assert len(error["param"]) <= 201
    return error


@pytest.mark.parametrize("stream", [False, True])
def test_a_huge_unknown_key_is_a_small_400_before_upstream(
    proxy: tuple[str, list[Any]], stream: bool
) -> None:
    url, upstream = proxy
    before = len([r for r in upstream if r.path == "/v1/completions"])
    for field, value, param in (
        ("reasoning", {"effort": "low", HUGE: 1}, "reasoning.kkk"),
        ("text", {"format": {"type": "text", HUGE: 1}}, "text.format.kkk"),
        ("tool_choice", {"type": "function", "name": "f", HUGE: 1}, "tool_choice.kkk"),
        ("stream_options", {HUGE: 1}, "stream_options.kkk"),
        (
            "input",
            [{"role": "user", "content": [{"type": "input_text", "text": "x", HUGE: 1}]}],
            "input[0].content[0].kkk",
        ),
        ("tools", [{"type": "function", "name": "f", HUGE: 1}], "tools[0].kkk"),
    ):
        body = {"model": MODEL, "input": "Hi", "stream": stream, field: value}
        answer = httpx.post(url + "/v1/responses", json=body, timeout=30)
        error = _refused(answer, param)
        assert error["message"].startswith(f"Unknown parameter: '{error['param']}'")
    assert len([r for r in upstream if r.path == "/v1/completions"]) == before
    # The next request is served as ever.
    served = httpx.post(url + "/v1/responses", json={"model": MODEL, "input": "Hi"}, timeout=30)
    assert served.status_code == 200


def test_input_tokens_and_conversations_check_the_same_way(proxy: tuple[str, list[Any]]) -> None:
    url, _ = proxy
    body = {"model": MODEL, "input": "Hi", "reasoning": {HUGE: 1}}
    _refused(httpx.post(url + "/v1/responses/input_tokens", json=body, timeout=30), "reasoning.k")
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    created = httpx.post(url + "/v1/conversations", json={"items": [item]}, timeout=30)
    assert created.status_code == 200
    key = created.json()["id"]
    bad = {**item, "content": [{"type": "input_text", "text": "x", HUGE: 1}]}
    for path in ("/v1/conversations", f"/v1/conversations/{key}/items"):
        answer = httpx.post(url + path, json={"items": [bad]}, timeout=30)
        _refused(answer, "items[0].content[0].kkk")
    _refused(httpx.post(url + "/v1/conversations", json={HUGE: 1}, timeout=30), "kkk")
    with_conversation = {"model": MODEL, "input": "Hi", "conversation": {"id": key, HUGE: 1}}
    _refused(httpx.post(url + "/v1/responses", json=with_conversation, timeout=30), "conver")


def test_the_sdk_gets_only_the_specs_fields_back(proxy: tuple[str, list[Any]]) -> None:
    url, _ = proxy
    tools: Any = [
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "async": False},
        {"type": "web_search", "user_location": {"type": "approximate", "city": "Paris"}},
    ]
    with OpenAI(base_url=url + "/v1", api_key="x", _strict_response_validation=True) as sdk:
        response = sdk.responses.create(
            model=MODEL,
            input="Hi",
            tools=tools,
            reasoning={"effort": "low", "summary": "auto"},
            text={"format": {"type": "text"}, "verbosity": "medium"},
            extra_body={"prompt_cache_options": {"ttl": "30m", "prewarm": True}},
        )
        raw = sdk.responses.with_raw_response.retrieve(response.id).http_response.content
    echoed = orjson.loads(raw)
    assert_response_matches_spec(echoed)
    assert echoed["tools"][0] == {
        "name": "f",
        "parameters": {"type": "object"},
        "strict": None,
        "type": "function",
        "allowed_callers": None,
        "description": None,
        "output_schema": None,
    }
    assert echoed["tools"][1]["user_location"] == {"type": "approximate", "city": "Paris"}
    assert "prompt_cache_options" not in echoed
