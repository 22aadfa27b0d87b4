"""The top-level fields of a `/v1/responses` body: validated once into a frozen `Fields`.

Accepted: every field of openai-python's `ResponseCreateParams` (3.57.0), Codex's
`client_metadata`, and the two extensions upstream's own `ResponsesRequest` declares
(`thinking_token_budget`, forwarded; `request_id`, ignored). Anything else — typically a
chat-completions parameter such as `seed`, `stop` or `frequency_penalty` — is a 400, as upstream
answers it (fixture d25). An unknown key inside an object (`reasoning.efort`) is refused the
same way (request/shapes.py). An explicit null means "unset", as on the OpenAI wire.

No field is ignored silently (docs/request-fields.md has the table): each is honoured (sampling,
reasoning effort, instructions, tools, text format, tool_choice, include, truncation,
`context_management` (request/compaction.py); `store`, `background`, `previous_response_id` and
`conversation` through the shell's response store), honoured as OpenAI's spec defines it where that
is all it asks (`service_tier`: the response names the tier used; `max_tool_calls`: the shell's
hosted MCP calls, the only built-in tools that run here, keep to it — server/hosted/), echoed where
it only labels the response (`metadata`, `user`, `safety_identifier`, `prompt_cache_key`, …), or
refused with a 400 naming it where honouring it is impossible and ignoring it would change what the
client gets: `prompt` (templates live on OpenAI's side), `moderation` (no moderation model here),
`access_programs`, `background` without `store`, and values gpt-oss does not have
(`reasoning.effort` other than low/medium/high, `reasoning.mode` other than standard,
`text.verbosity` other than medium). A
`previous_response_id` or `conversation` still in the body here means the store is off: the
shell resolves them from the store and renders the merged body without them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from proxy.errors import ClientError
from proxy.harmony.request.check import (
    at,
    check_json,
    check_shape,
    describe,
    fail,
    missing,
    present,
    shown,
    want_bool,
    want_choice,
    want_int,
    want_list,
    want_number,
    want_object,
    want_str,
    want_str_map,
)
from proxy.harmony.request.shapes import REQUEST

#: openai-python 3.57.0 `ResponseCreateParams` (`ResponseCreateParamsStreaming` keys).
RESPONSES_FIELDS = frozenset(
    [
        "access_programs",
        "background",
        "background_options",
        "context_management",
        "conversation",
        "image",
        "include",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "moderation",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
    ]
)
#: Fields real clients add (Codex: client_metadata) and upstream's own ResponsesRequest extras.
EXTRA_FIELDS = frozenset({"client_metadata", "thinking_token_budget", "request_id"})

# Accepted, and moot here (docs/request-fields.md): only their JSON kind is checked.
_MOOT_OBJECTS = ["background_options", "image", "client_metadata"]
#: Refused when set (module doc): what each would need that the proxy does not have.
_REFUSED = {
    "moderation": "this proxy runs no moderation model",
    "access_programs": "access programs are an OpenAI account feature",
}
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512
_CHAT_HINTS = {
    "messages": "use 'input'",
    "max_tokens": "use 'max_output_tokens'",
    "max_completion_tokens": "use 'max_output_tokens'",
    "response_format": "use 'text.format'",
    "reasoning_effort": "use 'reasoning.effort'",
}
#: OpenAI's `IncludeEnum` (openai-openapi 2.3.0): anything else is a 400, as OpenAI answers it.
INCLUDES = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
)
_EFFORTS = ("low", "medium", "high")  # gpt-oss's Harmony ReasoningEffort; others fail upstream
_SUMMARIES = ("auto", "concise", "detailed")
_CONTEXTS = ("auto", "current_turn", "all_turns")
_SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast", "ultrafast")
_MAX_TOKENS = 2**31 - 1
#: The ids of stored responses: `resp_` and up to 96 letters or digits (ours are 32 hex digits).
_RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9]{1,96}")

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Fields:
    """The top-level fields, validated; `input`, `tools` and `text` are checked by their readers."""

    model: str
    input: Any
    tools: Any
    text: Any
    stream: bool
    store: bool
    instructions: str | None
    effort: str | None
    reasoning: dict[str, Any] | None
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    temperature: float
    top_p: float
    max_output_tokens: int | None
    max_tool_calls: int | None
    metadata: dict[str, str] | None
    prompt_cache_key: str | None
    prompt_cache_retention: str | None
    safety_identifier: str | None
    service_tier: str
    top_logprobs: int
    truncation: str
    user: str | None
    thinking_token_budget: int | None
    include: tuple[str, ...] = ()
    background: bool = False


def read_fields(value: Any) -> Fields:
    """Validate the body's top level (module doc); `ClientError` 400 naming the field otherwise."""
    if not isinstance(value, dict):
        raise ClientError("The request body must be a JSON object.", code="invalid_type")
    check_json(value, "")
    body: dict[str, Any] = value
    for key in body:
        if key not in RESPONSES_FIELDS and key not in EXTRA_FIELDS:
            hint = _CHAT_HINTS.get(key, "it is not a parameter of the Responses API")
            raise ClientError(
                f"Unknown parameter: '{shown(key)}' ({describe(body[key])}): {hint}.",
                param=shown(key),
                code="unknown_parameter",
            )
    _reject_unservable(body)
    # Unknown keys inside the objects, as unknown fields above (request/shapes.py); `input` and
    # `tools` are walked by their readers.
    for key, node in REQUEST.items():
        check_shape(present(body, key), node, key)
    model = present(body, "model")
    if model is None:
        missing("model")
    if present(body, "input") is None:
        missing("input")
    for key in _MOOT_OBJECTS:
        _optional(body, key, want_object)
    _read_cache_options(present(body, "prompt_cache_options"))
    _read_stream_options(present(body, "stream_options"))
    include = tuple(
        want_choice(item, at("include", index), INCLUDES)
        for index, item in enumerate(_optional(body, "include", want_list) or [])
    )
    _optional(body, "request_id", want_str)
    effort, reasoning = _read_reasoning(present(body, "reasoning"))
    return Fields(
        model=want_str(model, "model"),
        input=body["input"],
        tools=present(body, "tools"),
        text=present(body, "text"),
        stream=_optional(body, "stream", want_bool) or False,
        store=_optional(body, "store", want_bool) is not False,
        instructions=_optional(body, "instructions", want_str),
        effort=effort,
        reasoning=reasoning,
        tool_choice=_read_tool_choice(present(body, "tool_choice")),
        # OpenAI's default is true (upstream echoes false). gpt-oss stops at its first
        # call (`<|call|>` is a stop token), so at most one call per response either way.
        parallel_tool_calls=_optional(body, "parallel_tool_calls", want_bool) is not False,
        temperature=_number(body, "temperature", 2.0),
        top_p=_number(body, "top_p", 1.0),
        max_output_tokens=_int(body, "max_output_tokens", 1, _MAX_TOKENS),
        max_tool_calls=_int(body, "max_tool_calls", 0, _MAX_TOKENS),
        metadata=read_metadata(present(body, "metadata")),
        prompt_cache_key=_optional(body, "prompt_cache_key", want_str),
        prompt_cache_retention=_choice(body, "prompt_cache_retention", ("in_memory", "24h")),
        safety_identifier=_read_safety_identifier(present(body, "safety_identifier")),
        service_tier=_choice(body, "service_tier", _SERVICE_TIERS) or "auto",
        top_logprobs=_int(body, "top_logprobs", 0, 20) or 0,
        truncation=_choice(body, "truncation", ("auto", "disabled")) or "disabled",
        user=_optional(body, "user", want_str),
        thinking_token_budget=_int(body, "thinking_token_budget", 0, _MAX_TOKENS),
        include=include,
        background=_optional(body, "background", want_bool) or False,
    )


