"""Every event and response object the proxy emits is valid against OpenAI's spec.

`assert_well_formed` validates every stream any test produces (`tests/openapi.py`); this file
adds the scenarios on purpose: every recorded upstream scenario with each real client's request
echo, at two chunkings, ended each way a stream can end (completed, incomplete, failed), streamed
and as the non-streamed answer; tool calls, namespace calls, preambles, web search, built-in
tool input; and the fields the schema allows but OpenAI's API reference pins down (`store`,
`parallel_tool_calls`, `service_tier`, `completed_at`), checked one by one. It also checks that
the validator itself rejects what the spec forbids, so a pass means something.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError, UpstreamError
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.response import CountingIds, ResponseContext
from proxy.harmony.stream.repair import ResponseStream
from tests.conftest import FIXTURES
from tests.harmony import MODEL, chunks_of, ids_of
from tests.openapi import (
    assert_events_match_spec,
    assert_response_matches_spec,
    event_errors,
    event_schemas,
    spec_errors,
)
from tests.request_clients import CLIENT_BODIES
from tests.wellformed import assert_well_formed

MANIFEST = json.loads((FIXTURES / "trtllm-oracle" / "manifest.json").read_text())
SCENARIOS = sorted(MANIFEST["scenarios"].items())

#: Every item kind and call shape the core emits, in one answer.
EVERYTHING = (
    "<|channel|>analysis<|message|>Plan the calls.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Let me look.<|end|>"
    "<|start|>assistant<|channel|>analysis to=browser.search <|constrain|>json"
    '<|message|>{"query":"cache docs"}<|call|>'
    "<|start|>assistant<|channel|>analysis to=python<|message|>print(1)<|call|>"
    "<|start|>assistant<|channel|>commentary to=mcp__docs__.search <|constrain|>json"
    '<|message|>{"q":"cache"}<|call|>'
    "<|start|>assistant<|channel|>commentary to=functions.shell <|constrain|>json"
    '<|message|>{"command":["ls"]}<|call|>'
)
ENDINGS = ("stop", "length", "fail")


def _run(
    encoding: HarmonyEncoding, ids: list[int], ctx: ResponseContext, size: int, ending: str
) -> list[dict[str, Any]]:
    stream = ResponseStream(encoding, ctx, CountingIds())
    events = stream.start()
    for chunk in chunks_of(ids, [size]):
        events += stream.feed(chunk)
    if ending == "fail":
        events += stream.fail("upstream_incomplete", "upstream closed the stream")
    else:
        events += stream.finish(ending, None)
    return events


def _context(body: dict[str, Any], encoding: HarmonyEncoding) -> ResponseContext:
    prepared = prepare_request(body, encoding)
    return ResponseContext(
        response_id="resp_spec",
        created_at=1767225600.0,
        model=prepared.model,
        echo=prepared.echo,
        input_tokens=len(prepared.prompt_token_ids),
        namespaces=prepared.namespaces,
    )


@pytest.mark.parametrize(("name", "scenario"), SCENARIOS, ids=[name for name, _ in SCENARIOS])
@pytest.mark.parametrize("ending", ENDINGS)
def test_recorded_scenarios_are_valid(
    encoding: HarmonyEncoding, name: str, scenario: dict[str, Any], ending: str
) -> None:
    ids = list(scenario["token_ids"])
    for client, body in [("oracle", scenario["request_body"]), *CLIENT_BODIES.items()]:
        ctx = _context(body, encoding)
        for size in (1, 20):
            events = _run(encoding, ids, ctx, size, ending)
            response = assert_well_formed(events)  # the contract, and every event against spec
            assert (
                response["status"]
                == {
                    "stop": "completed",
                    "length": "incomplete",
                    "fail": "failed",
                }[ending]
            ), (name, client)
            assert_response_matches_spec(response)  # the non-streamed answer is this snapshot


@pytest.mark.parametrize("client", sorted(CLIENT_BODIES))
def test_every_item_kind_is_valid(encoding: HarmonyEncoding, client: str) -> None:
    body = CLIENT_BODIES[client]
    ctx = dataclasses.replace(_context(body, encoding), namespaces=frozenset({"mcp__docs__"}))
    ids = ids_of(encoding, EVERYTHING)
    for ending in ENDINGS:
        events = _run(encoding, ids, ctx, 3, ending)
        response = assert_well_formed(events)
        kinds = [item["type"] for item in response["output"]]
        if ending == "stop":
            assert kinds == [
                *("reasoning", "message", "web_search_call", "reasoning"),
                *("function_call", "function_call"),
            ]
        done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        assert [e["name"] for e in done] == ["search", "shell"][: len(done)]


def test_completed_at_only_on_completed_responses(encoding: HarmonyEncoding) -> None:
    ctx = _context({"model": MODEL, "input": "Hi"}, encoding)
    ids = ids_of(encoding, "<|channel|>final<|message|>Hello.<|return|>")
    assert _run(encoding, ids, ctx, 2, "stop")[-1]["response"]["completed_at"] == 1767225600.0
    ctx = dataclasses.replace(ctx, clock=lambda: 1767225607.9)  # the shell's clock, injected
    completed = _run(encoding, ids, ctx, 2, "stop")
    assert completed[-1]["response"]["completed_at"] == 1767225607.0  # whole seconds
    assert all(event["response"]["completed_at"] is None for event in completed[:2])
    for ending in ("length", "fail"):
        assert _run(encoding, ids, ctx, 2, ending)[-1]["response"]["completed_at"] is None


def test_echo_of_an_empty_request_is_what_openai_echoes(encoding: HarmonyEncoding) -> None:
    ctx = _context({"model": MODEL, "input": "Hi"}, encoding)
    ids = ids_of(encoding, "<|channel|>final<|message|>Hello.<|return|>")
    response = _run(encoding, ids, ctx, 5, "stop")[-1]["response"]
    assert response["text"] == {"format": {"type": "text"}}  # the spec's own example
    assert response["parallel_tool_calls"] is True  # the spec's default
    assert response["store"] is True
    assert response["service_tier"] == "default"  # the tier that served it
    for key in ("user", "prompt_cache_options"):  # no null where the spec's type has none
        assert key not in response, key
    created = _run(encoding, ids, ctx, 5, "stop")[0]["response"]
    assert "usage" not in created  # ResponseUsage is not nullable: left out until it is known


def test_echo_of_set_fields(encoding: HarmonyEncoding) -> None:
    body = {
        "model": MODEL,
        "input": "Hi",
        "store": False,
        "parallel_tool_calls": False,
        "service_tier": "flex",
        "user": "u-1",
        "text": {"verbosity": "medium"},
        "reasoning": {"effort": "low", "summary": "auto"},
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {"type": "web_search"},
            {"type": "web_search_preview"},
        ],
    }
    ctx = _context(body, encoding)
    ids = ids_of(encoding, "<|channel|>final<|message|>Hello.<|return|>")
    events = _run(encoding, ids, ctx, 5, "stop")
    assert_well_formed(events)
    response = events[-1]["response"]
    assert (response["store"], response["parallel_tool_calls"]) == (False, False)
    assert response["service_tier"] == "default"  # flex asked, default served
    assert response["user"] == "u-1"
    assert response["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    assert "mode" not in response["reasoning"]
    assert (response["reasoning"]["effort"], response["reasoning"]["summary"]) == ("low", "auto")
    function, search, preview = response["tools"]
    assert "defer_loading" not in function
    assert (search["external_web_access"], search["search_context_size"]) == (True, "medium")
    assert "search_context_size" not in preview


def test_json_schema_format_echo_leaves_out_unset_keys(encoding: HarmonyEncoding) -> None:
    fmt = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}
    described = {**fmt, "description": "The answer."}
    echo = _context({"model": MODEL, "input": "Hi", "text": {"format": described}}, encoding).echo
    assert echo["text"]["format"]["description"] == "The answer."
    ctx = _context({"model": MODEL, "input": "Hi", "text": {"format": fmt}}, encoding)
    ids = ids_of(encoding, '<|channel|>final<|message|>{"a":1}<|return|>')
    events = _run(encoding, ids, ctx, 5, "stop")
    assert_well_formed(events)
    echoed = events[-1]["response"]["text"]["format"]
    assert "description" not in echoed
    assert (echoed["name"], echoed["schema"], echoed["type"]) == (
        "answer",
        {"type": "object"},
        fmt["type"],
    )


# -- the validator is not vacuous ---------------------------------------------------------------


def _valid_stream(encoding: HarmonyEncoding) -> list[dict[str, Any]]:
    ctx = _context({"model": MODEL, "input": "Hi"}, encoding)
    text = (
        "<|channel|>analysis<|message|>Call.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json"
        '<|message|>{"a":1}<|call|>'
    )
    return _run(encoding, ids_of(encoding, text), ctx, 4, "stop")


@pytest.mark.parametrize(
    ("defect", "expected"),
    [
        # each way upstream's stream breaks the spec that the schema can see, put back into a
        # valid stream
        ("done_without_name", "'name' is a required property"),
        ("text_null", "$.response.text"),
        ("format_null", "$.response.text.format"),
        ("description_null", "$.response.text.format"),
        ("reasoning_mode_null", "$.response.reasoning.mode"),
        ("defer_loading_null", "$.response.tools[0]"),
        ("web_search_null", "$.response.tools[0]"),
        ("prompt_cache_options_null", "$.response.prompt_cache_options"),
        ("user_null", "$.response.user"),
        ("usage_null", "$.response.usage"),
        # and what else the spec forbids
        ("unknown_event", "not a ResponseStreamEvent"),
        ("message_without_role", "'role' is a required property"),
        ("unknown_item_type", "$.item.type"),
        ("string_index", "$.output_index"),
        ("error_code_outside_enum", "$.response.error.code"),
    ],
)
def test_validator_rejects(encoding: HarmonyEncoding, defect: str, expected: str) -> None:
    events = _valid_stream(encoding)
    assert_events_match_spec(events)
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    terminal = events[-1]["response"]
    fmt = {"type": "json_schema", "name": "n", "schema": {}}
    mutate = {
        "done_without_name": lambda: done.pop("name"),
        "text_null": lambda: terminal.update(text=None),
        "format_null": lambda: terminal.update(text={"format": None, "verbosity": "low"}),
        "description_null": lambda: terminal.update(text={"format": {**fmt, "description": None}}),
        "reasoning_mode_null": lambda: terminal.update(reasoning={"effort": "low", "mode": None}),
        "defer_loading_null": lambda: terminal.update(
            tools=[
                {
                    "type": "function",
                    "name": "f",
                    "strict": None,
                    "parameters": None,
                    "defer_loading": None,
                }
            ]
        ),
        "web_search_null": lambda: terminal.update(
            tools=[{"type": "web_search", "search_context_size": None}]
        ),
        "prompt_cache_options_null": lambda: terminal.update(prompt_cache_options=None),
        "user_null": lambda: terminal.update(user=None),
        "usage_null": lambda: terminal.update(usage=None),
        "unknown_event": lambda: done.update(type="response.function_call.done"),
        "message_without_role": lambda: terminal["output"].append(
            {"type": "message", "id": "msg_1", "content": [], "status": "completed"}
        ),
        "unknown_item_type": lambda: events[2]["item"].update(type="thought"),
        "string_index": lambda: done.update(output_index="1"),
        "error_code_outside_enum": lambda: terminal.update(
            error={"code": "upstream_incomplete", "message": "cut"}
        ),
    }[defect]
    mutate()
    problems = [p for event in events for p in event_errors(event)]
    assert any(expected in problem for problem in problems), problems


def test_every_event_type_the_core_emits_is_in_the_spec() -> None:
    emitted = {
        *("response.created", "response.in_progress", "response.completed"),
        *("response.incomplete", "response.failed", "error"),
        *("response.output_item.added", "response.output_item.done"),
        *("response.content_part.added", "response.content_part.done"),
        *("response.output_text.delta", "response.output_text.done"),
        *("response.reasoning_text.delta", "response.reasoning_text.done"),
        *("response.function_call_arguments.delta", "response.function_call_arguments.done"),
        *("response.web_search_call.in_progress", "response.web_search_call.completed"),
    }
    assert emitted <= set(event_schemas())


def test_error_bodies_match_the_spec() -> None:
    for error in (
        ClientError("'temperature' is 'hot': expected a number", param="temperature"),
        UpstreamError("upstream is down", status=502, code="upstream_unreachable"),
    ):
        assert spec_errors(error.to_body(), "ErrorResponse") == []
    assert spec_errors({"error": {"message": "x"}}, "ErrorResponse") != []
