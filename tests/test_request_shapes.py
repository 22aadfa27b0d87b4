"""Unknown keys inside request objects are refused; the table of keys follows the spec and the
SDK; the response object echoes only what the spec defines.

The table (proxy/harmony/request/shapes.py) is held to OpenAI's OpenAPI description — each
shape's keys are exactly its schemas' properties — and walked beside openai-python's request
types, so every field a real client can send is accepted and nothing else. Then every object
of a request that uses them all gets an unknown key (Hypothesis), and each must be a 400
naming its path.
"""

from __future__ import annotations

import copy
import functools
import typing
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import typing_extensions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import response_create_params
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError
from proxy.harmony.history import conversation as conv
from proxy.harmony.request.check import Kinds, Many, Node, Shape, at, check_shape, shown, spec_only
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.request.shapes import INPUT_ITEM, REQUEST, TOOL, TOOL_CHOICE
from proxy.harmony.response import ResponseContext, response_object
from tests.openapi import SPEC_FILE, assert_response_matches_spec
from tests.request_clients import CLIENT_BODIES

MODEL = "openai/gpt-oss-120b"
ROOTS: dict[str, Node] = {**REQUEST, "input": Many(INPUT_ITEM), "tools": Many(TOOL)}


# -- the table against the spec -----------------------------------------------------------------


@functools.cache
def _schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = orjson.loads(SPEC_FILE.read_bytes())["components"]["schemas"]
    return schemas


def _props(schema: dict[str, Any]) -> set[str]:
    """The properties an object of `schema` may have (through refs, unions and `allOf`)."""
    if "$ref" in schema:
        return _props(_schemas()[schema["$ref"].rsplit("/", 1)[-1]])
    names = set(schema.get("properties", {}))
    for key in ("allOf", "anyOf", "oneOf"):
        for part in schema.get(key, []):
            names |= _props(part)
    return names


def spec_props(name: str) -> set[str]:
    """`Schema` or `Schema.property` of the spec: the keys its objects may have."""
    schema_name, _, prop = name.partition(".")
    schema = _schemas()[schema_name]
    return _props(schema["properties"][prop] if prop else schema)


def shapes(node: Node, seen: dict[int, Shape]) -> None:
    """Every shape reachable from `node` into `seen`, by identity."""
    if isinstance(node, Many):
        shapes(node.item, seen)
    elif isinstance(node, Kinds):
        for member in (*node.by_type.values(), node.untyped, node.other):
            if member is not None:
                shapes(member, seen)
    elif id(node) not in seen:
        seen[id(node)] = node
        for inner in node.inner.values():
            shapes(inner, seen)


def _all_shapes() -> list[Shape]:
    seen: dict[int, Shape] = {}
    for root in ROOTS.values():
        shapes(root, seen)
    return list(seen.values())


ALL_SHAPES = _all_shapes()


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=lambda shape: shape.what)
def test_each_shape_has_exactly_its_spec_schemas_keys(shape: Shape) -> None:
    spec: set[str] = set()
    for name in shape.spec:
        spec |= spec_props(name)
    assert shape.keys == spec
    assert not shape.extra & spec, "an extra key the spec has belongs in keys"
    assert not shape.own & spec
    assert shape.inner.keys() <= shape.allowed


def test_each_kind_is_a_type_its_spec_schemas_have() -> None:
    def types(name: str) -> set[str]:
        prop = _schemas()[name].get("properties", {}).get("type", {})
        found: set[str] = set()
        for schema in (prop, *prop.get("anyOf", [])):  # a nullable type is an anyOf
            found |= set(schema.get("enum", [])) | (
                {schema["const"]} if "const" in schema else set()
            )
        return found

    aliases = {("text", "ReasoningTextContent")}  # the reader takes `text` parts as reasoning
    checked = 0
    for root in ROOTS.values():
        for kinds in _kinds(root):
            for kind, shape in kinds.by_type.items():
                if shape.spec and not any(
                    (kind, name) in aliases or kind in types(name) for name in shape.spec
                ):
                    pytest.fail(f"{shape.what}: no schema of {shape.spec} has type {kind!r}")
                checked += 1
    assert checked > 40


def _kinds(node: Node, seen: set[int] | None = None) -> Iterator[Kinds]:
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, Many):
        yield from _kinds(node.item, seen)
    elif isinstance(node, Kinds):
        yield node
        for member in (*node.by_type.values(), node.untyped, node.other):
            if member is not None:
                yield from _kinds(member, seen)
    else:
        for inner in node.inner.values():
            yield from _kinds(inner, seen)


