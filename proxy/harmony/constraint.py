"""What a request's `tool_choice` and `text.format` demand of the output, and the check that holds
the generated output to it after the fact. Sans-IO.

Guided decoding (request/guided.py, request/text.py) makes the engine unable to break these
constraints — when upstream enforces `response_format`. A trtllm-serve started without a
guided-decoding backend takes the same `response_format` and ignores it (200, free text), so the
core also checks what the model wrote, as it parses it (`ConstraintCheck`, driven by
stream/machine.py and stream/repair.py):

    at each completed header      a recipient must be one the choice allows (a call under
                                  "none", or to another function, breaks it); a final answer
                                  must be allowed ("required", a named function and
                                  allowed_tools in mode "required" allow none)
    at each final answer's end    its text must be one JSON value, valid against text.format's
                                  schema (json_object: any object), checked with `jsonschema`
    at the end of generation      (finish "stop") a choice that requires a call must have had one

A generation cut by `max_output_tokens` ends `incomplete` and is not checked at its end: the
engine's grammar allows any prefix of a match too. The first violation is returned as data
(`Violation`); the core stops parsing there and the shell ends the response `failed` with
`CONSTRAINT_VIOLATED`. The same check runs when upstream does enforce: a header constraint cannot
stop gpt-oss from ending after its reasoning under "required", and the check costs one lookup
per message header and one JSON parse per final answer.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import jsonschema.validators
import orjson
import regex
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing.exceptions import Unresolvable

#: The `error` event's code when the output broke its constraint.
CONSTRAINT_VIOLATED = "constraint_violated"
#: The `param`-style names of the constraints (metric label values: a small fixed set).
TOOL_CHOICE_KINDS = {
    "none": "tool_choice_none",
    "required": "tool_choice_required",
    "function": "tool_choice_function",
    "allowed_tools": "tool_choice_allowed_tools",
}
TEXT_KINDS = ("json_schema", "json_object")
CONSTRAINT_KINDS = (*TOOL_CHOICE_KINDS.values(), *TEXT_KINDS)
#: Channels whose messages are never the answer (reasoning, preambles).
_NOT_ANSWERS = frozenset({"analysis", "commentary"})
_SHOWN = 200  # characters of a validation message quoted back


@dataclass(frozen=True, slots=True)
class OutputConstraint:
    """The constraints of one request (None of either kind: the request has none).

    - `tool_kind`: which `tool_choice` constrains the calls (a `TOOL_CHOICE_KINDS` value), None
      for "auto"; `choice` names it in messages ("tool_choice 'none'").
    - `final_allowed`: a final answer (or any text on the final channel) is allowed.
    - `recipients`: the recipients a call may address (`functions.f`, `NS.f`).
    - `call_required`: the response must make a call.
    - `text_kind`: `json_schema` / `json_object` when `text.format` asks for JSON, with `schema`
      (json_object: `{"type": "object"}`).
    """

    tool_kind: str | None = None
    choice: str = ""
    final_allowed: bool = True
    recipients: frozenset[str] = frozenset()
    call_required: bool = False
    text_kind: str | None = None
    schema: dict[str, Any] | None = None
    #: Whether holding the output to it needs the engine: `tool_choice: "none"` with no
    #: callable tool declared asks nothing the model does not already do (no function is in
    #: its prompt), so the check after the fact is enough even where upstream enforces nothing.
    engine_needed: bool = True

    @property
    def kind(self) -> str:
        """The first constraint of the request (tool_choice before text.format)."""
        kind = self.tool_kind or self.text_kind
        assert kind is not None  # an OutputConstraint constrains something
        return kind

    @property
    def param(self) -> str:
        """The request field of `kind`, for an error's `param`."""
        return "tool_choice" if self.tool_kind is not None else "text.format"

    def describe(self) -> str:
        """The constraints in words: "tool_choice 'none' and text.format json_schema"."""
        parts = [self.choice] if self.tool_kind is not None else []
        if self.text_kind is not None:
            parts.append(f"text.format {self.text_kind}")
        return " and ".join(parts)


@dataclass(frozen=True, slots=True)
class Violation:
    """The output broke the constraint `kind` (a `CONSTRAINT_KINDS` value); `message` says how."""

    kind: str
    message: str


