"""A `/v1/responses` request → the prompt, sampling and echo trtllm-serve would use, or a 400.

Theory of operation. `parse_body` turns the raw bytes into a JSON object. `prepare_request` then
validates the whole body before anything is rendered (`check_json` once, then the top-level
fields, `tools`, `text`, `input`), renders the Harmony conversation exactly as upstream's
Responses path does (`_construct_harmony_messages` + `render_conversation_for_completion(...,
Role.ASSISTANT)` in trtllm's `responses_utils.py`):

    system     SystemContent.new() (+ with_reasoning_effort when `reasoning.effort` is set)
    developer  always present: `instructions` (when not null) and the tool namespaces
    input      the items of `input` (request/items.py)

(request/prefix.py: given a `PrefixCache`, the system + developer ids of an agent are rendered
once and reused, token for token the same) and builds the `/v1/completions` body that asks
upstream for the generated token ids of that prompt with the sampling upstream's Responses path
would use (its stop tokens `<|return|>` and `<|call|>`, kept in the output). Only fields trtllm's
`CompletionRequest` knows go into that body: it forbids unknown fields.

Sans-IO: no I/O, no logging. Prompts are never put into error messages beyond a short excerpt of
the offending value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from openai_harmony import HarmonyEncoding, Message

from proxy.errors import ClientError
from proxy.harmony import tokens
from proxy.harmony.constraint import OutputConstraint
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request.check import spec_only
from proxy.harmony.request.compaction import read_context_management
from proxy.harmony.request.fields import Fields, read_fields
from proxy.harmony.request.fit import fit_prompt
from proxy.harmony.request.guided import output_constraint, tool_choice_format
from proxy.harmony.request.items import input_messages
from proxy.harmony.request.prefix import PrefixCache, render_prompt
from proxy.harmony.request.shapes import TOOL_CHOICE
from proxy.harmony.request.text import read_text
from proxy.harmony.request.tools import ToolSet, read_tools


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """Everything the proxy needs to serve one valid `/v1/responses` request.

    - `model`: the request's `model`.
    - `stream`: whether the client asked for SSE (`stream: true`).
    - `prompt_token_ids`: the Harmony prompt, ending in `<|start|>assistant`.
    - `completion_body`: the exact JSON body for upstream `POST /v1/completions`.
    - `echo`: request-echo fields of the response object in wire names; overrides `DEFAULT_ECHO`
      of `proxy.harmony.response`.
    - `namespaces`: names of declared `namespace` tools (without `functions`): a call the model
      addresses to `NS.fn` becomes a function call `fn` in namespace `NS`.
    - `function_names`: names of the tools in the default `functions` namespace.
    - `store`: the request's `store` (default true): whether the shell keeps the response.
    - `sealed_reasoning`: the request includes `reasoning.encrypted_content`: reasoning items
      carry their text sealed (reasoning_seal.py).
    - `top_logprobs`: the request includes `message.output_text.logprobs`: output text carries
      token logprobs with this many alternatives each (None: no logprobs).
    - `constraint`: what `tool_choice` and `text.format` demand of the output (constraint.py;
      None: nothing). `completion_body` carries its guided decoding as `response_format`,
      which only an upstream with a guided-decoding backend enforces.
    - `leading`: output items the response carries before the generated ones: the compaction
      the shell made for it (request/compaction.py; set by the shell, never here).
    """

    model: str
    stream: bool
    prompt_token_ids: list[int]
    completion_body: dict[str, Any]
    echo: dict[str, Any]
    namespaces: frozenset[str]
    function_names: frozenset[str] = frozenset()
    store: bool = True
    sealed_reasoning: bool = False
    top_logprobs: int | None = None
    constraint: OutputConstraint | None = None
    leading: tuple[dict[str, Any], ...] = ()


#: The include that asks for token logprobs.
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def parse_body(raw: bytes) -> Any:
    """Parse a request body: a JSON object, else `ClientError` 400 (invalid JSON or UTF-8)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ClientError(
            f"The request body is not valid JSON: {exc}.", param=None, code="invalid_json"
        ) from exc
    if not isinstance(body, dict):
        raise ClientError(
            "The request body must be a JSON object.", param=None, code="invalid_json"
        )
    return body