# -- the table against openai-python --------------------------------------------------------------


def _typed_dicts(annotation: Any) -> list[Any]:
    """The TypedDicts a value of `annotation` may be (through Optional, Union, Iterable, …)."""
    if typing_extensions.is_typeddict(annotation):  # openai-python's are typing_extensions'
        return [annotation]
    return [found for arg in typing.get_args(annotation) for found in _typed_dicts(arg)]


def _literals(annotation: Any) -> list[str]:
    if isinstance(annotation, str):
        return [annotation]
    return [text for arg in typing.get_args(annotation) for text in _literals(arg)]


def sdk_walk(node: Node, annotation: Any, found: dict[int, set[str]], path: str) -> None:
    """Walk openai-python's types beside the table: every key an SDK type has is allowed;
    `found` collects, per shape, the SDK's keys for it."""
    if isinstance(node, Many):
        sdk_walk(node.item, annotation, found, path)
        return
    for typed in _typed_dicts(annotation):
        hints = typing.get_type_hints(typed)
        if isinstance(node, Kinds):
            values = _literals(hints["type"]) if "type" in hints else [None]
            matched = [
                node.untyped if value is None else node.by_type.get(value, node.other)
                for value in values
            ]
        else:
            matched = [node]
        for shape in matched:
            if shape is None:
                continue  # a kind the proxy does not read: its reader refuses it
            keys = set(hints)
            missing = keys - shape.allowed
            assert not missing, f"{path}: {typed.__qualname__} keys {missing} are refused"
            if id(shape) in found and keys <= found[id(shape)]:
                continue
            found.setdefault(id(shape), set()).update(keys)
            for key, inner in shape.inner.items():
                if key in hints:
                    sdk_walk(inner, hints[key], found, at(path, key))


def test_every_field_of_openai_pythons_request_types_is_accepted_and_extras_are_its() -> None:
    hints = typing.get_type_hints(response_create_params.ResponseCreateParamsBase)
    found: dict[int, set[str]] = {}
    for key, node in ROOTS.items():
        sdk_walk(node, hints[key], found, key)
    unreached = set()
    for shape in ALL_SHAPES:
        if id(shape) in found:
            assert shape.extra <= found[id(shape)], shape.what  # no invented "SDK" key
        else:
            # Only the extras of a shape the SDK has for the same spec schemas.
            twins = [
                found[id(twin)]
                for twin in ALL_SHAPES
                if twin.spec == shape.spec and id(twin) in found
            ]
            assert any(shape.extra <= keys for keys in twins) or not shape.extra, shape.what
            unreached.add(shape.what)
        assert not shape.own & found.get(id(shape), set()), "an SDK key is not our own"
    # openai-python types `allowed_tools.tools` as plain objects.
    assert unreached == {"a function 'allowed_tools' lists", "a tool 'allowed_tools' lists"}


# -- unknown keys are 400s naming their path ------------------------------------------------------

#: A request that uses every object the table knows (valid: it renders).
FULL: dict[str, Any] = {
    "model": MODEL,
    "input": [
        {
            "type": "message",
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": "Hi",
                    "prompt_cache_breakpoint": {"mode": "explicit"},
                }
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "phase": "final_answer",
            "content": [
                {
                    "type": "output_text",
                    "text": "Hello",
                    "annotations": [
                        {"type": "url_citation", "url": "u", "title": "t", "start_index": 0},
                        {"type": "file_citation", "file_id": "f", "filename": "n", "index": 0},
                    ],
                    "logprobs": [
                        {
                            "token": "Hello",
                            "logprob": -0.1,
                            "bytes": [72],
                            "top_logprobs": [{"token": "Hi", "logprob": -2.0, "bytes": [72]}],
                        }
                    ],
                },
                {"type": "refusal", "refusal": "No."},
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "s"}],
            "content": [{"type": "reasoning_text", "text": "r"}],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "f",
            "arguments": "{}",
            "caller": {"type": "program", "caller_id": "p"},
            "async": False,
        },
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "out"}],
            "caller": {"type": "direct"},
        },
    ],
    "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "async": False},
        {
            "type": "namespace",
            "name": "docs",
            "description": "Docs.",
            "tools": [{"type": "function", "name": "search", "async": False}],
        },
        {
            "type": "web_search",
            "filters": {"allowed_domains": ["example.com"]},
            "user_location": {"type": "approximate", "city": "Paris"},
        },
        {"type": "web_search_preview", "user_location": {"type": "approximate"}},
        {
            "type": "code_interpreter",
            "container": {
                "type": "auto",
                "network_policy": {
                    "type": "allowlist",
                    "allowed_domains": ["a.b"],
                    "domain_secrets": [{"domain": "a.b", "name": "K", "value": "v"}],
                },
            },
        },
    ],
    "tool_choice": {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [
            {"type": "function", "name": "search", "namespace": "docs"},
            {"type": "mcp", "server_label": "deepwiki"},
        ],
    },
    "reasoning": {"effort": "low", "summary": "auto"},
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    "prompt_cache_options": {"ttl": "30m", "prewarm": True},
    "stream_options": {"include_obfuscation": False},
    "background_options": {"completion_window": "24h"},
    "image": {"context_compression": None},
}


