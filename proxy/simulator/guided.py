"""Guided decoding in the simulated engine: a structural-tag `response_format` as a text matcher.

trtllm's `/v1/completions` turns `{"type": "structural_tag", "format": …}` into an xgrammar
grammar that masks every token the format does not allow (only on a server started with a
guided-decoding backend; `SimulatorConfig.guided_decoding` models both). The simulator
has no logits to mask, so it checks whole answers instead: `Constraint.accepts(text)` says
whether the format matches the generated text (Harmony specials as their text, the end-of-
sequence `<|return|>` left out: it is xgrammar's stop token, not grammar text), and the scripted
model writes the first of its candidate answers the constraint accepts — the answer steered the
way a masked engine steers it (model.py). Replayed ids are not the model's to change: when they
break the constraint the request is refused (`GuidedError`, a 400).

The formats read are those xgrammar 0.1.25 (the version trtllm pins) defines and the proxy or
upstream send: `const_string`, `any_text`, `json_schema`, `sequence`, `or`, `tag`,
`triggered_tags`. Their semantics follow xgrammar's: an `any_text` tag body runs to the first
occurrence of the tag's `end`; unbounded `any_text` takes the rest of the text; `triggered_tags`
allows free text without any trigger, and at a trigger one of the tags whose `begin` starts with
it; `stop_after_first` ends the format after its first tag. `json_schema` matches one JSON value
of the schema's `type`, with its `required` keys, `properties`, `items`, `enum` and `const`
checked (the simulator's simplification: xgrammar enforces the whole schema). Sans-IO.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Stands for "the text ran out inside this format": it is a prefix of a match.
_PARTIAL = -1
_DECODER = json.JSONDecoder()
Ends = frozenset[int]


class GuidedError(ValueError):
    """A `response_format` the simulator cannot read, or replayed ids that break it."""


@dataclass(frozen=True, slots=True)
class Constraint:
    """A structural-tag format, ready to match generated text (module doc)."""

    format: dict[str, Any]

    def accepts(self, text: str) -> bool:
        """The whole of `text` matches the format."""
        return len(text) in _ends(self.format, text, 0)

    def accepts_prefix(self, text: str) -> bool:
        """`text` can be continued into a match (what a cut generation must satisfy)."""
        ends = _ends(self.format, text, 0)
        return _PARTIAL in ends or len(text) in ends

    def forced_text(self) -> str | None:
        """The one text the format allows, when it is a constant (a `const_string`, or a
        sequence of them): what a masked engine writes whatever the model wanted."""
        return _constant(self.format)

    def json_schema(self) -> dict[str, Any] | None:
        """The schema of the first `json_schema` in the format (the final answer's, in what the
        proxy and upstream send), for the scripted model to write an answer that matches."""
        return _first_json(self.format)


def read_constraint(response_format: dict[str, Any] | None) -> Constraint | None:
    """The constraint of a completions `response_format` (None: unconstrained)."""
    if response_format is None or response_format.get("type") in ("text", None):
        return None
    if response_format.get("type") != "structural_tag":
        raise GuidedError(
            f"the simulator reads response_format of type 'structural_tag' only, not "
            f"{response_format.get('type')!r}"
        )
    fmt = response_format.get("format")
    _check(fmt)
    assert isinstance(fmt, dict)
    return Constraint(fmt)


def json_instance(schema: Any) -> Any:
    """A small JSON value that matches `schema` (what the scripted model answers in JSON)."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return json_instance(schema[key][0])
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    simple = {"string": "example", "integer": 1, "number": 1.5, "boolean": True, "null": None}
    if kind in simple:
        return simple[kind]
    if kind == "array":
        return [json_instance(schema.get("items"))] if schema.get("minItems") else []
    properties = schema.get("properties") or {}
    return {name: json_instance(properties.get(name)) for name in schema.get("required") or ()}


def json_breaking(schema: Any) -> Any:
    """A small JSON value that `schema` rejects (what a model unguided may write instead), or
    an object with an unexpected key when the simulator's checks reject none of them."""
    candidates: tuple[Any, ...] = ({"unexpected": True}, [], "unexpected", None)
    for value in candidates:
        if not _fits(value, schema):
            return value
    return {"unexpected": True}


def _constant(fmt: dict[str, Any]) -> str | None:
    if fmt["type"] == "const_string":
        value = fmt["value"]
        return value if isinstance(value, str) else None
    if fmt["type"] == "sequence":
        parts = [_constant(element) for element in fmt["elements"]]
        return None if None in parts else "".join(p for p in parts if p is not None)
    return None


# -- reading --------------------------------------------------------------------------------------

_FIELDS: dict[str, tuple[str, ...]] = {
    "const_string": ("value",),
    "any_text": (),
    "json_schema": ("json_schema",),
    "sequence": ("elements",),
    "or": ("elements",),
    "tag": ("begin", "content", "end"),
    "triggered_tags": ("triggers", "tags"),
}


def _check(fmt: Any) -> None:
    """Raise `GuidedError` unless `fmt` is a format this module matches."""
    if not isinstance(fmt, dict) or fmt.get("type") not in _FIELDS:
        kind = fmt.get("type") if isinstance(fmt, dict) else type(fmt).__name__
        raise GuidedError(f"the simulator cannot match structural-tag format {kind!r}")
    for name in _FIELDS[fmt["type"]]:
        if name not in fmt:
            raise GuidedError(f"structural-tag format {fmt['type']!r} lacks {name!r}")
    for child in [*fmt.get("elements", ()), *fmt.get("tags", ())]:
        _check(child)
    if fmt["type"] == "tag":
        _check(fmt["content"])


