"""The output held to `tool_choice` and `text.format` after the fact (proxy/harmony/constraint.py):
what each request demands, the check on its own, and the core that stops at the first violation
— at every chunking, and on random (malformed) output, never ending `completed` with a broken
constraint."""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError
from proxy.harmony.constraint import (
    CONSTRAINT_KINDS,
    CONSTRAINT_VIOLATED,
    ConstraintCheck,
    OutputConstraint,
    Violation,
    check_schema,
)
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.response import CountingIds
from proxy.harmony.schema import PATTERN_SECONDS
from proxy.harmony.stream.repair import ResponseStream, StreamStateError
from tests.harmony import MODEL, chunks_of, context, engine_outputs, ids_of
from tests.sdk import validate_events
from tests.wellformed import assert_well_formed

F = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
G = {"type": "function", "name": "g", "parameters": {"type": "object", "properties": {}}}
DOCS = {
    "type": "namespace",
    "name": "docs",
    "description": "Docs.",
    "tools": [{"type": "function", "name": "search", "description": "Search."}],
}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
JSON_SCHEMA = {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}}
JSON_OBJECT = {"format": {"type": "json_object"}}

CHOICES: dict[str, Any] = {
    "none": "none",
    "required": "required",
    "named_f": {"type": "function", "name": "f"},
    "allowed_auto_g": {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "g"}],
    },
    "allowed_required_docs": {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "namespace", "name": "docs"}],
    },
}

ANALYSIS = "<|channel|>analysis<|message|>Thinking.<|end|>"
CALL_F = "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}"
CALL_G = "<|start|>assistant<|channel|>commentary to=functions.g <|constrain|>json<|message|>{}"
CALL_DOCS = "<|start|>assistant<|channel|>commentary to=docs.search <|constrain|>json<|message|>{}"
PREAMBLE = "<|start|>assistant<|channel|>commentary<|message|>Looking.<|end|>"


def _final(text: str) -> str:
    return f"<|start|>assistant<|channel|>final<|message|>{text}<|return|>"


def _constraint(encoding: HarmonyEncoding, **fields: Any) -> OutputConstraint | None:
    body = {"model": MODEL, "input": "Hi", "tools": [F, G, DOCS], **fields}
    return prepare_request(body, encoding).constraint


# -- what each request demands -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "final", "recipients", "required"),
    [
        ("none", "tool_choice_none", True, set(), False),
        (
            "required",
            "tool_choice_required",
            False,
            {"functions.f", "functions.g", "docs.search"},
            True,
        ),
        ("named_f", "tool_choice_function", False, {"functions.f"}, True),
        ("allowed_auto_g", "tool_choice_allowed_tools", True, {"functions.g"}, False),
        ("allowed_required_docs", "tool_choice_allowed_tools", False, {"docs.search"}, True),
    ],
)
def test_each_choice_demands_its_calls(
    encoding: HarmonyEncoding,
    name: str,
    kind: str,
    final: bool,
    recipients: set[str],
    required: bool,
) -> None:
    constraint = _constraint(encoding, tool_choice=CHOICES[name])
    assert constraint is not None
    assert (constraint.kind, constraint.param) == (kind, "tool_choice")
    assert constraint.final_allowed is final
    assert constraint.recipients == recipients
    assert constraint.call_required is required
    assert constraint.text_kind is None
    assert kind in CONSTRAINT_KINDS
    assert constraint.describe() == constraint.choice
    assert constraint.describe().startswith("tool_choice ")


def test_auto_alone_demands_nothing_and_text_format_its_json(encoding: HarmonyEncoding) -> None:
    assert _constraint(encoding) is None
    assert _constraint(encoding, tool_choice="auto", text={"format": {"type": "text"}}) is None
    schema = _constraint(encoding, text=JSON_SCHEMA)
    assert schema is not None
    assert (schema.kind, schema.param, schema.schema) == ("json_schema", "text.format", SCHEMA)
    assert schema.describe() == "text.format json_schema"
    anything = _constraint(encoding, text=JSON_OBJECT)
    assert anything is not None
    assert (anything.kind, anything.schema) == ("json_object", {"type": "object"})
    both = _constraint(encoding, tool_choice="none", text=JSON_SCHEMA)
    assert both is not None
    assert (both.kind, both.param) == ("tool_choice_none", "tool_choice")  # the first named
    assert both.describe() == "tool_choice 'none' and text.format json_schema"


def test_a_schema_that_is_no_json_schema_is_a_400(encoding: HarmonyEncoding) -> None:
    bad = {"format": {"type": "json_schema", "name": "n", "schema": {"type": "integr"}}}
    with pytest.raises(ClientError) as caught:
        _constraint(encoding, text=bad)
    error = caught.value
    assert (error.status, error.param, error.code) == (400, "text.format.schema", "invalid_value")
    assert "not a valid JSON Schema" in error.message
    assert check_schema({"type": "object", "minProperties": -1}) is not None
    assert check_schema(SCHEMA) is None