@dataclass(slots=True)
class ConstraintCheck:
    """The after-the-fact check of one response's output (module doc)."""

    constraint: OutputConstraint
    called: bool = False
    _validator: Any = field(default=None, repr=False)

    def header(self, channel: str | None, recipient: str | None) -> Violation | None:
        """A completed assistant header: is this message allowed?"""
        constraint = self.constraint
        if constraint.tool_kind is None:
            return None
        if recipient:
            if recipient in constraint.recipients:
                self.called = True
                return None
            allowed = ", ".join(sorted(constraint.recipients)) or "no tool"
            return Violation(
                constraint.tool_kind,
                f"the model called {recipient[:_SHOWN]!r}, which {constraint.choice} does not "
                f"allow (allowed: {allowed})",
            )
        if channel in _NOT_ANSWERS or constraint.final_allowed:
            return None
        return Violation(
            constraint.tool_kind,
            f"the model answered in text, but {constraint.choice} requires a function call",
        )

    def final(self, text: str) -> Violation | None:
        """A final answer ended: does its text hold to text.format?"""
        constraint = self.constraint
        if constraint.text_kind is None or constraint.schema is None:
            return None
        kind = constraint.text_kind
        try:
            value = json.loads(text, parse_constant=_no_constant)
        except ValueError as exc:
            return Violation(kind, f"the final answer is not JSON ({exc})")
        except RecursionError:  # the decoder's own limit: bad model output, not our fault
            return Violation(kind, "the final answer is JSON nested too deeply to check")
        try:
            error = best_match(self._schema_validator().iter_errors(value))
        except (SchemaError, Unresolvable) as exc:  # xgrammar would not compile it either
            return Violation(kind, f"text.format's schema cannot be applied: {str(exc)[:_SHOWN]}")
        except RecursionError:
            return Violation(kind, "the final answer is JSON nested too deeply to check")
        if error is None:
            return None
        where = error.json_path
        return Violation(
            kind,
            f"the final answer does not match text.format's schema at {where[:_SHOWN]}: "
            f"{error.message[:_SHOWN]}",
        )

    def end(self, finish_reason: str) -> Violation | None:
        """Generation ended with `finish_reason`: was a required call made?"""
        constraint = self.constraint
        if finish_reason != "stop" or not constraint.call_required or self.called:
            return None
        assert constraint.tool_kind is not None
        return Violation(
            constraint.tool_kind,
            f"the model ended without the function call {constraint.choice} requires",
        )

    def _schema_validator(self) -> Any:
        if self._validator is None:
            schema = self.constraint.schema
            assert schema is not None
            self._validator = _validator_class(schema)(schema)
        return self._validator


def check_schema(schema: dict[str, Any]) -> str | None:
    """Why `schema` is no valid JSON Schema (None: it is one), for a 400 before generation.

    Checking a schema against its meta-schema costs ~2.5 ms; an agent sends the same schema
    on every call, so the verdicts of the last `_SCHEMAS` schemas (by their JSON) are kept."""
    return _schema_problem(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))


_SCHEMAS = 256


@functools.lru_cache(maxsize=_SCHEMAS)
def _schema_problem(text: bytes) -> str | None:
    schema = orjson.loads(text)
    try:
        _validator_class(schema).check_schema(schema)
    except SchemaError as exc:
        return exc.message[:_SHOWN]
    return None


#: The drafts a schema may name in `$schema`; any other (or none) is read as Draft 2020-12, the
#: draft OpenAI's structured outputs follow (`validator_for` would warn for an unknown one).
_DRAFTS = {
    str(cls.META_SCHEMA["$schema" if "$schema" in cls.META_SCHEMA else "id"]).rstrip("#"): cls
    for cls in (
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
        jsonschema.Draft201909Validator,
        jsonschema.Draft202012Validator,
    )
}


def _validator_class(schema: dict[str, Any]) -> Any:
    named = schema.get("$schema")
    found = _DRAFTS.get(named.rstrip("#")) if isinstance(named, str) else None
    return _BOUNDED[found or jsonschema.Draft202012Validator]


#: Seconds one `pattern` / `patternProperties` search of a client's regex may take. The
#: patterns come from the request: with Python's `re`, `^(a+)+$` against 30 `a`s and a `!`
#: backtracks for minutes, on the event loop. The `regex` module stops a search at a timeout.
PATTERN_SECONDS = 0.05


@functools.lru_cache(maxsize=_SCHEMAS)
def _compiled(pattern: str) -> Any:
    return regex.compile(pattern)


def _search(pattern: str, text: str) -> bool:
    """Whether `pattern` matches in `text`; raises ValidationError if it cannot be told in
    `PATTERN_SECONDS` or the pattern is no regex."""
    try:
        return _compiled(pattern).search(text, timeout=PATTERN_SECONDS) is not None
    except TimeoutError:
        raise ValidationError(
            f"the pattern {pattern[:_SHOWN]!r} takes too long to check (over "
            f"{PATTERN_SECONDS:g} s: catastrophic backtracking)"
        ) from None
    except regex.error as exc:
        raise ValidationError(f"the pattern {pattern[:_SHOWN]!r} is no regex ({exc})") from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "string"):
        return
    try:
        if not _search(pattern, instance):
            yield ValidationError(f"{instance[:_SHOWN]!r} does not match {pattern[:_SHOWN]!r}")
    except ValidationError as error:
        yield error


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                matched = _search(pattern, key)
            except ValidationError as error:
                yield error
                return
            if matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


#: Each draft's validator with the two regex keywords bounded in time (`PATTERN_SECONDS`).
_EXTEND: Any = jsonschema.validators.extend  # untyped in types-jsonschema
_BOUNDED = {
    cls: _EXTEND(cls, {"pattern": _pattern, "patternProperties": _pattern_properties})
    for cls in _DRAFTS.values()
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
