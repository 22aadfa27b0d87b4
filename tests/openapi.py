"""Validate what the proxy sends against OpenAI's published OpenAPI description.

`spec_errors(value, name)` lists where `value` breaks the component schema `name` of
`fixtures/openai-openapi/openai-openapi-2.3.0.json`; `assert_events_match_spec(events)` checks
every event of a stream (each `response` object inside included) and `assert_response_matches_spec`
a non-streamed answer. `tests/wellformed.py` calls the event check, so every scenario any test
runs through `assert_well_formed` is validated against the spec as well.

The file is OpenAPI 3.1 (JSON Schema 2020-12) with two leftovers of OpenAPI 3.0 that a plain
2020-12 validator reads wrongly; the schemas are rewritten once, before validation:

- `nullable: true` allows `null` (added to `type`/`enum`, or an `anyOf` with `{"type": "null"}`);
- a `oneOf` with a `discriminator` is dispatched on the discriminator property: the property
  must hold one of the members' values, and the object must match a member with that value.
  Several members may share a value (`message` is an easy input message, an input message and an
  output message) and then match each other's objects, which a strict `oneOf` would reject.
  A `oneOf` whose members' values cannot all be read becomes an `anyOf`.

Stream events are dispatched on `type` the same way (`ResponseStreamEvent` is a plain `anyOf`
of 50-odd members, whose failure would name none of them): an event type the spec does not
define is an error of its own.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.conftest import FIXTURES

SPEC_FILE = FIXTURES / "openai-openapi" / "openai-openapi-2.3.0.json"
_BASE = "urn:openai-openapi-2.3.0"
_PREFIX = "#/components/schemas/"


@functools.cache
def _schemas() -> dict[str, Any]:
    spec = orjson.loads(SPEC_FILE.read_bytes())
    schemas: dict[str, Any] = copy.deepcopy(spec["components"]["schemas"])
    return {name: _rewrite(schema, schemas) for name, schema in schemas.items()}


@functools.cache
def _registry() -> Registry:
    document = {"components": {"schemas": _schemas()}}
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    return Registry().with_resource(_BASE, resource)


@functools.cache
def validator(name: str) -> Draft202012Validator:
    """A validator for the component schema `name` (e.g. `Response`, `ResponseStreamEvent`)."""
    if name not in _schemas():
        raise KeyError(f"the spec has no component schema {name!r}")
    return Draft202012Validator({"$ref": f"{_BASE}{_PREFIX}{name}"}, registry=_registry())


@functools.cache
def event_schemas() -> dict[str, str]:
    """Event type → the component schema of that event, from `ResponseStreamEvent`'s members."""
    schemas = _schemas()
    out: dict[str, str] = {}
    for member in schemas["ResponseStreamEvent"]["anyOf"]:
        name = member["$ref"].removeprefix(_PREFIX)
        for value in _values(schemas[name], "type", schemas) or ():
            out[value] = name
    return out


def spec_errors(value: Any, name: str) -> list[str]:
    """Every place `value` breaks the component schema `name`, as readable lines (none: valid)."""
    return [_describe(error) for error in _leaf_errors(validator(name).iter_errors(value))]


def event_errors(event: dict[str, Any]) -> list[str]:
    """What is wrong with one stream event, dispatched on its `type` (module doc)."""
    kind = event.get("type")
    name = event_schemas().get(kind) if isinstance(kind, str) else None
    if name is None:
        return [f"event type {kind!r} is not a ResponseStreamEvent of the spec"]
    return spec_errors(event, name)


def assert_events_match_spec(events: Sequence[dict[str, Any]]) -> None:
    """Every event (and the `response` objects they carry) is valid against the spec."""
    problems = []
    for number, event in enumerate(events):
        problems += [f"event {number} ({event.get('type')}): {e}" for e in event_errors(event)]
    assert not problems, "not valid against the OpenAPI spec:\n  " + "\n  ".join(problems[:30])


def assert_response_matches_spec(response: dict[str, Any]) -> None:
    """A `response` object (a non-streamed answer, a retrieved response) is valid."""
    assert_matches_spec(response, "Response")


def assert_matches_spec(value: Any, name: str) -> None:
    """`value` is valid against the component schema `name` (a conversation, an item list…)."""
    problems = spec_errors(value, name)
    assert not problems, f"{name} not valid against the OpenAPI spec:\n  " + "\n  ".join(
        problems[:30]
    )