def test_the_draft_a_schema_names_is_the_one_applied() -> None:
    # Draft 7 reads an `items` list as a tuple; Draft 2020-12 (the default) forbids the list.
    tuple_schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": [{"type": "integer"}],
    }
    assert check_schema(tuple_schema) is None
    assert check_schema({k: v for k, v in tuple_schema.items() if k != "$schema"}) is not None
    check = ConstraintCheck(OutputConstraint(text_kind="json_schema", schema=tuple_schema))
    assert check.final("[1]") is None
    assert check.final('["x"]') is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unknown $schema is read as 2020-12, without a warning
        odd = {"$schema": "https://example.com/mine", "type": "integer"}
        assert check_schema(odd) is None
        assert (
            ConstraintCheck(OutputConstraint(text_kind="json_schema", schema=odd)).final("1")
            is None
        )


# -- the check on its own ------------------------------------------------------------------------


def test_headers_are_held_to_the_choice(encoding: HarmonyEncoding) -> None:
    none = ConstraintCheck(_constraint(encoding, tool_choice="none"))  # type: ignore[arg-type]
    assert none.header("analysis", None) is None
    assert none.header("commentary", None) is None  # a preamble
    assert none.header("final", None) is None
    violation = none.header("commentary", "functions.f")
    assert violation is not None
    assert violation.kind == "tool_choice_none"
    assert "'functions.f'" in violation.message
    assert none.header("analysis", "python") is not None  # a built-in tool is a call too
    named = ConstraintCheck(_constraint(encoding, tool_choice=CHOICES["named_f"]))  # type: ignore[arg-type]
    assert named.header("commentary", "functions.g") is not None
    assert named.header("final", None) is not None  # text where a call is required
    assert named.header(None, None) is not None  # a message without a channel is the answer
    assert named.end("stop") is not None
    assert named.header("commentary", "functions.f") is None
    assert named.called
    assert named.end("stop") is None


def test_the_end_is_checked_only_when_generation_stopped(encoding: HarmonyEncoding) -> None:
    required = _constraint(encoding, tool_choice="required")
    assert required is not None
    check = ConstraintCheck(required)
    violation = check.end("stop")
    assert violation is not None
    assert "ended without the function call" in violation.message
    assert check.end("length") is None  # cut: any prefix of a match is allowed
    assert ConstraintCheck(_constraint(encoding, tool_choice="none")).end("stop") is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"n": 3}', None),
        (' \n{"n": 3}\n', None),
        ('{"n": "3"}', "at $.n: '3' is not of type 'integer'"),
        ('{"m": 3}', "'n' is a required property"),
        ("[]", "is not of type 'object'"),
        ("Three.", "is not JSON"),
        ('{"n": 3} and more', "is not JSON"),
        ('{"n": NaN}', "is not JSON"),
        ("", "is not JSON"),
    ],
)
def test_final_answers_are_held_to_the_schema(text: str, problem: str | None) -> None:
    check = ConstraintCheck(OutputConstraint(text_kind="json_schema", schema=SCHEMA))
    violation = check.final(text)
    if problem is None:
        assert violation is None
    else:
        assert violation is not None
        assert violation.kind == "json_schema"
        assert problem in violation.message


@pytest.mark.parametrize("depth", [900, 100_000])
def test_json_nested_past_the_decoders_limit_is_a_violation_not_a_crash(depth: int) -> None:
    recursive = {"type": "array", "items": {"$ref": "#"}}
    check = ConstraintCheck(OutputConstraint(text_kind="json_schema", schema=recursive))
    violation = check.final("[" * depth + "]" * depth)
    assert violation is not None
    assert "nested too deeply" in violation.message


def test_a_schema_that_cannot_be_resolved_is_a_violation_not_a_crash() -> None:
    schema = {"$ref": "https://example.com/nowhere.json"}
    check = ConstraintCheck(OutputConstraint(text_kind="json_schema", schema=schema))
    violation = check.final("{}")
    assert violation is not None
    assert "cannot be applied" in violation.message


EVIL = "^(a|aa)+$"  # exponential backtracking on "aaa…a!", in re and in regex alike


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "pattern": EVIL}}},
        {"type": "object", "patternProperties": {EVIL: {"type": "integer"}}},
    ],
    ids=["pattern", "patternProperties"],
)
def test_a_client_pattern_that_backtracks_is_cut_off_as_a_violation(schema: Any) -> None:
    check = ConstraintCheck(OutputConstraint(text_kind="json_schema", schema=schema))
    evil = "a" * 40 + "!"  # minutes for re.search; the search gives up after PATTERN_SECONDS
    started = time.perf_counter()
    violation = check.final(json.dumps({evil: 1, "a": evil}))
    assert time.perf_counter() - started < 20 * PATTERN_SECONDS
    assert violation is not None
    assert "takes too long to check" in violation.message