def check_response_id(value: Any, path: str) -> str:
    """A response id as the proxy makes them (`resp_` + letters and digits), else a 400 naming
    `path` — before any store is asked (malformed → 400 `invalid_value`; unknown is a 400
    `previous_response_not_found` for `previous_response_id`, a 404 on a response's path)."""
    text = want_str(value, path)
    if not _RESPONSE_ID.fullmatch(text):
        fail(path, value, "expected an ID that begins with 'resp_'", code="invalid_value")
    return text


def previous_not_found(previous: str, why: str | None = None) -> ClientError:
    """OpenAI's answer to a `previous_response_id` it cannot continue from: 400
    `previous_response_not_found` (not a 404: the request, not its path, names it), in its
    words; `why` says what made a well-formed id unusable. `previous` is a checked id (at most
    101 characters)."""
    message = f"Previous response with id '{previous}' not found."
    if why is not None:
        message = f"{message[:-1]}: {why}."
    return ClientError(
        message, status=400, param="previous_response_id", code="previous_response_not_found"
    )


def _reject_unservable(body: dict[str, Any]) -> None:
    previous = present(body, "previous_response_id")
    if previous is not None:
        # Without a store no id is known: the client's cue to send the whole conversation.
        raise previous_not_found(
            check_response_id(previous, "previous_response_id"),
            "the response store is off on this proxy (store_url = off), so no "
            "'previous_response_id' can be continued; send the whole conversation in 'input'",
        )
    conversation = present(body, "conversation")
    if conversation is not None:
        fail(
            "conversation",
            conversation,
            "the response store is off on this proxy (store_url = off); send the whole "
            "conversation in 'input'",
            code="unsupported_parameter",
        )
    if present(body, "prompt") is not None:
        fail(
            "prompt",
            body["prompt"],
            "prompt templates are not supported",
            code="unsupported_parameter",
        )
    for key, reason in _REFUSED.items():
        value = present(body, key)
        if value is not None:
            fail(key, value, f"not supported: {reason}", code="unsupported_parameter")
    background = _optional(body, "background", want_bool)
    if background and _optional(body, "store", want_bool) is False:
        # OpenAI's rule: a background response lives in the store, or nowhere.
        fail("background", background, "background responses require 'store': true")


