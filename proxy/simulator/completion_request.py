"""`POST /v1/completions` bodies: upstream's `CompletionRequest`, validated and reduced to what
the simulator acts on.

The fields, types and defaults are those of trtllm's `CompletionRequest` (openai_protocol.py,
`extra="forbid"`), checked in the same order: the `mode="before"` model validators (pydantic runs
them last-defined first: `suffix`, then `stream_options` without `stream`), then the fields. What
the handler itself rejects afterwards (`openai_completion` → `create_error_response`, 400) is
`HandlerError`. Sans-IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from proxy.simulator import validation as v
from proxy.simulator.guided import Constraint, GuidedError, read_constraint

_STREAM_OPTIONS = v.model(
    "StreamOptions",
    {
        "include_usage": v.Field(v.optional(v.v_bool), True),
        "continuous_usage_stats": v.Field(v.optional(v.v_bool), False),
    },
)

_PROMPT = v.union(
    ("list[int]", v.list_of(v.v_int)),
    ("list[list[int]]", v.list_of(v.list_of(v.v_int))),
    ("str", v.v_str),
    ("list[str]", v.list_of(v.v_str)),
)

_OPT_INT = v.optional(v.v_int)
_OPT_FLOAT = v.optional(v.v_float)
_OPT_BOOL = v.optional(v.v_bool)
_OPT_DICT = v.optional(v.v_any_dict)

FIELDS: Final = {
    "model": v.Field(v.v_str),
    "prompt": v.Field(_PROMPT),
    "best_of": v.Field(_OPT_INT, None),
    "echo": v.Field(_OPT_BOOL, False),
    "frequency_penalty": v.Field(_OPT_FLOAT, 0.0),
    "logit_bias": v.Field(v.optional(v.dict_of(v.v_float)), None),
    "logprobs": v.Field(_OPT_INT, None),
    "max_tokens": v.Field(_OPT_INT, None),
    "n": v.Field(v.v_int, 1),
    "presence_penalty": v.Field(_OPT_FLOAT, 0.0),
    "seed": v.Field(_OPT_INT, None),
    "stop": v.Field(v.optional(v.union(("str", v.v_str), ("list[str]", v.list_of(v.v_str)))), []),
    "stream": v.Field(_OPT_BOOL, False),
    "stream_options": v.Field(v.optional(_STREAM_OPTIONS), None),
    "suffix": v.Field(v.optional(v.v_str), None),
    "temperature": v.Field(_OPT_FLOAT, None),
    "top_p": v.Field(_OPT_FLOAT, None),
    "user": v.Field(v.optional(v.v_str), None),
    "lora_request": v.Field(_OPT_DICT, None),
    "prompt_ignore_length": v.Field(_OPT_INT, 0),
    "use_beam_search": v.Field(v.v_bool, False),
    "top_k": v.Field(v.v_int, 0),
    "top_p_min": v.Field(v.v_float, 0.0),
    "min_p": v.Field(v.v_float, 0.0),
    "repetition_penalty": v.Field(v.v_float, 1.0),
    "length_penalty": v.Field(_OPT_FLOAT, None),
    "early_stopping": v.Field(
        v.optional(v.union(("bool", v.v_bool), ("literal['never']", v.literal("never")))), None
    ),
    "stop_token_ids": v.Field(v.optional(v.list_of(v.v_int)), []),
    "include_stop_str_in_output": v.Field(v.v_bool, False),
    "ignore_eos": v.Field(v.v_bool, False),
    "min_tokens": v.Field(v.v_int, 0),
    "skip_special_tokens": v.Field(v.v_bool, True),
    "spaces_between_special_tokens": v.Field(v.v_bool, True),
    "truncate_prompt_tokens": v.Field(v.optional(v.bounded(v.v_int, ge=1)), None),
    "return_context_logits": v.Field(v.v_bool, False),
    "detokenize": v.Field(v.v_bool, True),
    "thinking_token_budget": v.Field(_OPT_INT, None),
    "add_special_tokens": v.Field(v.v_bool, True),
    "response_format": v.Field(_OPT_DICT, None),
    "disaggregated_params": v.Field(_OPT_DICT, None),
    "priority": v.Field(v.optional(v.bounded(v.v_float, ge=0.0, le=1.0)), None),
    "conversation_params": v.Field(_OPT_DICT, None),
}

_REQUEST = v.model("CompletionRequest", FIELDS)


class HandlerError(Exception):
    """A request the handler rejects after validation: 400 `BadRequestError` with this text."""


@dataclass(frozen=True, slots=True)
class CompletionParams:
    """What the simulator does with a valid completion request."""

    model: str
    prompt: list[int] | str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    detokenize: bool
    max_tokens: int | None
    stop_token_ids: frozenset[int]
    include_stop_str_in_output: bool
    ignore_eos: bool
    skip_special_tokens: bool
    logprobs: int | None
    echo: bool
    #: The guided-decoding constraint of `response_format` (guided.py), None: unconstrained.
    constraint: Constraint | None = None


def read_completion_request(body: Any) -> CompletionParams:
    """Validate a parsed body; `RequestValidationError` (400 `{"error": …}`) or `HandlerError`."""
    if isinstance(body, dict):
        if body.get("suffix"):
            raise v.value_error(body, "suffix is not supported")
        if body.get("stream_options") and not body.get("stream"):
            raise v.value_error(body, "Stream options can only be defined when stream is true.")
    fields = v.validate_body(body, _REQUEST)
    prompt = fields["prompt"]
    if isinstance(prompt, list) and not prompt:
        raise HandlerError("list index out of range")  # upstream reads request.prompt[0]
    if isinstance(prompt, list) and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise HandlerError("the simulator serves one prompt per request, not a batch")
        prompt = prompt[0]
    if fields["n"] != 1 or fields["use_beam_search"] or (fields["best_of"] or 1) != 1:
        raise HandlerError("the simulator serves n=1 without beam search or best_of")
    options = fields["stream_options"]
    include_usage = bool(options and options["include_usage"])
    return CompletionParams(
        model=fields["model"],
        prompt=prompt,
        stream=bool(fields["stream"]),
        include_usage=include_usage,
        continuous_usage=include_usage and bool(options and options["continuous_usage_stats"]),
        detokenize=fields["detokenize"],
        max_tokens=fields["max_tokens"],
        stop_token_ids=frozenset(fields["stop_token_ids"] or ()),
        include_stop_str_in_output=fields["include_stop_str_in_output"],
        ignore_eos=fields["ignore_eos"],
        skip_special_tokens=fields["skip_special_tokens"],
        logprobs=fields["logprobs"] or None,
        echo=bool(fields["echo"]),
        constraint=_constraint(fields["response_format"]),
    )


def _constraint(response_format: dict[str, Any] | None) -> Constraint | None:
    try:
        return read_constraint(response_format)
    except GuidedError as exc:  # upstream: xgrammar's Format model rejects it, a 400
        raise HandlerError(str(exc)) from exc