def _first_json(fmt: dict[str, Any]) -> dict[str, Any] | None:
    if fmt["type"] == "json_schema":
        schema = fmt["json_schema"]
        return schema if isinstance(schema, dict) else {}
    children = [*fmt.get("elements", ()), *fmt.get("tags", ())]
    if fmt["type"] == "tag":
        children.append(fmt["content"])
    for child in children:
        found = _first_json(child)
        if found is not None:
            return found
    return None


# -- matching -------------------------------------------------------------------------------------


def _ends(fmt: dict[str, Any], text: str, start: int) -> Ends:
    """Every position where a match of `fmt` from `start` can end; `_PARTIAL` when the text
    ends inside one."""
    return _MATCHERS[fmt["type"]](fmt, text, start)


def _const(fmt: dict[str, Any], text: str, start: int) -> Ends:
    return _literal(fmt["value"], text, start)


def _literal(value: str, text: str, start: int) -> Ends:
    if text.startswith(value, start):
        return frozenset({start + len(value)})
    rest = text[start:]
    return frozenset({_PARTIAL}) if value.startswith(rest) else frozenset()


def _any_text(fmt: dict[str, Any], text: str, start: int) -> Ends:
    return frozenset({len(text), _PARTIAL})  # unbounded: it takes the rest of the output


def _json(fmt: dict[str, Any], text: str, start: int) -> Ends:
    position = start
    while position < len(text) and text[position] in " \t\n\r":
        position += 1
    try:
        value, end = _DECODER.raw_decode(text, position)
    except json.JSONDecodeError:
        return frozenset({_PARTIAL})  # lenient: a cut answer may still become valid JSON
    return frozenset({end}) if _fits(value, fmt["json_schema"]) else frozenset()


def _sequence(fmt: dict[str, Any], text: str, start: int) -> Ends:
    positions: Ends = frozenset({start})
    partial = False
    for element in fmt["elements"]:
        found: set[int] = set()
        for position in positions:
            found |= _ends(element, text, position)
        partial = partial or _PARTIAL in found
        positions = frozenset(found - {_PARTIAL})
        if not positions:
            break
    return positions | {_PARTIAL} if partial else positions


def _or(fmt: dict[str, Any], text: str, start: int) -> Ends:
    return frozenset().union(*(_ends(element, text, start) for element in fmt["elements"]))


def _tag(fmt: dict[str, Any], text: str, start: int) -> Ends:
    found: set[int] = set()
    for position in _literal(fmt["begin"], text, start):
        if position == _PARTIAL:
            found.add(_PARTIAL)
            continue
        end: str = fmt["end"]
        if fmt["content"]["type"] == "any_text" and end:
            # xgrammar: the body is any text up to the first occurrence of the end
            close = text.find(end, position)
            found.add(_PARTIAL if close < 0 else close + len(end))
            continue
        for body_end in _ends(fmt["content"], text, position):
            found |= {_PARTIAL} if body_end == _PARTIAL else _literal(end, text, body_end)
    return frozenset(found)


def _triggered(fmt: dict[str, Any], text: str, start: int) -> Ends:
    triggers: list[str] = fmt["triggers"]
    memo: dict[tuple[int, bool], Ends] = {}

    def from_(position: int, tagged: bool) -> Ends:
        key = (position, tagged)
        if key not in memo:
            memo[key] = _free_text(fmt, text, position, tagged, triggers, from_)
        return memo[key]

    return from_(start, False)


def _free_text(
    fmt: dict[str, Any],
    text: str,
    position: int,
    tagged: bool,
    triggers: list[str],
    again: Callable[[int, bool], Ends],
) -> Ends:
    hits = [(text.find(t, position), t) for t in triggers]
    hits = [(at, t) for at, t in hits if at >= 0]
    if not hits:  # free text to the end (it may still grow, or end here)
        done = tagged or not fmt.get("at_least_one", False)
        return frozenset({len(text), _PARTIAL} if done else {_PARTIAL})
    at, trigger = min(hits)
    found: set[int] = set()
    for tag in fmt["tags"]:
        if not tag["begin"].startswith(trigger):
            continue
        for end in _ends(tag, text, at):
            if end == _PARTIAL or fmt.get("stop_after_first", False):
                found.add(end)
            else:
                found |= again(end, True)
    return frozenset(found)


_MATCHERS: dict[str, Callable[[dict[str, Any], str, int], Ends]] = {
    "const_string": _const,
    "any_text": _any_text,
    "json_schema": _json,
    "sequence": _sequence,
    "or": _or,
    "tag": _tag,
    "triggered_tags": _triggered,
}


def _fits(value: Any, schema: Any) -> bool:
    """The parts of JSON Schema the simulator checks (module doc)."""
    if not isinstance(schema, dict):
        return schema is not False
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    if kinds and not any(_is(value, k) for k in kinds):
        return False
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        if any(name not in value for name in schema.get("required") or ()):
            return False
        return all(_fits(item, properties.get(name, True)) for name, item in value.items())
    if isinstance(value, list):
        return all(_fits(item, schema.get("items", True)) for item in value)
    return True


def _is(value: Any, kind: str) -> bool:
    checks: dict[str, Callable[[Any], bool]] = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    }
    check = checks.get(kind)
    return True if check is None else check(value)