def test_the_full_request_is_accepted(encoding: HarmonyEncoding) -> None:
    prepare_request(copy.deepcopy(FULL), encoding)


def _objects(value: Any, node: Node, path: str) -> Iterator[tuple[str, dict[str, Any], Shape]]:
    """(path, object, its shape) of every object of `value` the table walks."""
    if isinstance(node, Many):
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from _objects(item, node.item, at(path, index))
        return
    if not isinstance(value, dict):
        return
    shape = node.of(value) if isinstance(node, Kinds) else node
    if shape is None:
        return
    yield path, value, shape
    for key, inner in shape.inner.items():
        if key in value:
            yield from _objects(value[key], inner, at(path, key))


def _everywhere(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], Shape]]:
    for key, node in ROOTS.items():
        yield from _objects(body.get(key), node, key)


PLACES = [path for path, _, _ in _everywhere(FULL)]


def test_every_kind_of_object_is_in_the_full_request() -> None:
    assert len(PLACES) > 30
    for expected in ("input[1].content[0].logprobs[0].top_logprobs[0]", "tool_choice.tools[1]"):
        assert expected in PLACES


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    place=st.sampled_from(PLACES),
    key=st.text(min_size=1, max_size=300).filter(lambda key: key not in ("type",)),
)
def test_an_unknown_key_anywhere_is_a_400_naming_its_path(
    encoding: HarmonyEncoding, place: str, key: str
) -> None:
    body = copy.deepcopy(FULL)
    target, shape = next(
        (found, shape) for path, found, shape in _everywhere(body) if path == place
    )
    if key in shape.allowed:
        return  # a key this object may have
    target[key] = 1
    with pytest.raises(ClientError) as caught:
        prepare_request(body, encoding)
    error = caught.value
    assert (error.status, error.code) == (400, "unknown_parameter")
    assert error.param == shown(at(place, key))
    assert error.message.startswith(f"Unknown parameter: '{shown(at(place, key))}'")
    assert len(error.message) < 400  # the key is quoted at most 200 characters long


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("reasoning", {"effort": "low", "efort": "high"}, "reasoning.efort"),
        ("text", {"format": {"type": "text", "strict": True}}, "text.format.strict"),
        ("text", {"verbosity": "medium", "style": "terse"}, "text.style"),
        ("tool_choice", {"type": "function", "name": "f", "x": 1}, "tool_choice.x"),
        ("prompt_cache_options", {"ttl": "30m", "size": 1}, "prompt_cache_options.size"),
        ("stream_options", {"include_usage": True}, "stream_options.include_usage"),
        ("input", [{"role": "user", "content": "x", "name": "bob"}], "input[0].name"),
        (
            "input",
            [{"role": "user", "content": [{"type": "input_text", "text": "x", "y": 1}]}],
            "input[0].content[0].y",
        ),
        ("tools", [{"type": "function", "name": "f", "strct": True}], "tools[0].strct"),
        ("tools", [{"type": "web_search", "filters": {"domains": []}}], "tools[0].filters.domains"),
    ],
)
def test_unknown_keys_in_known_objects(
    encoding: HarmonyEncoding, field: str, value: Any, param: str
) -> None:
    with pytest.raises(ClientError) as caught:
        prepare_request({"model": MODEL, "input": "Hi", field: value}, encoding)
    assert (caught.value.status, caught.value.code, caught.value.param) == (
        400,
        "unknown_parameter",
        param,
    )


