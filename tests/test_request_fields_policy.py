"""Every `CreateResponse` field is honoured, refused, echoed or checked — never ignored silently:
a client that sets a field must learn whether it took effect. The table of docs/request-fields.md
lists each one; these tests hold the proxy to it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.response import ResponseContext
from tests.harmony import ids_of, run
from tests.openapi import SPEC_FILE
from tests.wellformed import assert_well_formed

ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai/gpt-oss-120b"


def _prepare(encoding: HarmonyEncoding, **fields: Any) -> Any:
    return prepare_request({"model": MODEL, "input": "Hi", **fields}, encoding)


def _refused(encoding: HarmonyEncoding, **fields: Any) -> ClientError:
    with pytest.raises(ClientError) as caught:
        _prepare(encoding, **fields)
    assert caught.value.status == 400
    return caught.value


def test_the_docs_table_lists_every_create_response_field() -> None:
    spec = orjson.loads(SPEC_FILE.read_bytes())["components"]["schemas"]

    def properties(schema: dict[str, Any]) -> set[str]:
        if "$ref" in schema:
            return properties(spec[schema["$ref"].rsplit("/", 1)[-1]])
        names = set(schema.get("properties", {}))
        for part in schema.get("allOf", []):
            names |= properties(part)
        return names

    fields = properties(spec["CreateResponse"])
    assert {"input", "tool_choice", "truncation", "moderation"} <= fields
    table = (ROOT / "docs" / "request-fields.md").read_text()
    listed: set[str] = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            first = row.split(" | ")[0]
            listed |= set(re.findall(r"`([a-z_]+)`", first))
    assert listed == fields
    for row in table.splitlines():
        if row.startswith("| `"):
            assert row.split(" | ")[1] in ("honoured", "refused", "echoed", "checked"), row


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"access_programs": {"programs": []}}, "access_programs"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        # The shell resolves it from the response store before rendering: one that reaches
        # the renderer means the store is off.
        ({"conversation": "conv_1"}, "conversation"),
    ],
)
def test_refused_fields_are_400s_naming_them(
    encoding: HarmonyEncoding, fields: dict[str, Any], param: str
) -> None:
    error = _refused(encoding, **fields)
    assert (error.param, error.code) == (param, "unsupported_parameter")


def test_previous_response_id_without_a_store_is_not_found(encoding: HarmonyEncoding) -> None:
    """No store, no response to continue: OpenAI's `previous_response_not_found`, the cue a
    client takes to send the whole conversation, which the message says too."""
    error = _refused(encoding, previous_response_id="resp_1")
    assert (error.param, error.code) == ("previous_response_id", "previous_response_not_found")
    assert error.message.startswith("Previous response with id 'resp_1' not found: ")
    assert "store_url = off" in error.message
    malformed = _refused(encoding, previous_response_id="x" * 5000)
    assert (malformed.param, malformed.code) == ("previous_response_id", "invalid_value")
    assert len(malformed.message) < 300


def test_background_needs_store(encoding: HarmonyEncoding) -> None:
    """OpenAI's rule: a background response lives in the response store, so it needs `store`."""
    error = _refused(encoding, background=True, store=False)
    assert error.param == "background"
    assert "store" in error.message
    _prepare(encoding, background=True)  # with the store: the shell runs it in the background


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"text": {"verbosity": "low"}}, "text.verbosity", "unsupported_value"),
        ({"reasoning": {"effort": "minimal"}}, "reasoning.effort", "unsupported_value"),
        ({"reasoning": {"effort": "xhigh"}}, "reasoning.effort", "unsupported_value"),
        ({"reasoning": {"mode": "pro"}}, "reasoning.mode", "unsupported_value"),
        ({"reasoning": {"context": "everything"}}, "reasoning.context", "unsupported_value"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "invalid_value"),
        ({"metadata": {"k" * 65: "v"}}, "metadata." + "k" * 65, "invalid_value"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", "invalid_value"),
        ({"safety_identifier": "s" * 65}, "safety_identifier", "invalid_value"),
        ({"prompt_cache_options": {"ttl": "24h"}}, "prompt_cache_options.ttl", "unsupported_value"),
        ({"prompt_cache_options": {"mode": "x"}}, "prompt_cache_options.mode", "unsupported_value"),
        (
            {"stream_options": {"include_obfuscation": "yes"}},
            "stream_options.include_obfuscation",
            "invalid_type",
        ),
        ({"include": ["message.output_text.text"]}, "include[0]", "unsupported_value"),
    ],
)
def test_unsupported_values_are_400s(
    encoding: HarmonyEncoding, fields: dict[str, Any], param: str, code: str
) -> None:
    error = _refused(encoding, **fields)
    assert (error.param, error.code) == (param, code), error.message


def test_checked_fields_are_accepted(encoding: HarmonyEncoding) -> None:
    prepared = _prepare(
        encoding,
        prompt_cache_options={"ttl": "30m", "mode": "implicit"},
        stream_options={"include_obfuscation": False},
        stream=True,
        metadata={f"k{i}": "v" * 512 for i in range(16)},
        safety_identifier="s" * 64,
        text={"verbosity": "medium"},
        reasoning={"effort": "low", "mode": "standard", "context": "all_turns"},
        include=["web_search_call.action.sources", "code_interpreter_call.outputs"],
    )
    assert "prompt_cache_options" not in prepared.echo  # none can be applied on trtllm
    assert "stream_options" not in prepared.completion_body["stream_options"]


def test_echoed_fields_reach_the_response_object(encoding: HarmonyEncoding) -> None:
    echoed = {
        "metadata": {"ticket": "T-1"},
        "user": "user-1",
        "safety_identifier": "hash-1",
        "prompt_cache_key": "thread-1",
        "prompt_cache_retention": "24h",
        "top_logprobs": 3,
        "store": False,
        "max_tool_calls": 2,
        "parallel_tool_calls": False,
        "reasoning": {"effort": "high", "summary": "detailed", "mode": "standard"},
    }
    prepared = _prepare(encoding, **echoed)
    ctx = ResponseContext("resp_1", 1767225600.0, MODEL, prepared.echo)
    events, _ = run(
        encoding, [ids_of(encoding, "<|channel|>final<|message|>Hi.<|return|>")], ctx=ctx
    )
    response = assert_well_formed(events)
    for key, value in echoed.items():
        if key == "reasoning":
            assert {k: response[key][k] for k in value} == value
        else:
            assert response[key] == value, key
    assert response["service_tier"] == "default"


def test_reasoning_context_current_turn_leaves_out_earlier_reasoning(
    encoding: HarmonyEncoding,
) -> None:
    def reasoning(text: str) -> dict[str, Any]:
        return {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
        }

    turns = [
        {"role": "user", "content": "First question?"},
        reasoning("Earlier thinking."),
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "Second question?"},
        reasoning("Thinking about the second."),
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    tools = [{"type": "function", "name": "f"}]

    def prompt(items: list[Any], context: str | None) -> list[int]:
        fields: dict[str, Any] = {"input": items, "tools": tools}
        if context is not None:
            fields["reasoning"] = {"context": context}
        return list(_prepare(encoding, **fields).prompt_token_ids)

    everything = prompt(turns, None)
    no_user = [t for t in turns if t.get("role") != "user"]
    assert prompt(no_user, "current_turn") == prompt(no_user, None)  # no earlier turn to drop
    assert prompt(turns, "auto") == prompt(turns, "all_turns") == everything  # upstream's
    current = prompt(turns, "current_turn")
    assert current == prompt([t for i, t in enumerate(turns) if i != 1], None)
    assert current != everything