# -- errors ------------------------------------------------------------------------------------


def _leaf_errors(errors: Iterator[ValidationError]) -> Iterator[ValidationError]:
    """The innermost errors: an `anyOf` failure is explained by its best branch's errors."""
    for error in errors:
        if error.context:
            best = _best_branch(error.context)
            yield from _leaf_errors(iter(best))
        else:
            yield error


def _best_branch(errors: list[ValidationError]) -> list[ValidationError]:
    """The errors of the `anyOf`/`oneOf` branch that came closest (fewest, deepest errors);
    a `null` branch never explains a non-null value."""
    branches: dict[Any, list[ValidationError]] = {}
    for error in errors:
        branches.setdefault(error.relative_schema_path[0], []).append(error)
    candidates = [
        branch
        for branch in branches.values()
        if not all(e.validator == "type" and e.validator_value == "null" for e in branch)
    ] or list(branches.values())
    return min(candidates, key=_closeness)


def _closeness(branch: list[ValidationError]) -> tuple[bool, int, int]:
    """A branch whose `type` property is wrong is a worse explanation than one that fails on
    the object's other fields, then fewer and deeper errors are better."""
    wrong_kind = any(e.path and e.path[-1] == "type" and e.validator == "enum" for e in branch)
    return wrong_kind, len(branch), -max(len(e.path) for e in branch)


def _describe(error: ValidationError) -> str:
    where = error.json_path
    return f"{where}: {error.message[:300]}"


# -- the rewrite (module doc) -----------------------------------------------------------------


def _rewrite(node: Any, schemas: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_rewrite(item, schemas) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _rewrite(value, schemas) for key, value in node.items()}
    if "oneOf" in node and "discriminator" in node:
        node = _dispatch(node, schemas)
    if node.pop("nullable", False):
        node = _nullable(node)
    return node


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    kind = node.get("type")
    if isinstance(kind, str) and "enum" not in node:
        return {**node, "type": [kind, "null"]}
    if isinstance(kind, str):
        return {**node, "type": [kind, "null"], "enum": [*node["enum"], None]}
    return {"anyOf": [node, {"type": "null"}]}


def _dispatch(node: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    prop = node["discriminator"]["propertyName"]
    members: list[dict[str, Any]] = node["oneOf"]
    rest = {k: v for k, v in node.items() if k not in ("oneOf", "discriminator")}
    groups: dict[str, list[dict[str, Any]]] = {}
    for member in members:
        values = _values(member, prop, schemas)
        if not values:
            return {**rest, "anyOf": members}
        for value in values:
            groups.setdefault(value, []).append(member)
    branches = [
        {
            "if": {"properties": {prop: {"const": value}}},
            "then": group[0] if len(group) == 1 else {"anyOf": group},
        }
        for value, group in groups.items()
    ]
    present = {"properties": {prop: {"enum": list(groups)}}, "allOf": branches}
    # Members that do not require the property (an easy input message has no `type`) are what
    # an object without it must match.
    optional = [m for m in members if prop not in _required(m, schemas)]
    absent: dict[str, Any] = {"anyOf": optional} if optional else {"required": [prop]}
    dispatch = {"if": {"required": [prop]}, "then": present, "else": absent}
    return {**rest, "allOf": [*rest.get("allOf", []), dispatch]}


def _required(member: dict[str, Any], schemas: dict[str, Any]) -> set[str]:
    ref = member.get("$ref")
    if isinstance(ref, str):
        return _required(schemas[ref.removeprefix(_PREFIX)], schemas)
    names = set(member.get("required", []))
    for part in member.get("allOf", []):
        names |= _required(part, schemas)
    return names


def _values(member: dict[str, Any], prop: str, schemas: dict[str, Any]) -> list[str] | None:
    """The discriminator values a member allows (its property's `enum`/`const`), or None."""
    ref = member.get("$ref")
    if isinstance(ref, str):
        return _values(schemas[ref.removeprefix(_PREFIX)], prop, schemas)
    spec = member.get("properties", {}).get(prop)
    if isinstance(spec, dict):
        if "const" in spec:
            return [spec["const"]]
        if isinstance(spec.get("enum"), list):
            return [value for value in spec["enum"] if isinstance(value, str)]
    for part in member.get("allOf", []):
        found = _values(part, prop, schemas)
        if found:
            return found
    return None
