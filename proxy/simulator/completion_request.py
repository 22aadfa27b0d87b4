"""`POST /v1/completions` bodies: upstream's `CompletionRequest`, validated and reduced to what
the simulator acts on.

`CompletionRequest` is a pydantic model with the fields, types and defaults of trtllm's
(openai_protocol.py, `extra="forbid"`), validated as FastAPI validates it (validation.py): first
the `mode="before"` model validators — pydantic runs them last-defined first: `suffix`, then
`stream_options` without `stream` — then the fields. Fields upstream types as models of their own
(`lora_request`, `response_format`, `disaggregated_params`, `conversation_params`) are taken as
objects here; `response_format` is read by guided.py. What the handler itself rejects
afterwards (`openai_completion` → `create_error_response`, 400) is `HandlerError`. Sans-IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from proxy.simulator import validation as v
from proxy.simulator.guided import Constraint, GuidedError, read_constraint


class _UpstreamModel(BaseModel):
    """Upstream's `OpenAIBaseModel`: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StreamOptions(_UpstreamModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class CompletionRequest(_UpstreamModel):
    """The body of `POST /v1/completions`, field for field as upstream declares it."""

    model: str
    prompt: list[int] | list[list[int]] | str | list[str]
    best_of: int | None = None
    echo: bool | None = False
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = None
    n: int = 1
    presence_penalty: float | None = 0.0
    seed: int | None = None
    stop: str | list[str] | None = Field(default_factory=list)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    lora_request: dict[str, Any] | None = None
    prompt_ignore_length: int | None = 0
    use_beam_search: bool = False
    top_k: int = 0
    top_p_min: float = 0.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    length_penalty: float | None = None
    early_stopping: bool | Literal["never"] | None = None
    stop_token_ids: list[int] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=1)] | None = None
    return_context_logits: bool = False
    detokenize: bool = True
    thinking_token_budget: int | None = None
    add_special_tokens: bool = True
    response_format: dict[str, Any] | None = None
    disaggregated_params: dict[str, Any] | None = None
    priority: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    conversation_params: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        # An empty `stream_options` is falsy: upstream lets it through.
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise ValueError("Stream options can only be defined when stream is true.")
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_suffix(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("suffix"):
            raise ValueError("suffix is not supported")
        return data


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
    request = v.validate_body(body, CompletionRequest)
    prompt = request.prompt
    if isinstance(prompt, list) and not prompt:
        raise HandlerError("list index out of range")  # upstream reads request.prompt[0]
    if isinstance(prompt, list) and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise HandlerError("the simulator serves one prompt per request, not a batch")
        prompt = prompt[0]
    if request.n != 1 or request.use_beam_search or (request.best_of or 1) != 1:
        raise HandlerError("the simulator serves n=1 without beam search or best_of")
    options = request.stream_options
    include_usage = bool(options and options.include_usage)
    return CompletionParams(
        model=request.model,
        prompt=prompt,
        stream=bool(request.stream),
        include_usage=include_usage,
        continuous_usage=include_usage and bool(options and options.continuous_usage_stats),
        detokenize=request.detokenize,
        max_tokens=request.max_tokens,
        stop_token_ids=frozenset(request.stop_token_ids or ()),
        include_stop_str_in_output=request.include_stop_str_in_output,
        ignore_eos=request.ignore_eos,
        skip_special_tokens=request.skip_special_tokens,
        logprobs=request.logprobs or None,
        echo=bool(request.echo),
        constraint=_constraint(request.response_format),
    )


def _constraint(response_format: dict[str, Any] | None) -> Constraint | None:
    try:
        return read_constraint(response_format)
    except GuidedError as exc:  # upstream: xgrammar's Format model rejects it, a 400
        raise HandlerError(str(exc)) from exc
