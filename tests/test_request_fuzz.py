"""Validation is total: whatever the body, `prepare_request` returns a prepared request or raises a
4xx `ClientError` — never another exception — and both serialise with orjson."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError
from proxy.harmony import tokens
from proxy.harmony.request.fields import EXTRA_FIELDS, RESPONSES_FIELDS
from proxy.harmony.request.prepare import PreparedRequest, parse_body, prepare_request
from tests.conftest import FIXTURES
from tests.request_clients import CLIENT_BODIES

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: Words the validator branches on, so that random bodies reach deep branches.
WORDS = sorted(
    RESPONSES_FIELDS
    | EXTRA_FIELDS
    | {
        *("type", "role", "content", "text", "id", "status", "phase", "call_id", "name"),
        *("arguments", "output", "namespace", "summary", "encrypted_content", "message"),
        *("function_call", "function_call_output", "reasoning", "item_reference", "user"),
        *("assistant", "system", "developer", "input_text", "output_text", "refusal"),
        *("input_image", "input_file", "reasoning_text", "summary_text", "function"),
        *("web_search", "web_search_preview", "code_interpreter", "file_search", "mcp"),
        *("custom", "tools", "parameters", "description", "strict", "format", "schema"),
        *("json_schema", "json_object", "effort", "low", "medium", "high", "xhigh", "none"),
        *("auto", "required", "functions", "object", "string", "verbosity", "container"),
    }
)

surrogates = st.text(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2
)
texts = st.one_of(st.sampled_from(WORDS), st.text(max_size=12), surrogates)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    texts,
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(texts, children, max_size=5),
    ),
    max_leaves=25,
)
small_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(texts, children, max_size=3),
    ),
    max_leaves=6,
)


def _pool() -> list[dict[str, Any]]:
    bodies = list(CLIENT_BODIES.values())
    for path in sorted((FIXTURES / "trtllm-prompts").glob("d*.json")):
        case = json.loads(path.read_text())
        for step in case.get("steps") or [case]:
            if step.get("request_body") and path.stem != "d26_long_input":
                bodies.append(step["request_body"])
    return bodies


POOL = _pool()


def check(body: Any, encoding: HarmonyEncoding) -> None:
    """The contract under test: a PreparedRequest, or a 4xx ClientError; both serialisable."""
    try:
        prepared: PreparedRequest | ClientError = prepare_request(body, encoding)
    except ClientError as error:
        prepared = error
    if isinstance(prepared, ClientError):
        assert 400 <= prepared.status < 500
        orjson.dumps(prepared.to_body())
        return
    assert isinstance(prepared, PreparedRequest)
    assert prepared.prompt_token_ids[-2:] == [tokens.START, 173781]  # <|start|>assistant
    assert prepared.completion_body["prompt"] == prepared.prompt_token_ids
    orjson.dumps(prepared.completion_body)
    orjson.dumps(prepared.echo)


@FUZZ
@given(body=json_values)
def test_any_json_value(encoding: HarmonyEncoding, body: Any) -> None:
    check(body, encoding)


@FUZZ
@given(
    body=st.fixed_dictionaries(
        {"model": st.one_of(st.just("m"), json_values), "input": json_values},
        optional={
            field: small_values
            for field in sorted(RESPONSES_FIELDS | EXTRA_FIELDS)
            if field not in ("model", "input")
        },
    )
)
def test_bodies_with_responses_fields(encoding: HarmonyEncoding, body: dict[str, Any]) -> None:
    check(body, encoding)


#: Replacement values: mostly plausible ones, so that many mutants stay valid and get rendered.
replacements = st.one_of(
    st.sampled_from(WORDS),
    st.booleans(),
    st.none(),
    st.integers(min_value=-5, max_value=100),
    st.text(max_size=6),
    st.lists(st.sampled_from(WORDS), max_size=2),
    json_values,
)


def _same_kind(value: Any) -> st.SearchStrategy[Any]:
    """Another value of the same JSON kind: keeps many mutants valid (text, numbers, flags)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(min_value=0, max_value=4096)
    if isinstance(value, float):
        return st.floats(min_value=0.0, max_value=1.0)
    if isinstance(value, str):
        specials = st.sampled_from(["<|end|>", "<|start|>assistant", "<|call|>", "\x00", "👋🏽"])
        return st.one_of(st.text(max_size=30), specials, st.sampled_from(WORDS))
    return st.none()


def _mutate(data: st.DataObject, value: Any, depth: int = 0) -> Any:
    """One random edit somewhere inside `value`: replace, delete, add or descend."""
    containers = isinstance(value, dict | list) and len(value) > 0
    # Descending is favoured: edits deep inside keep the rest of the body valid.
    choices = (
        ["descend"] * 4 + ["replace", "delete", "add"] if containers else ["replace", "same_kind"]
    )
    choice = data.draw(st.sampled_from(choices))
    if choice == "same_kind":
        return data.draw(_same_kind(value))
    if choice == "replace" or depth > 12:
        return data.draw(replacements)
    if isinstance(value, dict):
        key = data.draw(st.sampled_from(sorted(value)))
        if choice == "delete":
            return {k: v for k, v in value.items() if k != key}
        if choice == "add":
            return {**value, data.draw(texts): data.draw(replacements)}
        return {**value, key: _mutate(data, value[key], depth + 1)}
    index = data.draw(st.integers(min_value=0, max_value=len(value) - 1))
    if choice == "delete":
        return value[:index] + value[index + 1 :]
    if choice == "add":
        return [*value[:index], data.draw(replacements), *value[index:]]
    return [*value[:index], _mutate(data, value[index], depth + 1), *value[index + 1 :]]


@FUZZ
@given(data=st.data())
def test_near_valid_bodies(encoding: HarmonyEncoding, data: st.DataObject) -> None:
    body = copy.deepcopy(data.draw(st.sampled_from(POOL)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        body = _mutate(data, body)
    check(body, encoding)


@pytest.mark.parametrize("body", POOL, ids=lambda body: str(body.get("input"))[:30])
def test_pool_bodies_survive_a_json_round_trip(encoding: HarmonyEncoding, body: Any) -> None:
    check(parse_body(orjson.dumps(body)), encoding)


@FUZZ
@given(raw=st.binary(max_size=64))
def test_any_bytes(raw: bytes) -> None:
    try:
        parse_body(raw)
    except ClientError as error:
        status = error.status
    else:
        status = 400
    assert status == 400
