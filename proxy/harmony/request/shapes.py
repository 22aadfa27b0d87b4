"""The keys each object inside a `/v1/responses` request may have: one table.

An unknown key inside a known request object — `reasoning`, `text` and `text.format`, an input
item and its content parts, a tool, `tool_choice`, `conversation`, `prompt_cache_options`,
`stream_options`, … — is refused as an unknown top-level field is: a 400 `unknown_parameter`
naming its dotted path (`reasoning.k…`, at most 200 characters of it). Accepted, it would carry
a client's bytes into the response object, whose echo holds only what OpenAI's spec defines,
and hide a typo (`reasoning.efort`) behind a default. `check.check_shape` walks a value
with its node here; the readers (request/fields.py, items.py, tools.py, text.py) check the values.

Each `Shape` lists `keys`, the properties OpenAI's OpenAPI description (2.3.0) gives the
component schemas in `spec`; `extra`, the keys real clients send that the spec lacks — fields
of openai-python's (3.57.0) request types for the same object; `own`, this proxy's extensions.
tests/test_request_shapes.py holds each shape to the spec and walks openai-python's request
types beside the table, so neither can drift.
Free-form values (JSON schemas, `metadata`) are not walked; an object of a kind the table does
not know is left to its reader.

Names are written space-separated (`_shape`): a table, not code.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.harmony.request.check import Kinds, Many, Node, Shape


def _shape(
    what: str,
    keys: str,
    spec: str,
    *,
    extra: str = "",
    own: str = "",
    inner: Mapping[str, Node] | None = None,
) -> Shape:
    return Shape(
        what,
        frozenset(keys.split()),
        tuple(spec.split()),
        frozenset(extra.split()),
        frozenset(own.split()),
        inner or {},
    )


# -- content parts ---------------------------------------------------------------------------

_BREAKPOINT = _shape(
    "'prompt_cache_breakpoint'", "mode", "PromptCacheBreakpointConfig", extra="ttl"
)
_INPUT_TEXT = _shape(
    "an 'input_text' content part",
    "type text prompt_cache_breakpoint",
    "InputTextContent InputTextContentParam",
    inner={"prompt_cache_breakpoint": _BREAKPOINT},
)
_TOP_LOGPROB = _shape("a top logprob", "token logprob bytes", "TopLogProb")
_LOGPROB = _shape(
    "a logprob",
    "token logprob bytes top_logprobs",
    "LogProb",
    inner={"top_logprobs": Many(_TOP_LOGPROB)},
)
_ANNOTATION = Kinds(
    {
        "file_citation": _shape(
            "a 'file_citation' annotation", "type file_id filename index", "FileCitationBody"
        ),
        "url_citation": _shape(
            "a 'url_citation' annotation", "type url title start_index end_index", "UrlCitationBody"
        ),
        "container_file_citation": _shape(
            "a 'container_file_citation' annotation",
            "type container_id file_id filename start_index end_index",
            "ContainerFileCitationBody",
        ),
        "file_path": _shape("a 'file_path' annotation", "type file_id index", "FilePath"),
    }
)
_OUTPUT_TEXT = _shape(
    "an 'output_text' content part",
    "type text annotations logprobs",
    "OutputTextContent",
    inner={"annotations": Many(_ANNOTATION), "logprobs": Many(_LOGPROB)},
)
_REFUSAL = _shape("a 'refusal' content part", "type refusal", "RefusalContent")
_REASONING_TEXT = _shape("a reasoning content part", "type text", "ReasoningTextContent")

# -- input items -----------------------------------------------------------------------------

_CALLER = Kinds(
    {
        "direct": _shape(
            "a 'direct' caller", "type", "DirectToolCallCaller DirectToolCallCallerParam"
        ),
        "program": _shape(
            "a 'program' caller",
            "type caller_id",
            "ProgramToolCallCaller ProgramToolCallCallerParam",
        ),
    }
)
_MESSAGE = _shape(
    "a 'message' input item",
    "type role content id status phase",
    "EasyInputMessage InputMessage OutputMessage",
    inner={
        "content": Many(
            Kinds({"input_text": _INPUT_TEXT, "output_text": _OUTPUT_TEXT, "refusal": _REFUSAL})
        )
    },
)
#: An item of `input`, or of a conversation (request/items.py).
INPUT_ITEM = Kinds(
    {
        "message": _MESSAGE,
        "function_call": _shape(
            "a 'function_call' input item",
            "type id call_id name arguments status namespace caller",
            "FunctionToolCall",
            extra="async",
            inner={"caller": _CALLER},
        ),
        "function_call_output": _shape(
            "a 'function_call_output' input item",
            "type id call_id output status namespace name caller",
            "FunctionCallOutputItemParam",
            inner={"output": Many(Kinds({"input_text": _INPUT_TEXT})), "caller": _CALLER},
        ),
        "reasoning": _shape(
            "a 'reasoning' input item",
            "type id summary content encrypted_content status",
            "ReasoningItem",
            inner={
                # `text`: the part type the reader takes besides `reasoning_text`.
                "content": Many(
                    Kinds({"reasoning_text": _REASONING_TEXT, "text": _REASONING_TEXT})
                ),
                "summary": Many(
                    _shape("a reasoning summary part", "type text", "SummaryTextContent")
                ),
            },
        ),
        "item_reference": _shape("an 'item_reference' input item", "type id", "ItemReferenceParam"),
        "compaction": _shape(
            "a 'compaction' input item", "type id encrypted_content", "CompactionSummaryItemParam"
        ),
        "compaction_trigger": _shape(
            "a 'compaction_trigger' input item",
            "type",
            "CompactionTriggerItemParam",
            extra="id",  # openai-python's `CompactionTrigger` has it
        ),
    },
    untyped=_MESSAGE,
)

# -- tools -----------------------------------------------------------------------------------

_FUNCTION = "type name description parameters strict defer_loading allowed_callers output_schema"
_FUNCTION_TOOL = _shape("a 'function' tool", _FUNCTION, "FunctionTool", extra="async")
_NAMESPACE_TOOL = _shape(
    "a 'namespace' tool",
    "type name description tools",
    "NamespaceToolParam",
    inner={
        "tools": Many(
            Kinds(
                {
                    "function": _shape(
                        "a function of a 'namespace' tool",
                        _FUNCTION,
                        "FunctionToolParam",
                        extra="async",
                    )
                }
            )
        )
    },
)
_LOCATION = _shape(
    "'user_location'",
    "type city country region timezone",
    "WebSearchApproximateLocation ApproximateLocation",
)
_WEB_SEARCH = _shape(
    "a 'web_search' tool",
    "type external_web_access filters search_context_size user_location",
    "WebSearchTool",
    inner={
        "filters": _shape("'filters'", "allowed_domains", "WebSearchTool.filters"),
        "user_location": _LOCATION,
    },
)
_WEB_SEARCH_PREVIEW = _shape(
    "a 'web_search_preview' tool",
    "type search_content_types search_context_size user_location",
    "WebSearchPreviewTool",
    inner={"user_location": _LOCATION},
)
_SECRET = _shape("a domain secret", "domain name value", "ContainerNetworkPolicyDomainSecretParam")
_NETWORK_POLICY = Kinds(
    {
        "disabled": _shape(
            "a 'disabled' network policy", "type", "ContainerNetworkPolicyDisabledParam"
        ),
        "allowlist": _shape(
            "an 'allowlist' network policy",
            "type allowed_domains domain_secrets",
            "ContainerNetworkPolicyAllowlistParam",
            inner={"domain_secrets": Many(_SECRET)},
        ),
    }
)
_CODE_INTERPRETER = _shape(
    "a 'code_interpreter' tool",
    "type container allowed_callers",
    "CodeInterpreterTool",
    inner={
        "container": _shape(
            "a code interpreter 'container'",
            "type file_ids memory_limit network_policy",
            "AutoCodeInterpreterToolParam",
            inner={"network_policy": _NETWORK_POLICY},
        )
    },
)
#: A tool of `tools` (request/tools.py; the types it does not list are its 400).
TOOL = Kinds(
    {
        "function": _FUNCTION_TOOL,
        "namespace": _NAMESPACE_TOOL,
        "web_search": _WEB_SEARCH,
        "web_search_2025_08_26": _WEB_SEARCH,
        "web_search_preview": _WEB_SEARCH_PREVIEW,
        "web_search_preview_2025_03_11": _WEB_SEARCH_PREVIEW,
        "code_interpreter": _CODE_INTERPRETER,
    }
)

# -- tool_choice -----------------------------------------------------------------------------

#: What `allowed_tools.tools` lists: a tool as declared (openai-python types them only as
#: objects), a function also with the `namespace` it is in (as a function tool_choice names
#: it), any other tool by the keys OpenAI's tool choices name one with.
_LISTED = Kinds(
    {
        **TOOL.by_type,
        "function": _shape(
            "a function 'allowed_tools' lists",
            _FUNCTION,
            "FunctionTool",
            extra="async",
            own="namespace",
        ),
    },
    other=_shape(
        "a tool 'allowed_tools' lists",
        "type name server_label",
        "ToolChoiceMCP ToolChoiceCustom ToolChoiceTypes",
    ),
)
_TYPE_ONLY = {
    kind: _shape(f"a '{kind}' tool_choice", "type", spec)
    for kinds, spec in (
        (
            "file_search web_search_preview computer computer_use_preview computer_use "
            "web_search_preview_2025_03_11 image_generation code_interpreter",
            "ToolChoiceTypes",
        ),
        ("programmatic_tool_calling", "SpecificProgrammaticToolCallingParam"),
        ("apply_patch", "SpecificApplyPatchParam"),
        ("shell", "SpecificFunctionShellParam"),
    )
    for kind in kinds.split()
}
TOOL_CHOICE = Kinds(
    {
        **_TYPE_ONLY,
        "function": _shape(
            "a 'function' tool_choice",
            "type name",
            "ToolChoiceFunction",
            own="namespace",  # the namespace tool the function is in (request/guided.py)
        ),
        "allowed_tools": _shape(
            "an 'allowed_tools' tool_choice",
            "type mode tools",
            "ToolChoiceAllowed",
            inner={"tools": Many(_LISTED)},
        ),
        "mcp": _shape("an 'mcp' tool_choice", "type server_label name", "ToolChoiceMCP"),
        "custom": _shape("a 'custom' tool_choice", "type name", "ToolChoiceCustom"),
    }
)

# -- the other objects of a request ----------------------------------------------------------

_FORMAT_KINDS = Kinds(
    {
        "text": _shape("a 'text' format", "type", "ResponseFormatText"),
        "json_schema": _shape(
            "a 'json_schema' format",
            "type name schema description strict",
            "TextResponseFormatJsonSchema",
        ),
        "json_object": _shape("a 'json_object' format", "type", "ResponseFormatJsonObject"),
    }
)
#: Top-level field → the shape of its value. `input` and `tools` are walked by their readers,
#: item by item (request/items.py, which checks a conversation's items too) and tool by tool
#: (request/tools.py, after its hint for a tool in the chat-completions shape).
REQUEST: Mapping[str, Node] = {
    "reasoning": _shape("'reasoning'", "effort summary generate_summary context mode", "Reasoning"),
    "text": _shape(
        "'text'", "format verbosity", "ResponseTextParam", inner={"format": _FORMAT_KINDS}
    ),
    "tool_choice": TOOL_CHOICE,
    "conversation": _shape("'conversation'", "id", "ConversationParam-2"),
    "prompt_cache_options": _shape(
        "'prompt_cache_options'",
        "ttl mode",
        "PromptCacheOptionsParam",
        extra="prewarm comparison_response_id",
    ),
    "stream_options": _shape("'stream_options'", "include_obfuscation", "ResponseStreamOptions"),
    # In openai-python's parameters only: no keys in the spec, all of theirs are `extra`.
    "background_options": _shape(
        "'background_options'", "", "", extra="completion_window continuation_id"
    ),
    "image": _shape("'image'", "", "", extra="context_compression"),
}