def test_a_huge_key_is_quoted_capped_never_echoed(encoding: HarmonyEncoding) -> None:
    key = "k" * 50_000
    with pytest.raises(ClientError) as caught:
        prepare_request({"model": MODEL, "input": "Hi", "reasoning": {key: 1}}, encoding)
    body = orjson.dumps(caught.value.to_body())
    assert len(body) < 1_000
    assert caught.value.param == "reasoning." + "k" * 190 + "…"
    assert "'reasoning.kkk" in caught.value.message


def test_conversation_items_and_bodies_use_the_same_checks() -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    conv.check_new_items([item], None)
    bad = copy.deepcopy(item)
    bad["content"][0]["k" * 5000] = 1
    with pytest.raises(ClientError) as caught:
        conv.check_new_items(conv.read_create({"items": [bad]})[0], None)
    assert caught.value.param == shown("items[0].content[0]." + "k" * 5000)
    with pytest.raises(ClientError) as body_key:
        conv.read_append({"items": [item], "x" * 5000: 1})
    assert body_key.value.param == shown("x" * 5000)
    assert len(body_key.value.message) < 400
    with pytest.raises(ClientError) as reference:
        conv.conversation_param({"id": "conv_1", "k": 1})
    assert reference.value.param == "conversation.k"


def test_the_walk_leaves_values_of_other_kinds_to_the_readers() -> None:
    check_shape({"type": 3, "k": 1}, TOOL_CHOICE, "tool_choice")  # no shape: the reader's 400
    check_shape({"type": "banana", "k": 1}, TOOL_CHOICE, "tool_choice")
    check_shape("auto", TOOL_CHOICE, "tool_choice")
    check_shape({"k": 1}, Many(TOOL), "tools")  # not an array: the reader's 400
    assert spec_only({"type": "banana", "k": 1}, TOOL_CHOICE) == {"type": "banana", "k": 1}
    assert spec_only("auto", TOOL_CHOICE) == "auto"
    tools = [{"type": "function", "name": "f", "async": True}]
    assert spec_only(tools, Many(TOOL)) == [{"type": "function", "name": "f"}]
    assert spec_only({"k": 1}, Many(TOOL)) == {"k": 1}


def test_real_client_bodies_still_pass(encoding: HarmonyEncoding) -> None:
    for body in CLIENT_BODIES.values():
        prepare_request(copy.deepcopy(body), encoding)


# -- the response object echoes only what the spec defines ----------------------------------------


def test_the_echo_holds_only_the_specs_fields(encoding: HarmonyEncoding) -> None:
    body = copy.deepcopy(FULL)
    body["tool_choice"] = {"type": "function", "name": "search", "namespace": "docs"}
    prepared = prepare_request(body, encoding)
    response = response_object(
        ResponseContext("resp_1", 1.0, MODEL, echo=prepared.echo),
        status="completed",
        output=[],
        usage=None,
    )
    assert_response_matches_spec(response)
    # Keys of what the request sent, only those the spec's schemas give.
    assert response["tool_choice"] == {"type": "function", "name": "search"}
    assert set(response["reasoning"]) <= spec_props("Reasoning")
    assert set(response["text"]) <= spec_props("ResponseTextParam")
    assert set(response["text"]["format"]) <= spec_props("TextResponseFormatJsonSchema")
    tool_schemas = {
        "function": "FunctionTool",
        "namespace": "NamespaceToolParam",
        "web_search": "WebSearchTool",
        "web_search_preview": "WebSearchPreviewTool",
        "code_interpreter": "CodeInterpreterTool",
    }
    for tool in response["tools"]:
        assert set(tool) <= spec_props(tool_schemas[tool["type"]]), tool
        for member in tool.get("tools", []):
            assert set(member) <= spec_props("FunctionToolParam"), member
    assert "async" not in orjson.dumps(response).decode()
    assert set(response["tools"][4]["container"]) <= spec_props("AutoCodeInterpreterToolParam")


def test_tool_choice_kinds_cover_the_spec() -> None:
    """Every tool_choice object type of the spec has a shape: none slips past unchecked."""
    spec_types: set[str] = set()
    for member in _schemas()["ToolChoiceParam"]["oneOf"]:
        schema = _schemas()[member["$ref"].rsplit("/", 1)[-1]]
        prop = schema.get("properties", {}).get("type", {})
        spec_types |= set(prop.get("enum", []))
    assert spec_types == set(TOOL_CHOICE.by_type)
