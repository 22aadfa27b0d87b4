"""`tool_choice` as guided decoding: which message headers gpt-oss may write.

Upstream renders the same prompt whatever `tool_choice` says (its Responses path leaves it out of
the prompt), so nothing in the prompt stops gpt-oss from calling a tool under `"none"` or calling
another one than the named function. What can stop it is the engine: trtllm's `/v1/completions`
takes `response_format` `{"type": "structural_tag", "format": <xgrammar structural-tag format>}`
(validated by xgrammar's `Format` model, compiled with `GuidedDecodingParams(structural_tag=...)`;
applied only by a server started with a guided-decoding backend, ignored silently by one
without), the mechanism `text.format` already uses (request/text.py). The constraint here is on
the *headers* gpt-oss writes; message bodies stay free text:

    sequence[ HEADER,
              triggered_tags(triggers=["<|start|>"],
                             tags=[tag(begin="<|start|>assistant", content=HEADER, end="")]) ]

    HEADER = or[ "<|channel|>analysis<|message|>",                 reasoning
                 "<|channel|>commentary<|message|>",               a preamble
                 "<|channel|>final<|message|>" (+ the text.format JSON, when set)
                                                                   unless a call is required
                 "<|channel|>commentary to=R <|constrain|>json<|message|>"
                                                                   for each allowed recipient R ]

The first header follows the prompt's `<|start|>assistant`; every later message begins with
`<|start|>`, a trigger, so its header must be one of HEADER too — also when the model starts a
new message without ending the previous one. gpt-oss writes its recipient either after the
channel or before it (`<|start|>assistant to=R<|channel|>…`); both are covered, and only the
canonical form of an allowed call can be written at all.

    tool_choice                                 final   recipients
    "auto" (default)                            no constraint sent (text.format's own, if set)
    "none"                                      yes     none
    "required"                                  no      every declared function
    {"type": "function", "name": N}             no      N
    {"type": "allowed_tools", "mode": "auto"}   yes     the listed tools
    {"type": "allowed_tools", "mode": "required"}  no   the listed tools

Checked against xgrammar 0.1.25 (the version trtllm pins): it compiles this format and accepts
or rejects sample outputs as the table says. It rejects the simpler shapes one might try: an
`any_text` tag body with an empty `end`, an unbounded element before the last of a `sequence`,
an `or` mixing bounded and unbounded branches, an empty `tags_with_separator` separator. Two
things a header constraint cannot do: stop the model from ending right after its reasoning under
"required" (gpt-oss ends with `<|return|>` only after a final answer), and, with a text.format,
stop text after the JSON (upstream's own text.format tag ends the output there instead).

Hosted tools (`web_search`, `code_interpreter`, …) are never given to the model behind this
proxy, so a `tool_choice` that forces one cannot be honoured: 400. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from proxy.harmony.constraint import TOOL_CHOICE_KINDS, OutputConstraint
from proxy.harmony.request.check import (
    at,
    describe,
    fail,
    missing,
    present,
    want_choice,
    want_list,
    want_object,
    want_str,
)
from proxy.harmony.request.text import TextConfig
from proxy.harmony.request.tools import FUNCTIONS, ToolSet

ANALYSIS = "<|channel|>analysis<|message|>"
PREAMBLE = "<|channel|>commentary<|message|>"
FINAL = "<|channel|>final<|message|>"
#: Every message after the first starts with this; its `<|start|>` is the trigger.
NEXT_MESSAGE = "<|start|>assistant"

_MODES = ("auto", "required")
#: tool_choice types that force a hosted or custom tool the model never has here.
_UNSERVABLE = frozenset(
    {
        "file_search",
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "computer",
        "computer_use_preview",
        "image_generation",
        "code_interpreter",
        "mcp",
        "custom",
        "apply_patch",
        "shell",
        "programmatic_tool_calling",
    }
)


def call_header(recipient: str) -> str:
    """The header gpt-oss writes for a call to `recipient` (openai-harmony's canonical form)."""
    return f"<|channel|>commentary to={recipient} <|constrain|>json<|message|>"


def tool_choice_format(
    choice: str | dict[str, Any], toolset: ToolSet, final_content: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The `/v1/completions` `response_format` that enforces `choice` (None: "auto"), the final
    answer held to `final_content` (text.format's structural-tag content) when given."""
    final, recipients = _allowed(choice, toolset)
    if final is None:
        return None
    heads: list[dict[str, Any]] = [_const(ANALYSIS), _const(PREAMBLE)]
    if final:
        head = _const(FINAL)
        heads.append(head if final_content is None else _sequence([head, final_content]))
    heads += [_const(call_header(recipient)) for recipient in recipients]
    header = {"type": "or", "elements": heads}
    later = {
        "type": "triggered_tags",
        "triggers": ["<|start|>"],
        "tags": [{"type": "tag", "begin": NEXT_MESSAGE, "content": header, "end": ""}],
        "at_least_one": False,
        "stop_after_first": False,
    }
    return {"type": "structural_tag", "format": _sequence([header, later])}


def output_constraint(
    choice: str | dict[str, Any], toolset: ToolSet, text: TextConfig
) -> OutputConstraint | None:
    """What `choice` and `text.format` demand of the output, for the check after the fact
    (constraint.py); None when neither constrains it. The same table as `tool_choice_format`."""
    final, recipients = _allowed(choice, toolset)
    if final is None and text.json_kind is None:
        return None
    if final is None:
        return OutputConstraint(text_kind=text.json_kind, schema=text.schema)
    if isinstance(choice, str):
        kind, named = TOOL_CHOICE_KINDS[choice], f"tool_choice {choice!r}"
        if choice == "none" and text.json_kind is None and not _recipients(toolset):
            return OutputConstraint(tool_kind=kind, choice=named, engine_needed=False)
    else:
        kind = TOOL_CHOICE_KINDS[choice["type"]]
        named = (
            f"tool_choice function {describe(choice.get('name'))}"
            if choice["type"] == "function"
            else f"tool_choice allowed_tools (mode {choice.get('mode')!r})"
        )
    return OutputConstraint(
        tool_kind=kind,
        choice=named,
        final_allowed=final,
        recipients=frozenset(recipients),
        call_required=not final,
        text_kind=text.json_kind,
        schema=text.schema,
    )


def _allowed(choice: str | dict[str, Any], toolset: ToolSet) -> tuple[bool | None, list[str]]:
    """(final answer allowed — None when nothing is constrained, allowed recipients)."""
    every = _recipients(toolset)
    if choice == "auto":
        return None, []
    if choice == "none":
        return True, []
    if choice == "required":
        if not every:
            fail("tool_choice", choice, "'required' needs at least one function tool in 'tools'")
        return False, every
    assert isinstance(choice, dict)  # request/fields.py checked the shape
    kind = choice["type"]
    if kind in _UNSERVABLE:
        fail(
            "tool_choice.type",
            kind,
            "gpt-oss behind this proxy can call only the function and namespace tools of "
            "'tools'; hosted and custom tools are never given to it",
            code="unsupported_value",
        )
    if kind not in ("function", "allowed_tools"):
        fail(
            "tool_choice.type",
            kind,
            "expected 'function' or 'allowed_tools' (or the strings 'none', 'auto', 'required')",
        )
    if kind == "function":
        return False, _named(choice, "tool_choice", toolset)
    mode = want_choice(_required(choice, "mode", "tool_choice"), "tool_choice.mode", _MODES)
    recipients = _listed(choice, toolset)
    if mode == "required" and not recipients:
        fail(
            "tool_choice.tools",
            present(choice, "tools"),
            "mode 'required' needs at least one function or namespace tool from 'tools'",
        )
    return mode == "auto", recipients


def _recipients(toolset: ToolSet) -> list[str]:
    return [
        f"{namespace.name}.{tool.name}"
        for namespace in toolset.namespaces
        for tool in namespace.tools
    ]


def _named(choice: dict[str, Any], path: str, toolset: ToolSet) -> list[str]:
    """The recipients of the function `choice` names (in its `namespace` when it gives one)."""
    name = want_str(_required(choice, "name", path), at(path, "name"))
    namespace = present(choice, "namespace")
    if namespace is not None:
        want_str(namespace, at(path, "namespace"))
    found = [
        recipient
        for recipient in _recipients(toolset)
        if recipient.rpartition(".")[2] == name
        and (namespace is None or recipient.rpartition(".")[0] == namespace)
    ]
    if not found:
        fail(at(path, "name"), name, "no function tool of that name is in 'tools'")
    return found


def _listed(choice: dict[str, Any], toolset: ToolSet) -> list[str]:
    """The recipients `allowed_tools.tools` lists; hosted tools in it are never callable here."""
    path = "tool_choice.tools"
    value = present(choice, "tools")
    if value is None:
        missing(path)
    recipients: list[str] = []
    for index, raw in enumerate(want_list(value, path)):
        item_path = at(path, index)
        item = want_object(raw, item_path)
        kind = present(item, "type")
        if kind == "function":
            recipients += _named(item, item_path, toolset)
        elif kind == "namespace":
            name = want_str(_required(item, "name", item_path), at(item_path, "name"))
            members = [r for r in _recipients(toolset) if r.rpartition(".")[0] == name]
            if name == FUNCTIONS or not members:
                fail(at(item_path, "name"), name, "no namespace tool of that name is in 'tools'")
            recipients += members
        elif not isinstance(kind, str):
            missing(at(item_path, "type"))
    return list(_unique(recipients))


def _required(obj: dict[str, Any], key: str, path: str) -> Any:
    value = present(obj, key)
    if value is None:
        missing(at(path, key))
    return value


def _unique(values: Iterable[str]) -> Iterable[str]:
    return dict.fromkeys(values)


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _sequence(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "sequence", "elements": elements}
