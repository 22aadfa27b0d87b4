"""A `/v1/responses` request → the prompt, sampling and echo trtllm-serve would use, or a 400.

Theory of operation. `parse_body` turns the raw bytes into a JSON object. `prepare_request` then
validates the whole body before anything is rendered (`check_json` once, then the top-level
fields, `tools`, `text`, `input`), renders the Harmony conversation exactly as upstream's
Responses path does (`_construct_harmony_messages` + `render_conversation_for_completion(...,
Role.ASSISTANT)` in trtllm's `responses_utils.py`):

    system     SystemContent.new() (+ with_reasoning_effort when `reasoning.effort` is set)
    developer  always present: `instructions` (when not null) and the tool namespaces
    input      the items of `input` (request_items.py)

and builds the `/v1/completions` body that asks upstream for the generated token ids of that
prompt with the sampling upstream's Responses path would use (trtllm-serve.md §2-3). Only fields
trtllm's `CompletionRequest` knows go into that body: it forbids unknown fields.

Sans-IO: no I/O, no logging. Prompts are never put into error messages beyond a short excerpt of
the offending value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from openai_harmony import (
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
)

from proxy.errors import ClientError
from proxy.harmony import tokens
from proxy.harmony.request_fields import Fields, read_fields
from proxy.harmony.request_items import input_messages
from proxy.harmony.request_text import read_text
from proxy.harmony.request_tools import ToolSet, read_tools

_EFFORTS = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}


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
    - `store`: the request's `store` (default true), for the response store of a later issue.
    """

    model: str
    stream: bool
    prompt_token_ids: list[int]
    completion_body: dict[str, Any]
    echo: dict[str, Any]
    namespaces: frozenset[str]
    function_names: frozenset[str] = frozenset()
    store: bool = True


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


def prepare_request(body: Any, encoding: HarmonyEncoding) -> PreparedRequest:
    """Validate a parsed `/v1/responses` body and render it (module doc); 4xx `ClientError` else."""
    fields = read_fields(body)
    toolset = read_tools(fields.tools)
    text = read_text(fields.text)
    messages = [
        _system_message(fields.effort),
        _developer_message(fields.instructions, toolset),
        *input_messages(fields.input),
    ]
    prompt = _render(encoding, messages)
    completion_body: dict[str, Any] = {
        "model": fields.model,
        "prompt": prompt,
        "stream": True,
        "detokenize": False,  # token ids are the only source of truth (trtllm-serve.md §2)
        "max_tokens": fields.max_output_tokens,
        "temperature": fields.temperature,
        "top_p": fields.top_p,
        "n": 1,
        # stop_tokens_for_assistant_actions(): without <|call|> a tool call would not stop.
        "stop_token_ids": list(tokens.ASSISTANT_ACTION_STOPS),
        "include_stop_str_in_output": True,
        "stream_options": {"include_usage": True},
    }
    if text.response_format is not None:
        completion_body["response_format"] = text.response_format
    if fields.thinking_token_budget is not None:
        completion_body["thinking_token_budget"] = fields.thinking_token_budget
    return PreparedRequest(
        model=fields.model,
        stream=fields.stream,
        prompt_token_ids=prompt,
        completion_body=completion_body,
        echo=_echo(fields, toolset, text.echo),
        namespaces=toolset.namespace_names,
        function_names=toolset.function_names,
        store=fields.store,
    )


def _system_message(effort: str | None) -> Message:
    content = SystemContent.new()
    if effort is not None:
        content = content.with_reasoning_effort(_EFFORTS[effort])
    return Message.from_role_and_content(Role.SYSTEM, content)


def _developer_message(instructions: str | None, toolset: ToolSet) -> Message:
    content = DeveloperContent.new()
    if instructions is not None:  # upstream: even "" renders an (empty) "# Instructions" section
        content = content.with_instructions(instructions)
    for namespace in toolset.namespaces:
        content = content.with_tools(namespace)
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _render(encoding: HarmonyEncoding, messages: list[Message]) -> list[int]:
    conversation = Conversation.from_messages(messages)
    try:
        return encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)
    except ValueError as exc:
        # openai-harmony raises ValueError for a conversation it cannot render. check_json has
        # already excluded every cause we know (NaN, surrogates, nesting past serde's limit), so
        # this guards the 400-or-nothing contract against causes we do not know yet.
        raise ClientError(
            f"The request cannot be rendered as a Harmony prompt: {exc}",
            param="input",
            code="invalid_value",
        ) from exc


def _echo(fields: Fields, toolset: ToolSet, text: dict[str, Any] | None) -> dict[str, Any]:
    """The response object's request-echo fields, as upstream's `ResponsesResponse.from_request`."""
    return {
        "instructions": fields.instructions,
        "metadata": fields.metadata,
        "parallel_tool_calls": fields.parallel_tool_calls,
        "temperature": fields.temperature,
        "tool_choice": fields.tool_choice,
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
        "service_tier": fields.service_tier,
        "text": text,
        "top_logprobs": fields.top_logprobs,
        "truncation": fields.truncation,
        "user": fields.user,
    }
