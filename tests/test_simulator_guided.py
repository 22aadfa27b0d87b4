"""The simulated engine's guided decoding (proxy/simulator/guided.py): the matcher, the scripted
model steered by it, and replays refused when they break it. What it accepts of the proxy's own
formats is held to real xgrammar's verdicts in tests/test_tool_choice.py. Without a backend
(`guided_decoding=False`) the format is validated, then ignored, and the model breaks it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.request.prepare import prepare_request
from proxy.simulator.config import SimulatorConfig
from proxy.simulator.guided import GuidedError, json_breaking, json_instance, read_constraint
from proxy.simulator.model import ScriptedModel
from proxy.simulator.server import build_parser, config_from_args
from tests.simulator_helpers import FAST, SimThread, replay_headers

MODEL = "openai/gpt-oss-120b"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _constraint(fmt: dict[str, Any]) -> Any:
    constraint = read_constraint({"type": "structural_tag", "format": fmt})
    assert constraint is not None
    return constraint


def _prepared(encoding: HarmonyEncoding, **fields: Any) -> Any:
    body = {"model": MODEL, "input": "Weather in Paris?", "tools": [WEATHER, TIME], **fields}
    return prepare_request(body, encoding)


# -- reading -----------------------------------------------------------------------------------


def test_unconstrained_formats_read_as_none() -> None:
    assert read_constraint(None) is None
    assert read_constraint({"type": "text"}) is None


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        ({"type": "json_object"}, "structural_tag' only"),
        ({"type": "structural_tag", "format": {"type": "regex", "pattern": "a"}}, "'regex'"),
        (
            {"type": "structural_tag", "format": {"type": "tag", "begin": "a", "end": ""}},
            "'content'",
        ),
        ({"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "x"}]}}, "'x'"),
    ],
)
def test_formats_it_cannot_match_are_errors(response_format: dict[str, Any], message: str) -> None:
    with pytest.raises(GuidedError, match=message):
        read_constraint(response_format)


# -- matching ----------------------------------------------------------------------------------


def test_prefixes_of_a_match_are_accepted_as_prefixes_only() -> None:
    constraint = _constraint({"type": "sequence", "elements": [_const("<|a|>"), _const("b")]})
    assert constraint.accepts("<|a|>b")
    assert not constraint.accepts("<|a|>")
    assert constraint.accepts_prefix("<|a|")
    assert constraint.accepts_prefix("<|a|>b")
    assert not constraint.accepts_prefix("<|x")
    assert not constraint.accepts_prefix("<|a|>bc")


def test_a_tag_body_runs_to_the_first_end() -> None:
    tag = {"type": "tag", "begin": "[", "content": {"type": "any_text"}, "end": "]"}
    constraint = _constraint({"type": "sequence", "elements": [tag, _const("!")]})
    assert constraint.accepts("[x]!")
    assert not constraint.accepts("[x]y]!")  # the body ended at the first "]"
    assert constraint.accepts_prefix("[x, y")


def test_triggered_tags_at_least_one_and_stop_after_first() -> None:
    tag = {"type": "tag", "begin": "<f>", "content": _const("1"), "end": "</f>"}
    base = {"type": "triggered_tags", "triggers": ["<f"], "tags": [tag]}
    free = _constraint({**base, "at_least_one": False, "stop_after_first": False})
    assert free.accepts("text only")
    assert free.accepts("a<f>1</f>b<f>1</f>c")
    assert not free.accepts("a<f>2</f>")  # at a trigger, a tag must follow
    one = _constraint({**base, "at_least_one": True, "stop_after_first": True})
    assert not one.accepts("text only")
    assert one.accepts("a<f>1</f>")
    assert not one.accepts("a<f>1</f>more")  # the format ended after the first tag


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"type": "object", "required": ["a"]}, '{"a": 1}', '{"b": 1}'),
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": 1}', '{"a": 1.5}'),
        ({"type": "array", "items": {"type": "string"}}, '["x"]', "[1]"),
        ({"enum": ["red", "blue"]}, '"red"', '"green"'),
        ({"type": ["string", "null"]}, "null", "true"),
        ({"const": 3}, "3", "4"),
    ],
)
def test_json_schema_content_is_checked(schema: dict[str, Any], good: str, bad: str) -> None:
    constraint = _constraint({"type": "json_schema", "json_schema": schema})
    assert constraint.accepts(good)
    assert not constraint.accepts(bad)
    assert constraint.accepts(orjson.dumps(json_instance(schema)).decode())


# -- the scripted model, steered ----------------------------------------------------------------


def _messages(model: ScriptedModel, encoding: HarmonyEncoding, prepared: Any) -> list[Any]:
    constraint = read_constraint(prepared.completion_body.get("response_format"))
    return list(model.complete(prepared.prompt_token_ids, constraint=constraint).messages)


def test_the_model_is_steered_to_an_allowed_answer(encoding: HarmonyEncoding) -> None:
    model = ScriptedModel(encoding)
    free = _messages(model, encoding, _prepared(encoding))
    assert free[-1][1] == "functions.get_weather"  # what it writes unconstrained
    assert _messages(model, encoding, _prepared(encoding, tool_choice="none"))[-1][0] == "final"
    named = _prepared(encoding, tool_choice={"type": "function", "name": "get_time"})
    assert _messages(model, encoding, named)[-1][1] == "functions.get_time"


def test_a_json_answer_is_written_and_never_padded(encoding: HarmonyEncoding) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    prepared = _prepared(
        encoding,
        tools=None,
        text={"format": {"type": "json_schema", "name": "n", "schema": schema}},
    )
    constraint = read_constraint(prepared.completion_body["response_format"])
    model = ScriptedModel(encoding)
    completion = model.complete(prepared.prompt_token_ids, constraint=constraint, min_tokens=300)
    channel, _, text = completion.messages[-1]
    assert (channel, orjson.loads(text)) == ("final", {"n": 1})
    assert len(completion.token_ids) >= 300  # the reasoning took the padding
    assert constraint is not None
    assert constraint.accepts(model.guided_text(completion.token_ids))


def test_no_acceptable_answer_is_an_error(encoding: HarmonyEncoding) -> None:
    prepared = _prepared(encoding)
    unwritable = {"type": "sequence", "elements": [_const("x"), {"type": "any_text"}]}
    with pytest.raises(GuidedError, match="no answer"):
        ScriptedModel(encoding).complete(
            prepared.prompt_token_ids, constraint=_constraint(unwritable)
        )


# -- over HTTP -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST) as running:
        yield running


def test_completions_steer_and_refuse(sim: SimThread, encoding: HarmonyEncoding) -> None:
    body = dict(_prepared(encoding, tool_choice="none").completion_body)
    answer = sim.http.post(
        "/v1/completions", json={**body, "stream": False, "stream_options": None}
    )
    assert answer.status_code == 200
    ids = answer.json()["choices"][0]["token_ids"]
    assert "to=" not in encoding.decode(ids)
    call = encoding.encode(
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city":"P"}<|call|>',
        allowed_special="all",
    )
    refused = sim.http.post(
        "/v1/completions",
        json=body | {"stream": False, "stream_options": None},
        headers=replay_headers(call),
    )
    assert refused.status_code == 400
    assert "break the request's response_format" in refused.text
    cut = sim.http.post(
        "/v1/completions",
        json=body | {"stream": False, "stream_options": None, "max_tokens": 4},
        headers=replay_headers(call),
    )
    assert cut.status_code == 200  # four tokens of an allowed header: a prefix of a match
    bad = {**body, "response_format": {"type": "structural_tag", "format": {"type": "nope"}}}
    assert sim.http.post("/v1/completions", json=bad).status_code == 400


# -- without a guided-decoding backend: accepted, ignored, and broken on purpose ---------------


def _stock_messages(encoding: HarmonyEncoding, **fields: Any) -> list[Any]:
    prepared = _prepared(encoding, **fields)
    constraint = read_constraint(prepared.completion_body.get("response_format"))
    completion = ScriptedModel(encoding).complete(
        prepared.prompt_token_ids, constraint=constraint, enforced=False
    )
    assert constraint is None or not constraint.accepts(
        ScriptedModel(encoding).guided_text(completion.token_ids)
    ), "the unguided model wrote what the constraint allows"
    return list(completion.messages)


def test_the_unguided_model_writes_what_each_constraint_forbids(encoding: HarmonyEncoding) -> None:
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "Sunny."},
    ]
    # a call under "none", also when its own answer would have been text
    assert _stock_messages(encoding, tool_choice="none")[-1][1] == "functions.get_weather"
    after = _stock_messages(encoding, tool_choice="none", input=history)
    assert after[-1][1] is not None
    # plain text under "required" and a named function; another function than the named one
    assert _stock_messages(encoding, tool_choice="required")[-1][:2] == ("final", None)
    named = _stock_messages(encoding, tool_choice={"type": "function", "name": "get_time"})
    assert named[-1][1] == "functions.get_weather"
    # JSON of another shape where a schema is asked, prose where any object is
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": schema}}
    channel, _, text = _stock_messages(encoding, tools=None, text=fmt)[-1]
    assert channel == "final"
    assert orjson.loads(text) == {"unexpected": True}
    channel, _, text = _stock_messages(
        encoding, tools=None, text={"format": {"type": "json_object"}}
    )[-1]
    assert channel == "final"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)
    # unconstrained, it is the same model as ever
    free = ScriptedModel(encoding).complete(_prepared(encoding).prompt_token_ids, enforced=False)
    assert free.messages[-1][1] == "functions.get_weather"


@pytest.mark.parametrize(
    ("schema", "breaking"),
    [
        ({"type": "object", "required": ["n"]}, {"unexpected": True}),
        ({"type": "object"}, []),
        ({"type": ["object", "array"]}, "unexpected"),
        ({"type": ["object", "array", "string"]}, None),
        ({}, {"unexpected": True}),  # nothing breaks an empty schema: the fallback
    ],
)
def test_json_breaking_finds_a_value_the_schema_rejects(schema: Any, breaking: Any) -> None:
    assert json_breaking(schema) == breaking


def test_a_constant_constraint_is_written_only_when_enforced(encoding: HarmonyEncoding) -> None:
    """The proxy's guided probe: the one text a constant format allows, written by a masked
    engine, never by the model on its own."""
    probe = [200006, 1428, 200008, 13225, 200007, 200006, 173781]
    constant = _constraint(_const("zebra quartz"))
    assert constant.forced_text() == "zebra quartz"
    model = ScriptedModel(encoding)
    forced = model.complete(probe, constraint=constant)
    assert model.guided_text(forced.token_ids) == "zebra quartz"
    free = model.complete(probe, constraint=constant, enforced=False)
    assert not model.guided_text(free.token_ids).startswith("zebra")
    sequence = _constraint({"type": "sequence", "elements": [_const("a"), _const("<|end|>")]})
    assert sequence.forced_text() == "a<|end|>"
    assert _constraint({"type": "any_text"}).forced_text() is None


@pytest.fixture(scope="module")
def stock(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    config = SimulatorConfig(first_token_seconds=0.0, token_seconds=0.0, guided_decoding=False)
    with SimThread(encoding, config) as running:
        yield running


def test_a_stock_server_accepts_and_ignores_response_format(
    stock: SimThread, encoding: HarmonyEncoding
) -> None:
    body = dict(_prepared(encoding, tool_choice="none").completion_body)
    request = {**body, "stream": False, "stream_options": None}
    answer = stock.http.post("/v1/completions", json=request)
    assert answer.status_code == 200
    assert "to=functions.get_weather" in encoding.decode(answer.json()["choices"][0]["token_ids"])
    call = encoding.encode(
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city":"P"}<|call|>',
        allowed_special="all",
    )
    replayed = stock.http.post("/v1/completions", json=request, headers=replay_headers(call))
    assert replayed.status_code == 200  # nothing checks what the engine does not enforce
    assert replayed.json()["choices"][0]["token_ids"] == call
    bad = {**request, "response_format": {"type": "structural_tag", "format": {"type": "nope"}}}
    assert stock.http.post("/v1/completions", json=bad).status_code == 400  # still validated


def test_the_simulate_command_models_a_stock_server() -> None:
    args = build_parser().parse_args(["--no-guided-decoding"])
    assert config_from_args(args).guided_decoding is False
    assert config_from_args(build_parser().parse_args([])).guided_decoding is True
