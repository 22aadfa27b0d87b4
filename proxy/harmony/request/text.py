"""`text` of a `/v1/responses` request: its echo, and `text.format` as upstream's guided decoding.

Upstream's Responses path (trtllm `ResponsesRequest.to_sampling_params` with the `gpt_oss`
reasoning parser's serving extension) turns `text.format` json_schema / json_object into a
structural tag that constrains only the final channel:

    {"type": "triggered_tags",
     "triggers": ["<|start|>assistant<|channel|>final<|message|>"],
     "tags": [{"type": "tag", "begin": <trigger>, "content": <content>, "end": ""}],
     "at_least_one": false, "stop_after_first": true}

with content `{"type": "json_schema", "json_schema": <schema>}` (json_object: the schema
`{"type": "object"}`); `sampling_params.guided_decoding` of fixture d17 records it. trtllm's
`/v1/completions` can express exactly that: its `CompletionRequest.response_format` accepts
`{"type": "structural_tag", "format": <xgrammar structural-tag format>}` and turns it into
`GuidedDecodingParams(structural_tag=response_format.model_dump_json(by_alias=True,
exclude_none=True))`, the very call the Responses path makes, so the engine gets the same string.
`text.format` of type `text` means no constraint. gpt-oss has no verbosity control: `text.verbosity`
"medium" (the default) is echoed, "low" and "high" are a 400, as OpenAI answers for such a model.

The echo is what OpenAI's spec and its own responses show: the plain-text format when
none is given (`{"format": {"type": "text"}}`), and no key for a value the request left unset
where the spec's type has no null (`verbosity`, a json_schema format's `description`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.harmony.constraint import check_schema
from proxy.harmony.request.check import (
    at,
    fail,
    missing,
    present,
    want_bool,
    want_choice,
    want_object,
    want_str,
)

#: The header gpt-oss writes when it opens its final answer; upstream triggers the constraint here.
FINAL_CHANNEL_START = "<|start|>assistant<|channel|>final<|message|>"

_VERBOSITIES = ("low", "medium", "high")
#: The format OpenAI echoes when the request sets none.
PLAIN_TEXT = {"type": "text"}


@dataclass(frozen=True, slots=True)
class TextConfig:
    """What `text` gives the proxy.

    `echo` is the response object's `text` (wire names: `schema`, not Python's `schema_`);
    `response_format` is the `/v1/completions` `response_format` (None: unconstrained).
    """

    echo: dict[str, Any]
    response_format: dict[str, Any] | None
    #: The structural-tag content the final answer must match (None: free text), for a
    #: `tool_choice` constraint to hold the final answer to as well (request/guided.py).
    final_content: dict[str, Any] | None = None
    #: `json_schema` / `json_object` when the final answer must be JSON, and its schema: what
    #: the output is checked against after the fact (constraint.py).
    json_kind: str | None = None
    schema: dict[str, Any] | None = None


def structural_tag(content: dict[str, Any]) -> dict[str, Any]:
    """Upstream's final-channel structural tag around `content`, keys in xgrammar's dump order."""
    return {
        "type": "triggered_tags",
        "triggers": [FINAL_CHANNEL_START],
        "tags": [{"type": "tag", "begin": FINAL_CHANNEL_START, "content": content, "end": ""}],
        "at_least_one": False,
        "stop_after_first": True,
    }


def read_text(value: Any) -> TextConfig:
    """Validate `text` (None when absent) and map `text.format` to guided decoding."""
    if value is None:
        return TextConfig(echo={"format": dict(PLAIN_TEXT)}, response_format=None)
    text = want_object(value, "text")
    verbosity = present(text, "verbosity")
    if verbosity is not None and want_choice(verbosity, "text.verbosity", _VERBOSITIES) != "medium":
        # OpenAI's answer for a model without verbosity control: refused, not ignored.
        fail(
            "text.verbosity",
            verbosity,
            "gpt-oss has no verbosity control; supported value is 'medium' (the default)",
            code="unsupported_value",
        )
    fmt = present(text, "format")
    echo_format, content = (dict(PLAIN_TEXT), None) if fmt is None else _read_format(fmt)
    # The openai `ResponseTextConfig` model's order, as upstream echoes it: format, verbosity,
    # then extras.
    echo: dict[str, Any] = {"format": echo_format}
    if verbosity is not None:
        echo["verbosity"] = verbosity
    echo.update((key, item) for key, item in text.items() if key not in ("format", "verbosity"))
    if content is None:
        return TextConfig(echo=echo, response_format=None)
    return TextConfig(
        echo=echo,
        response_format=_response_format(content),
        final_content=content,
        json_kind=echo_format["type"],
        schema=content["json_schema"],
    )


def _read_format(value: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    path = "text.format"
    fmt = want_object(value, path)
    kind = present(fmt, "type")
    if kind is None:
        missing(at(path, "type"))
    if kind == "text":
        return {**fmt, "type": "text"}, None
    if kind == "json_object":
        return {**fmt, "type": "json_object"}, {
            "type": "json_schema",
            "json_schema": {"type": "object"},
        }
    if kind != "json_schema":
        fail(
            at(path, "type"),
            kind,
            "supported values are 'text', 'json_schema' and 'json_object'",
            code="unsupported_value",
        )
    name = present(fmt, "name")
    if name is None:
        missing(at(path, "name"))
    want_str(name, at(path, "name"))
    schema = present(fmt, "schema")
    if schema is None:
        missing(at(path, "schema"))
    want_object(schema, at(path, "schema"))
    invalid = check_schema(schema)
    if invalid is not None:
        # What xgrammar would refuse to compile, and what the output could not be checked
        # against: a 400 before generation.
        fail(at(path, "schema"), schema, f"not a valid JSON Schema: {invalid}")
    description = present(fmt, "description")
    if description is not None:
        want_str(description, at(path, "description"))
    strict = present(fmt, "strict")
    if strict is not None:
        want_bool(strict, at(path, "strict"))
    # The openai model's field order (name, schema, type, description, strict) with wire names;
    # `description` left out when unset (the spec's type has no null), `strict` may be null.
    echo = {"name": name, "schema": schema, "type": "json_schema"}
    if description is not None:
        echo["description"] = description
    echo["strict"] = strict
    echo.update((key, item) for key, item in fmt.items() if key not in (*echo, "description"))
    return echo, {"type": "json_schema", "json_schema": schema}


def _response_format(content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "structural_tag", "format": structural_tag(content)}
