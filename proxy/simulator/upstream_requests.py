"""Where upstream's Responses request path differs from the proxy's request side.

The simulator renders `/v1/responses` prompts with the proxy's model of upstream
(`proxy.harmony.request.prepare_request`), which deliberately serves some valid requests upstream
gets wrong (`tests/fixtures/trtllm-prompts/*.expected_fixed.json`). To behave like the
unpatched server, the simulator puts upstream's behaviour back, in upstream's order
(`openai_responses` in openai_server.py, then `_construct_harmony_messages`: tools, then the
input items in order):

- `previous_response_id`: 400 "requires response storage" with postprocess workers; else 404
  "not found" (the simulator keeps no responses; upstream's 16-entry store is not modelled);
- a tool whose type is not `function`, `web_search_preview` or `code_interpreter`: 400
  "tool type X not supported" (fixture d12; the proxy also skips `web_search`, renders
  `namespace` tools);
- a `function` tool without `description`: 400 with openai-harmony's pydantic message (d28);
- a `function_call_output` item: 400 "No call message found for CALL_ID" — upstream looks the
  call up only among the previous response's outputs, and there is none (d13, d14);
- an input item of another type than message/function_call/function_call_output/reasoning:
  400 "Unknown input type: X"; a `reasoning` item without exactly one content part: 400 with an
  empty message (a bare `assert`);
- an assistant message in output form (`type: "message"`, `id`, `status`): silently dropped
  from the prompt (d29).

And the echo: upstream dumps openai's models by Python name (`async_`, `schema_`). Sans-IO.
"""

from __future__ import annotations

from typing import Any, Final

#: What `ToolDescription.new(name, None, …)` raises, as upstream reports it (pydantic 2.14).
NO_DESCRIPTION: Final = (
    "1 validation error for ToolDescription\ndescription\n  Input should be a valid string "
    "[type=string_type, input_value=None, input_type=NoneType]\n    For further information "
    "visit https://errors.pydantic.dev/2.14/v/string_type"
)
_SKIPPED_TOOLS: Final = frozenset({"web_search_preview", "code_interpreter"})
_ITEM_TYPES: Final = frozenset({"message", "function_call", "function_call_output", "reasoning"})


class UpstreamRejection(Exception):
    """Upstream answers this request with `status` and `message`."""

    def __init__(self, status: int, message: str, error_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type


def previous_response_rejection(body: Any, *, store: bool) -> UpstreamRejection | None:
    """How upstream answers a `previous_response_id` (module doc); None without one."""
    previous = body.get("previous_response_id") if isinstance(body, dict) else None
    if not isinstance(previous, str):
        return None
    if not store:
        message = (
            "'previous_response_id' requires response storage, which is disabled on this server."
        )
        return UpstreamRejection(400, message)
    return UpstreamRejection(
        404, f"Response with id '{previous}' not found.", "InvalidRequestError"
    )


def check_like_upstream(body: Any) -> None:
    """Raise `UpstreamRejection` where upstream rejects a request the proxy serves, or rejects
    it with other words (module doc). Shapes it does not know are left to `prepare_request`."""
    if not isinstance(body, dict):
        return
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            return
        kind = tool.get("type")
        if kind == "function":
            if tool.get("description") is None:
                raise UpstreamRejection(400, NO_DESCRIPTION)
        elif kind not in _SKIPPED_TOOLS:
            raise UpstreamRejection(400, f"tool type {kind} not supported")
    items = body.get("input")
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            return
        kind = item.get("type", "message")
        if kind not in _ITEM_TYPES:
            raise UpstreamRejection(400, f"Unknown input type: {kind}")
        if kind == "function_call_output":
            raise UpstreamRejection(400, f"No call message found for {item.get('call_id')}")
        content = item.get("content")
        if kind == "reasoning" and not (isinstance(content, list) and len(content) == 1):
            raise UpstreamRejection(400, "")


def as_upstream_renders(body: dict[str, Any]) -> dict[str, Any]:
    """The body without the items upstream silently drops (module doc); `body` itself when
    there are none."""
    items = body.get("input")
    if not isinstance(items, list):
        return body
    kept = [item for item in items if not _output_message(item)]
    return body if len(kept) == len(items) else {**body, "input": kept}


def _output_message(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("type") == "message"
        and item.get("role") == "assistant"
        and "id" in item
        and "status" in item
    )


def upstream_echo(echo: dict[str, Any]) -> dict[str, Any]:
    """The request echo with openai's Python field names, as upstream dumps it: `async_` in
    tools (d09), `schema_` in `text.format` (d17)."""
    result = dict(echo)
    tools = echo.get("tools")
    if isinstance(tools, list):
        result["tools"] = [_renamed(tool, "async", "async_") for tool in tools]
    text = echo.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        result["text"] = {**text, "format": _renamed(text["format"], "schema", "schema_")}
    return result


def _renamed(value: Any, old: str, new: str) -> Any:
    if not isinstance(value, dict):
        return value
    renamed = {(new if key == old else key): inner for key, inner in value.items()}
    if isinstance(renamed.get("tools"), list):  # a namespace's member tools
        renamed["tools"] = [_renamed(inner, old, new) for inner in renamed["tools"]]
    return renamed