def test_patterns_still_decide_matches() -> None:
    schema = {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^[a-z]+-[0-9]{3}$"}},
        "patternProperties": {"^x-": {"type": "integer"}},
    }
    check = ConstraintCheck(OutputConstraint(text_kind="json_schema", schema=schema))
    assert check.final('{"id": "abc-123", "x-n": 1}') is None
    wrong = check.final('{"id": "abc-12"}')
    assert wrong is not None
    assert "does not match" in wrong.message
    assert check.final('{"x-n": "one"}') is not None  # the patterned property's own schema


def test_a_pattern_that_is_no_regex_is_a_violation_not_a_crash() -> None:
    schema = {"type": "string", "pattern": "(unclosed"}
    violation = ConstraintCheck(OutputConstraint(text_kind="json_schema", schema=schema)).final(
        '"x"'
    )
    assert violation is not None
    assert "is no regex" in violation.message


# -- the core stops at the first violation -------------------------------------------------------

CASES = [
    # (tool_choice, text, output, violated kind or None, where)
    ("none", None, ANALYSIS + CALL_F + "<|call|>", "tool_choice_none", "header"),
    ("none", None, ANALYSIS + PREAMBLE + _final("Hello."), None, ""),
    ("required", None, ANALYSIS + _final("Hello."), "tool_choice_required", "header"),
    ("required", None, ANALYSIS + PREAMBLE, "tool_choice_required", "end"),
    ("required", None, ANALYSIS + CALL_G + "<|call|>", None, ""),
    ("named_f", None, ANALYSIS + CALL_G + "<|call|>", "tool_choice_function", "header"),
    ("named_f", None, ANALYSIS + CALL_F + "<|call|>", None, ""),
    ("allowed_auto_g", None, ANALYSIS + CALL_F + "<|call|>", "tool_choice_allowed_tools", "header"),
    ("allowed_auto_g", None, ANALYSIS + _final("Fine."), None, ""),
    ("allowed_required_docs", None, ANALYSIS + CALL_DOCS + "<|call|>", None, ""),
    ("auto", JSON_SCHEMA, ANALYSIS + _final('{"n": 1}'), None, ""),
    ("auto", JSON_SCHEMA, ANALYSIS + _final('{"n": "one"}'), "json_schema", "final"),
    ("auto", JSON_OBJECT, ANALYSIS + _final("one"), "json_object", "final"),
    ("auto", JSON_OBJECT, ANALYSIS + CALL_F + "<|call|>", None, ""),  # calls stay free
    ("none", JSON_SCHEMA, ANALYSIS + _final("{}"), "json_schema", "final"),
]


def _run_checked(
    encoding: HarmonyEncoding,
    constraint: OutputConstraint | None,
    chunks: list[list[int]],
    finish: str = "stop",
) -> tuple[list[dict[str, Any]], ResponseStream]:
    """The shell's protocol (exchange.py): feed until a violation, then `fail`."""
    stream = ResponseStream(encoding, context(constraint=constraint), CountingIds())
    events = stream.start()
    for chunk in chunks:
        events += stream.feed(chunk)
        if stream.violation is not None:
            break
    else:
        events += stream.finish(finish)
    if stream.violation is not None:
        events += stream.fail(CONSTRAINT_VIOLATED, stream.violation.message)
    return events, stream


@pytest.mark.parametrize("size", [1, 2, 3, 7, 20, 10_000])
@pytest.mark.parametrize(("choice", "text", "output", "kind", "where"), CASES)
def test_the_core_stops_at_the_first_violation(
    encoding: HarmonyEncoding,
    size: int,
    choice: str,
    text: dict[str, Any] | None,
    output: str,
    kind: str | None,
    where: str,
) -> None:
    constraint = _constraint(encoding, tool_choice=CHOICES.get(choice, choice), text=text)
    ids = ids_of(encoding, output)
    events, stream = _run_checked(encoding, constraint, chunks_of(ids, [size]))
    response = assert_well_formed(events)
    validate_events(events)
    if kind is None:
        assert stream.violation is None
        assert response["status"] == "completed"
        return
    assert stream.violation is not None
    assert stream.violation.kind == kind
    assert response["status"] == "failed"
    assert events[-2]["type"] == "error"
    assert events[-2]["code"] == CONSTRAINT_VIOLATED
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    if where == "header":  # the forbidden message was never announced, nothing after it parsed
        assert added == ["reasoning"]
        assert stream.record().output_tokens < len(ids) or size == 1
    if where == "final":  # the answer was streamed, then the response failed
        assert response["output"][-1]["type"] == "message"


