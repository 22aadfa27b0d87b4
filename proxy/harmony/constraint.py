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

`jsonschema` and `regex` (with `referencing` and `rpds`, ~7 MB per process) are imported by the
first schema a request names (`proxy.harmony.schema`), not with this module: most proxies never
see one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

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

    def failure(self, enforced: bool) -> str:
        """The failed response's message: the code, how the output broke the constraint, and
        whether upstream enforced it (`enforced`) or it was checked after the fact. The
        response object's `error.code` is a closed set (`server_error` here), so the message
        carries the code too, for the non-streamed and stored object."""
        how = (
            "upstream enforced response_format"
            if enforced
            else "upstream does not enforce response_format; the output was checked after the fact"
        )
        return f"{CONSTRAINT_VIOLATED}: {self.message} ({how})"


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
        from proxy.harmony import schema as json_schema  # loads jsonschema (module doc)

        try:
            mismatch = json_schema.mismatch(self._schema_validator(), value)
        except json_schema.Unapplicable as exc:  # xgrammar would not compile it either
            return Violation(kind, f"text.format's schema cannot be applied: {str(exc)[:_SHOWN]}")
        except RecursionError:
            return Violation(kind, "the final answer is JSON nested too deeply to check")
        if mismatch is None:
            return None
        where, message = mismatch
        return Violation(
            kind,
            f"the final answer does not match text.format's schema at {where[:_SHOWN]}: "
            f"{message[:_SHOWN]}",
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
            from proxy.harmony import schema as json_schema

            schema = self.constraint.schema
            assert schema is not None
            self._validator = json_schema.validator(schema)
        return self._validator


def check_schema(schema: dict[str, Any]) -> str | None:
    """Why `schema` is no valid JSON Schema (None: it is one), for a 400 before generation
    (`proxy.harmony.schema`)."""
    from proxy.harmony import schema as json_schema  # loads jsonschema (module doc)

    return json_schema.check_schema(schema)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