def _read_reasoning(value: Any) -> tuple[str | None, dict[str, Any] | None]:
    if value is None:
        return None, None
    reasoning = want_object(value, "reasoning")
    effort = present(reasoning, "effort")
    if effort is not None:
        want_choice(effort, "reasoning.effort", _EFFORTS)
    for key in ("summary", "generate_summary"):
        if present(reasoning, key) is not None:
            want_choice(reasoning[key], at("reasoning", key), _SUMMARIES)
    context = present(reasoning, "context")
    if context is not None:
        want_choice(context, at("reasoning", "context"), _CONTEXTS)
    mode = present(reasoning, "mode")
    if mode is not None:
        # Any string per the spec; gpt-oss has one mode, so any other is unsupported.
        want_choice(mode, at("reasoning", "mode"), ("standard",))
    # Echoed as upstream echoes the openai `Reasoning` model: its fields in order, then extras;
    # `mode` only when set (OpenAI's spec gives it no null).
    echo: dict[str, Any] = dict.fromkeys(
        ("context", "effort", "generate_summary", "mode", "summary")
    )
    echo.update(reasoning)
    if echo["mode"] is None:
        del echo["mode"]
    return effort, echo


def read_metadata(value: Any) -> dict[str, str] | None:
    """`metadata`: at most 16 pairs, keys up to 64 and values up to 512 characters (the spec)."""
    if value is None:
        return None
    metadata = want_str_map(value, "metadata")
    if len(metadata) > _METADATA_PAIRS:
        fail("metadata", value, f"at most {_METADATA_PAIRS} key-value pairs")
    for key, item in metadata.items():
        if len(key) > _METADATA_KEY:
            fail(at("metadata", key), key, f"keys are at most {_METADATA_KEY} characters")
        if len(item) > _METADATA_VALUE:
            fail(at("metadata", key), item, f"values are at most {_METADATA_VALUE} characters")
    return metadata


def _read_safety_identifier(value: Any) -> str | None:
    if value is None:
        return None
    identifier = want_str(value, "safety_identifier")
    if len(identifier) > 64:
        fail("safety_identifier", value, "at most 64 characters")
    return identifier


def _read_cache_options(value: Any) -> None:
    """`prompt_cache_options` (checked; caching is automatic here and cannot be steered)."""
    if value is None:
        return
    options = want_object(value, "prompt_cache_options")
    for key, choices in (("ttl", ("30m",)), ("mode", ("implicit", "explicit"))):
        if present(options, key) is not None:
            want_choice(options[key], at("prompt_cache_options", key), choices)


def _read_stream_options(value: Any) -> None:
    """`stream_options.include_obfuscation` (checked; no `obfuscation` field is part of the
    published delta events, so none is added)."""
    if value is None:
        return
    options = want_object(value, "stream_options")
    if present(options, "include_obfuscation") is not None:
        want_bool(options["include_obfuscation"], "stream_options.include_obfuscation")


def _read_tool_choice(value: Any) -> str | dict[str, Any]:
    """`tool_choice` does not change upstream's prompt: checked and echoed (request/guided.py
    enforces it)."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        return want_choice(value, "tool_choice", ("none", "auto", "required"))
    choice = want_object(value, "tool_choice")
    if present(choice, "type") is None:
        missing("tool_choice.type")
    want_str(choice["type"], "tool_choice.type")
    return choice


def _optional(body: dict[str, Any], key: str, reader: Callable[[Any, str], _T]) -> _T | None:
    value = present(body, key)
    return None if value is None else reader(value, key)


def _number(body: dict[str, Any], key: str, high: float) -> float:
    value = present(body, key)
    return 1.0 if value is None else want_number(value, key, low=0.0, high=high)


def _int(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = present(body, key)
    return None if value is None else want_int(value, key, low=low, high=high)


def _choice(body: dict[str, Any], key: str, choices: tuple[str, ...]) -> str | None:
    value = present(body, key)
    return None if value is None else want_choice(value, key, choices)