def test_after_a_violation_only_fail_or_cancel(encoding: HarmonyEncoding) -> None:
    constraint = _constraint(encoding, tool_choice="none")
    stream = ResponseStream(encoding, context(constraint=constraint), CountingIds())
    stream.start()
    stream.feed(ids_of(encoding, ANALYSIS + CALL_F))
    assert stream.violation is not None
    assert not stream.ended
    with pytest.raises(StreamStateError, match="feed\\(\\) called in phase 'violated'"):
        stream.feed([1])
    with pytest.raises(StreamStateError, match="finish\\(\\) called in phase 'violated'"):
        stream.finish("stop")
    events = stream.cancel()
    assert events[-1]["response"]["status"] == "cancelled"


def test_a_cut_answer_is_incomplete_not_checked(encoding: HarmonyEncoding) -> None:
    constraint = _constraint(encoding, text=JSON_SCHEMA)
    ids = ids_of(encoding, ANALYSIS + '<|start|>assistant<|channel|>final<|message|>{"n": ')
    events, stream = _run_checked(encoding, constraint, [ids], finish="length")
    assert stream.violation is None
    assert assert_well_formed(events)["status"] == "incomplete"


def test_a_json_answer_without_its_end_token_is_checked_at_finish(
    encoding: HarmonyEncoding,
) -> None:
    constraint = _constraint(encoding, text=JSON_SCHEMA)
    ids = ids_of(encoding, ANALYSIS + "<|start|>assistant<|channel|>final<|message|>nope")
    events, stream = _run_checked(encoding, constraint, [ids])  # the stop token was cut
    assert stream.violation is not None
    assert assert_well_formed(events)["status"] == "failed"
    events, stream = _run_checked(
        encoding,
        constraint,
        [ids_of(encoding, ANALYSIS + '<|start|>assistant<|channel|>final<|message|>{"n": 2}')],
    )
    assert assert_well_formed(events)["status"] == "completed"


# -- any output, any chunking: never completed with a broken constraint --------------------------

CONSTRAINED = [(name, None) for name in CHOICES] + [("auto", JSON_SCHEMA), ("auto", JSON_OBJECT)]


def _holds(name: str, text: dict[str, Any] | None, response: dict[str, Any]) -> bool:
    """An oracle of our own, on the response's items: does it hold to the constraint?"""
    calls = {
        f"{item.get('namespace') or 'functions'}.{item['name']}"
        for item in response["output"]
        if item["type"] == "function_call"
    }
    answers = [
        "".join(part["text"] for part in item["content"])
        for item in response["output"]
        if item["type"] == "message" and item.get("phase") != "commentary"
    ]
    searched = any(item["type"] == "web_search_call" for item in response["output"])
    if text is not None:
        for answer in answers:
            try:
                value = json.loads(answer)
            except ValueError:
                return False
            if not isinstance(value, dict) or (
                text is JSON_SCHEMA and not isinstance(value.get("n"), int)
            ):
                return False
        return True
    allowed = {
        "none": set(),
        "required": {"functions.f", "functions.g", "docs.search"},
        "named_f": {"functions.f"},
        "allowed_auto_g": {"functions.g"},
        "allowed_required_docs": {"docs.search"},
    }[name]
    if searched or not calls <= allowed:
        return False
    if name in ("required", "named_f", "allowed_required_docs"):
        return bool(calls) and not answers
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), which=st.sampled_from(CONSTRAINED))
def test_random_output_never_completes_with_a_broken_constraint(
    encoding: HarmonyEncoding, data: st.DataObject, which: tuple[str, dict[str, Any] | None]
) -> None:
    name, text = which
    constraint = _constraint(encoding, tool_choice=CHOICES.get(name, name), text=text)
    chunks = data.draw(engine_outputs(encoding))
    events, stream = _run_checked(encoding, constraint, chunks)
    response = assert_well_formed(events, invalid_utf8=True)
    if response["status"] == "completed":
        assert _holds(name, text, response), response["output"]
    else:
        assert response["status"] == "failed"
        assert stream.violation is not None


def test_a_violations_failure_message_names_the_code_and_who_enforced_it() -> None:
    violation = Violation("json_schema", "the answer is not valid JSON")
    checked, enforced = violation.failure(False), violation.failure(True)
    assert checked.startswith(f"{CONSTRAINT_VIOLATED}: the answer is not valid JSON (")
    assert "does not enforce response_format; the output was checked after the fact" in checked
    assert enforced.endswith("(upstream enforced response_format)")