def prepare_request(
    body: Any,
    encoding: HarmonyEncoding,
    *,
    prefixes: PrefixCache | None = None,
    reasoning_keys: ReasoningKeys | None = None,
    max_prompt_tokens: int | None = None,
) -> PreparedRequest:
    """Validate a parsed `/v1/responses` body and render it (module doc); 4xx `ClientError` else.

    `prefixes`: a cache of rendered system + developer messages for `encoding`, owned by whoever
    owns the encoding; the prompt ids are the same with or without it, only faster on a hit.
    A cache of another encoding is our misuse: `ValueError`, not a 400. `reasoning_keys` open
    the sealed reasoning of input items (None: left unread, as upstream does).
    `max_prompt_tokens`: the model's context; the prompt and `max_output_tokens` must fit it, or
    `truncation` drops the oldest input items (request/fit.py; None: no limit, as upstream's
    rendering has none).
    """
    if prefixes is not None and prefixes.encoding is not encoding:
        raise ValueError("the prefix cache belongs to another HarmonyEncoding")
    fields = read_fields(body)
    read_context_management(body.get("context_management"))  # the shell acts on it
    toolset = read_tools(fields.tools)
    text = read_text(fields.text)
    # tool_choice as guided decoding (request/guided.py), holding the final answer to
    # text.format too; with "auto" only text.format's own constraint, as upstream sends it.
    guided = tool_choice_format(fields.tool_choice, toolset, text.final_content)
    if guided is None:
        guided = text.response_format
    context = (fields.reasoning or {}).get("context")
    inputs = input_messages(fields.input, reasoning_keys, current_turn=context == "current_turn")

    def render(messages: Sequence[Message]) -> list[int]:
        return render_prompt(
            encoding, fields.effort, fields.instructions, toolset, messages, prefixes
        )

    try:
        prompt = fit_prompt(
            encoding,
            inputs,
            render,
            context=max_prompt_tokens,
            max_output_tokens=fields.max_output_tokens,
            truncation=fields.truncation,
        )
    except ValueError as exc:
        # openai-harmony raises ValueError for a conversation it cannot render. check_json has
        # already excluded every cause we know (NaN, surrogates, nesting past serde's limit), so
        # this guards the 400-or-nothing contract against causes we do not know yet.
        raise ClientError(
            f"The request cannot be rendered as a Harmony prompt: {exc}",
            param="input",
            code="invalid_value",
        ) from exc
    completion_body: dict[str, Any] = {
        "model": fields.model,
        "prompt": prompt,
        "stream": True,
        # Token ids are the only source of truth: upstream's text cannot be mapped back to ids.
        "detokenize": False,
        "max_tokens": fields.max_output_tokens,
        "temperature": fields.temperature,
        "top_p": fields.top_p,
        "n": 1,
        # stop_tokens_for_assistant_actions(): without <|call|> a tool call would not stop.
        "stop_token_ids": list(tokens.ASSISTANT_ACTION_STOPS),
        "include_stop_str_in_output": True,
        "stream_options": {"include_usage": True},
    }
    if guided is not None:
        completion_body["response_format"] = guided
    if fields.thinking_token_budget is not None:
        completion_body["thinking_token_budget"] = fields.thinking_token_budget
    top_logprobs = fields.top_logprobs if LOGPROBS_INCLUDE in fields.include else None
    if top_logprobs is not None:
        # `logprobs: N` carries the N best: trtllm-serve ranks its top N on their own and puts
        # the sampled token in front of them, as an extra entry when it is not one of them
        # (N + 1 entries), so the sampled token never takes one of the N places (the core sorts
        # them, logprobs.py). At least 1: upstream gives a token's own logprob only with
        # `logprobs` ≥ 1. Without the include nothing is asked.
        completion_body["logprobs"] = max(1, top_logprobs)
    return PreparedRequest(
        model=fields.model,
        stream=fields.stream,
        prompt_token_ids=prompt,
        completion_body=completion_body,
        echo=_echo(fields, toolset, text.echo),
        namespaces=toolset.namespace_names,
        function_names=toolset.function_names,
        store=fields.store,
        sealed_reasoning="reasoning.encrypted_content" in fields.include,
        top_logprobs=top_logprobs,
        constraint=output_constraint(fields.tool_choice, toolset, text),
    )


def _echo(fields: Fields, toolset: ToolSet, text: dict[str, Any]) -> dict[str, Any]:
    """The response object's request-echo fields, as upstream's `ResponsesResponse.from_request`
    with OpenAI's echo where it differs: `store` echoed, `service_tier` the tier used
    (set by `response_object`), no null where the spec's type has none."""
    return {
        "instructions": fields.instructions,
        "metadata": fields.metadata,
        "parallel_tool_calls": fields.parallel_tool_calls,
        "temperature": fields.temperature,
        # Without this proxy's own keys (a function's `namespace`): the spec's fields only.
        "tool_choice": spec_only(fields.tool_choice, TOOL_CHOICE),
        "tools": toolset.echo,
        "top_p": fields.top_p,
        "background": False,
        "conversation": None,
        "max_output_tokens": fields.max_output_tokens,
        "max_tool_calls": fields.max_tool_calls,
        "previous_response_id": None,
        "prompt": None,
        "prompt_cache_key": fields.prompt_cache_key,
        "prompt_cache_retention": fields.prompt_cache_retention,
        "reasoning": fields.reasoning,
        "safety_identifier": fields.safety_identifier,
        "store": fields.store,
        "text": text,
        "top_logprobs": fields.top_logprobs,
        "truncation": fields.truncation,
        "user": fields.user,
    }
