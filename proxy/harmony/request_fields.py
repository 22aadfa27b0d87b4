"""The top-level fields of a `/v1/responses` body: validated once into a frozen `Fields`.

Accepted: every field of openai-python's `ResponseCreateParams` (3.57.0), Codex's
`client_metadata`, and the two extensions upstream's own `ResponsesRequest` declares
(`thinking_token_budget`, forwarded; `request_id`, ignored). Anything else — typically a
chat-completions parameter such as `seed`, `stop` or `frequency_penalty` — is a 400, as upstream
answers it (fixture d25). An explicit null means "unset", as on the OpenAI wire.

Fields are honoured where the proxy can (sampling, reasoning effort, instructions, tools, text
format), echoed where the response object carries them, and otherwise ignored — never forwarded
upstream. Those that cannot be honoured without silently changing the answer are rejected:
`previous_response_id` and `conversation` (the proxy keeps no responses yet), `background`
(needs that store), `prompt` (templates live on OpenAI's side; upstream rejects it too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from proxy.errors import ClientError
from proxy.harmony.request_check import (
    at,
    check_json,
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

# Accepted but not honoured: only their JSON kind is checked.
_IGNORED_OBJECTS = [
    "access_programs",
    "background_options",
    "image",
    "moderation",
    "prompt_cache_options",
    "stream_options",
    "client_metadata",
]
_CHAT_HINTS = {
    "messages": "use 'input'",
    "max_tokens": "use 'max_output_tokens'",
    "max_completion_tokens": "use 'max_output_tokens'",
    "response_format": "use 'text.format'",
    "reasoning_effort": "use 'reasoning.effort'",
}
_EFFORTS = ("low", "medium", "high")  # gpt-oss's Harmony ReasoningEffort; others fail upstream
_SUMMARIES = ("auto", "concise", "detailed")
_SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast", "ultrafast")
_MAX_TOKENS = 2**31 - 1

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
    model = present(body, "model")
    if model is None:
        missing("model")
    if present(body, "input") is None:
        missing("input")
    for key in _IGNORED_OBJECTS:
        _optional(body, key, want_object)
    _optional(body, "context_management", want_list)
    for index, item in enumerate(_optional(body, "include", want_list) or []):
        want_str(item, at("include", index))
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
        parallel_tool_calls=_optional(body, "parallel_tool_calls", want_bool) or False,
        temperature=_number(body, "temperature", 2.0),
        top_p=_number(body, "top_p", 1.0),
        max_output_tokens=_int(body, "max_output_tokens", 1, _MAX_TOKENS),
        max_tool_calls=_int(body, "max_tool_calls", 0, _MAX_TOKENS),
        metadata=_optional(body, "metadata", want_str_map),
        prompt_cache_key=_optional(body, "prompt_cache_key", want_str),
        prompt_cache_retention=_choice(body, "prompt_cache_retention", ("in_memory", "24h")),
        safety_identifier=_optional(body, "safety_identifier", want_str),
        service_tier=_choice(body, "service_tier", _SERVICE_TIERS) or "auto",
        top_logprobs=_int(body, "top_logprobs", 0, 20) or 0,
        truncation=_choice(body, "truncation", ("auto", "disabled")) or "disabled",
        user=_optional(body, "user", want_str),
        thinking_token_budget=_int(body, "thinking_token_budget", 0, _MAX_TOKENS),
    )


def _reject_unservable(body: dict[str, Any]) -> None:
    previous = present(body, "previous_response_id")
    if previous is not None:
        fail(
            "previous_response_id",
            previous,
            "this proxy keeps no responses yet; send the whole conversation in 'input'",
            code="unsupported_parameter",
        )
    conversation = present(body, "conversation")
    if conversation is not None:
        fail(
            "conversation",
            conversation,
            "this proxy keeps no conversations yet; send the whole conversation in 'input'",
            code="unsupported_parameter",
        )
    if present(body, "prompt") is not None:
        fail(
            "prompt",
            body["prompt"],
            "prompt templates are not supported",
            code="unsupported_parameter",
        )
    background = _optional(body, "background", want_bool)
    if background:
        store = _optional(body, "store", want_bool)
        problem = (
            "background responses require 'store': true"
            if store is False
            else "background responses need a response store, which this proxy does not keep yet"
        )
        fail("background", background, problem, code="unsupported_parameter")


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
    for key in ("context", "mode"):
        if present(reasoning, key) is not None:
            want_str(reasoning[key], at("reasoning", key))
    # Echoed as upstream echoes the openai `Reasoning` model: its fields in order, then extras.
    echo = dict.fromkeys(("context", "effort", "generate_summary", "mode", "summary"))
    echo.update(reasoning)
    return effort, echo


def _read_tool_choice(value: Any) -> str | dict[str, Any]:
    """`tool_choice` does not change upstream's prompt (trtllm-serve.md §3): checked and echoed."""
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
