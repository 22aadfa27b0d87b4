"""Where the response object departs from upstream's recordings on purpose.

Upstream (trtllm-serve) echoes `null` where OpenAI's spec allows none, `parallel_tool_calls`
false by default, the requested `service_tier`, no `store`, no `completed_at`, `usage: null`
while in progress, and fields the spec does not define (openai-python's `async` of a function
tool). The proxy's response object follows the spec instead, and the simulator (a
stand-in for upstream) builds its objects with the same code. Tests that compare with upstream's
recordings pass both sides through `normalised`, which maps exactly those fields to one form and
leaves everything else — every other key, every value, the key order — to the comparison.
"""

from __future__ import annotations

import copy
from typing import Any

#: Top-level keys whose value differs by design (the spec's default or the value used).
_DIFFERENT = ("completed_at", "store", "service_tier", "parallel_tool_calls")
#: Top-level keys the spec gives no null: upstream sends null, the proxy leaves them out.
_NOT_NULLABLE = ("usage", "user", "prompt_cache_options")
#: Tool keys the spec does not define (openai-python's, upstream echoes them): the proxy's echo
#: holds only the spec's.
_NOT_IN_SPEC = ("async", "async_")
#: Tool keys the spec gives no null, per tool type: left out (None) or the spec's default.
_TOOL_UNSET: dict[str, dict[str, Any]] = {
    "function": {"defer_loading": None},
    "namespace": {"description": None},
    "web_search": {"external_web_access": True, "search_context_size": "medium"},
    "web_search_preview": {"search_context_size": None, "search_content_types": None},
}


def normalised(value: Any) -> Any:
    """A copy of an event, a response object or a request echo with those fields in one form
    (module doc)."""
    value = copy.deepcopy(value)
    if isinstance(value, dict) and isinstance(value.get("response"), dict):
        _response(value["response"])
    elif isinstance(value, dict):
        _response(value)
    return value


def _response(response: dict[str, Any]) -> None:
    for key in _DIFFERENT:
        response.pop(key, None)
    for key in _NOT_NULLABLE:
        if key in response and response[key] is None:
            del response[key]
    if "text" in response:
        response["text"] = _text(response["text"])
    reasoning = response.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("mode", "") is None:
        del reasoning["mode"]
    for tool in response.get("tools") or []:
        _tool(tool)


def _text(text: Any) -> Any:
    if text is None:
        return {"format": {"type": "text"}}
    if not isinstance(text, dict):
        return text
    if text.get("format") is None:
        text["format"] = {"type": "text"}
    if text.get("verbosity", "") is None:
        del text["verbosity"]
    if isinstance(text["format"], dict) and text["format"].get("description", "") is None:
        del text["format"]["description"]
    return text


def _tool(tool: Any) -> None:
    if not isinstance(tool, dict):
        return
    for key in _NOT_IN_SPEC:
        tool.pop(key, None)
    kind = str(tool.get("type"))
    family = "web_search_preview" if kind.startswith("web_search_preview") else kind
    family = "web_search" if family.startswith("web_search_2") else family
    for key, default in _TOOL_UNSET.get(family, {}).items():
        if key in tool and tool[key] is None:
            if default is None:
                del tool[key]
            else:
                tool[key] = default
    container = tool.get("container")
    if isinstance(container, dict):
        for key in ("file_ids", "network_policy"):
            if key in container and container[key] is None:
                del container[key]
    for member in tool.get("tools") or []:  # a namespace's functions
        _tool(member)
