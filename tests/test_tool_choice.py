"""`tool_choice` enforced by guided decoding (proxy/harmony/request/guided.py).

Three layers: the constraint each choice puts on the `/v1/completions` request; the simulator's
reading of it, held to the verdicts real xgrammar gives on the same formats; and the effect end
to end — the openai SDK (strict) through the proxy in front of the simulator, whose scripted
model would call `get_weather` unless the constraint steers it elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.errors import ClientError
from proxy.harmony.request.guided import ANALYSIS, FINAL, PREAMBLE, call_header
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.request.text import read_text
from proxy.server.app import create_app
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from proxy.simulator.guided import read_constraint
from tests.guided_cases import FORMATS, SAMPLES, SCHEMA, XGRAMMAR_ACCEPTS
from tests.live import LiveServer, wait_for
from tests.wellformed import assert_well_formed

MODEL = "openai/gpt-oss-120b"


def _tool(name: str, prop: str) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": f"The {name.removeprefix('get_')} for a {prop}.",
        "parameters": {
            "type": "object",
            "properties": {prop: {"type": "string"}},
            "required": [prop],
        },
    }


TOOLS = [_tool("get_weather", "city"), _tool("get_time", "timezone")]
DOCS = {
    "type": "namespace",
    "name": "docs",
    "description": "Documentation search.",
    "tools": [{"type": "function", "name": "search", "description": "Search the docs."}],
}


def _headers(response_format: dict[str, Any]) -> list[str]:
    """The message headers the constraint allows (request/guided.py's shape)."""
    first, later = response_format["format"]["elements"]
    assert later == {
        "type": "triggered_tags",
        "triggers": ["<|start|>"],
        "tags": [{"type": "tag", "begin": "<|start|>assistant", "content": first, "end": ""}],
        "at_least_one": False,
        "stop_after_first": False,
    }
    heads = []
    for head in first["elements"]:
        heads.append(
            head["value"] if head["type"] == "const_string" else head["elements"][0]["value"]
        )
    return heads


def _prepare(encoding: HarmonyEncoding, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "input": "What's the weather in Paris?", "tools": TOOLS, **fields}
    return prepare_request(body, encoding).completion_body


# -- the constraint on the completions request ----------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("none", [ANALYSIS, PREAMBLE, FINAL]),
        (
            "required",
            [ANALYSIS, PREAMBLE, call_header("functions.get_weather"), call_header("docs.search")],
        ),
        ({"type": "function", "name": "search"}, [ANALYSIS, PREAMBLE, call_header("docs.search")]),
        (
            {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [{"type": "namespace", "name": "docs"}],
            },
            [ANALYSIS, PREAMBLE, FINAL, call_header("docs.search")],
        ),
        (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "get_weather"}, {"type": "web_search"}],
            },
            [ANALYSIS, PREAMBLE, call_header("functions.get_weather")],
        ),
    ],
    ids=["none", "required", "named", "allowed_auto", "allowed_required"],
)
def test_each_choice_allows_exactly_its_headers(
    encoding: HarmonyEncoding, choice: Any, expected: list[str]
) -> None:
    tools = [TOOLS[0], DOCS, {"type": "web_search"}]
    body = _prepare(encoding, tools=tools, tool_choice=choice)
    assert _headers(body["response_format"]) == expected
    # the prompt is upstream's whatever the choice: only the sampling constraint differs
    auto = _prepare(encoding, tools=tools)
    assert body["prompt"] == auto["prompt"]
    assert "response_format" not in auto


def test_a_named_function_in_a_namespace(encoding: HarmonyEncoding) -> None:
    tools = [TOOLS[0], DOCS]
    choice = {"type": "function", "name": "search", "namespace": "docs"}
    body = _prepare(encoding, tools=tools, tool_choice=choice)
    assert _headers(body["response_format"])[-1] == call_header("docs.search")


def test_auto_sends_text_format_as_upstream_does(encoding: HarmonyEncoding) -> None:
    text = {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}}
    body = _prepare(encoding, text=text)
    assert body["response_format"] == read_text(text).response_format  # upstream's own tag
    assert body["response_format"]["format"]["type"] == "triggered_tags"


def test_text_format_holds_the_final_answer_under_a_choice(encoding: HarmonyEncoding) -> None:
    text = {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}}
    body = _prepare(encoding, text=text, tool_choice="none")
    first = body["response_format"]["format"]["elements"][0]
    final = first["elements"][2]
    assert final == {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": FINAL},
            {"type": "json_schema", "json_schema": SCHEMA},
        ],
    }
    required = _prepare(encoding, text=text, tool_choice="required")
    assert FINAL not in _headers(required["response_format"])  # no final answer to hold


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"tool_choice": "required", "tools": []}, "tool_choice", "invalid_value"),
        (
            {"tool_choice": {"type": "function", "name": "nope"}},
            "tool_choice.name",
            "invalid_value",
        ),
        ({"tool_choice": {"type": "function"}}, "tool_choice.name", "missing_required_parameter"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type", "unsupported_value"),
        (
            {"tool_choice": {"type": "mcp", "server_label": "x"}},
            "tool_choice.type",
            "unsupported_value",
        ),
        ({"tool_choice": {"type": "banana"}}, "tool_choice.type", "invalid_value"),
        (
            {"tool_choice": {"type": "allowed_tools", "tools": []}},
            "tool_choice.mode",
            "missing_required_parameter",
        ),
        (
            {"tool_choice": {"type": "allowed_tools", "mode": "required", "tools": []}},
            "tool_choice.tools",
            "invalid_value",
        ),
        (
            {
                "tool_choice": {
                    "type": "allowed_tools",
                    "mode": "auto",
                    "tools": [{"type": "namespace", "name": "crm"}],
                }
            },
            "tool_choice.tools[0].name",
            "invalid_value",
        ),
        (
            {"tool_choice": {"type": "allowed_tools", "mode": "auto"}},
            "tool_choice.tools",
            "missing_required_parameter",
        ),
        (
            {"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"name": "f"}]}},
            "tool_choice.tools[0].type",
            "missing_required_parameter",
        ),
        (
            {"tool_choice": {"type": "function", "name": "get_weather", "namespace": "docs"}},
            "tool_choice.name",
            "invalid_value",
        ),
    ],
)
def test_choices_that_cannot_be_honoured_are_400(
    encoding: HarmonyEncoding, fields: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(ClientError) as caught:
        _prepare(encoding, **fields)
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, code)


# -- the simulator reads the constraint as xgrammar does -------------------------------------------


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_simulator_accepts_what_xgrammar_accepts(name: str) -> None:
    constraint = read_constraint(FORMATS[name])
    assert constraint is not None
    accepted = {sample for sample, text in SAMPLES.items() if constraint.accepts(text)}
    assert accepted == XGRAMMAR_ACCEPTS[name]


# -- end to end: the SDK through the proxy in front of the simulator -------------------------------


@pytest.fixture(scope="module")
def client(encoding: HarmonyEncoding) -> Iterator[OpenAI]:
    config = SimulatorConfig(stream_interval=20, token_seconds=0.0, first_token_seconds=0.0)
    with LiveServer(create_simulator_app(config, encoding)) as simulator:
        app = create_app(Settings(upstream_url=simulator.url), encoding)
        with LiveServer(app) as proxy:
            assert wait_for(lambda: app.state.proxy.capability.token_ids, 10)
            yield OpenAI(base_url=proxy.url + "/v1", api_key="x", _strict_response_validation=True)


def _answer(client: OpenAI, **fields: Any) -> dict[str, Any]:
    """A streamed answer, checked against the contract and the spec; its terminal response."""
    body = {"model": MODEL, "input": "What's the weather in Paris?", "tools": TOOLS, **fields}
    events = [
        event.model_dump(mode="json", exclude_unset=True, by_alias=True)  # `schema`, not `schema_`
        for event in client.responses.create(stream=True, **body)
    ]
    return assert_well_formed(events)


def _calls(response: dict[str, Any]) -> list[str]:
    return [item["name"] for item in response["output"] if item["type"] == "function_call"]


def test_auto_lets_the_model_call_what_it_wants(client: OpenAI) -> None:
    assert _calls(_answer(client)) == ["get_weather"]  # the scripted model's own choice


def test_none_steers_the_model_to_answer_in_text(client: OpenAI) -> None:
    response = _answer(client, tool_choice="none")
    assert _calls(response) == []
    assert response["output"][-1]["type"] == "message"
    assert response["output"][-1]["content"][0]["text"]


def test_a_named_function_is_the_one_called(client: OpenAI) -> None:
    response = _answer(client, tool_choice={"type": "function", "name": "get_time"})
    assert _calls(response) == ["get_time"]
    arguments = json.loads(response["output"][-1]["arguments"])
    assert set(arguments) == {"timezone"}


def test_allowed_tools_limit_the_calls(client: OpenAI) -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "get_time"}],
    }
    assert _calls(_answer(client, tool_choice=choice)) == ["get_time"]


def test_required_calls_again_after_a_tool_result(client: OpenAI) -> None:
    history: list[Any] = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 °C."},
    ]
    after = _answer(client, input=history)
    assert _calls(after) == []  # with the tool's answer the model would answer in text…
    assert _calls(_answer(client, input=history, tool_choice="required")) == ["get_weather"]


def test_text_format_and_none_give_the_json_answer(client: OpenAI) -> None:
    text = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}}
    response = _answer(client, tool_choice="none", text=text)
    assert _calls(response) == []
    answer = orjson.loads(response["output"][-1]["content"][0]["text"])
    assert isinstance(answer["answer"], int)


def test_a_choice_that_cannot_be_honoured_is_a_400_before_upstream(client: OpenAI) -> None:
    from openai import BadRequestError

    with pytest.raises(BadRequestError) as caught:
        client.responses.create(
            model=MODEL, input="Hi", tools=TOOLS, tool_choice={"type": "file_search"}
        )
    assert caught.value.body["param"] == "tool_choice.type"  # type: ignore[index]
