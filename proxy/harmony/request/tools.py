"""`tools` of a `/v1/responses` request: Harmony tool namespaces for the developer message, echo.

Upstream (`_get_developer_message` in trtllm's `responses_utils.py`) renders `function` tools as
`ToolDescription.new(name, description, parameters)` in the `functions` namespace
(`with_function_tools`), skips `web_search_preview` and `code_interpreter`, and answers 400 for
any other type. Where upstream wrongly rejects valid tools, we render what it would accept:

- a function tool without `description` is rendered with `""` (upstream 400s: openai-harmony's
  `ToolDescription` requires a string); openai-harmony then writes no `//` comment line for it;
- `web_search` (Codex always sends it) and the dated web-search types are skipped like
  `web_search_preview`: the model cannot search here;
- a `namespace` tool (Codex groups MCP tools in them) becomes its own Harmony namespace
  (`ToolNamespaceConfig(name, description, tools)`), so the model addresses `NS.fn`. A namespace
  named `functions` is the default namespace (Codex's `DEFAULT_FUNCTION_NAMESPACE`): its tools join
  the plain function tools and calls come back without a namespace.

Each tool may have only the keys of its type (request/shapes.py), checked after the reading
above so that a tool in the chat-completions shape gets its hint.

The echo mirrors upstream's: each tool as the openai model dumps it (its fields in model order,
defaults filled) — except that it holds only the fields OpenAI's spec defines for the type
(openai-python's `async`, which upstream echoes as null, is accepted and not echoed), and that a
field the spec gives no null is never null: it echoes the spec's default where there is one
(`web_search`: `external_web_access` true, `search_context_size` "medium"), and is left out
otherwise (`defer_loading`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from openai_harmony import ToolDescription, ToolNamespaceConfig

from proxy.harmony.request.check import (
    at,
    check_shape,
    fail,
    missing,
    present,
    want_bool,
    want_list,
    want_object,
    want_str,
)
from proxy.harmony.request.shapes import TOOL

#: Harmony's namespace for plain function tools (openai-harmony `with_function_tools`).
FUNCTIONS = "functions"

#: Hosted tools the model cannot use behind this proxy: skipped from the prompt, kept in the echo.
SKIPPED_TYPES = frozenset(
    {
        "web_search_preview",  # upstream skips these two
        "code_interpreter",
        "web_search",  # Codex sends it on every request
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
    }
)

#: In an echo table: the key is left out while the request leaves it unset (OpenAI's spec gives it
#: no null and no default).
_UNSET: Any = object()

# The echo of each tool type: exactly the fields OpenAI's spec defines for it, in the field
# order of the openai 3.57.0 models upstream echoes through, with what an unset field echoes
# as: null where the spec allows it, the spec's default where it has one, else nothing. Keys
# outside a table are not echoed.
_FUNCTION_ECHO: dict[str, Any] = {
    **dict.fromkeys(("name", "parameters", "strict", "type", "allowed_callers")),
    "defer_loading": _UNSET,
    **dict.fromkeys(("description", "output_schema")),
}
_NAMESPACE_MEMBER_ECHO: dict[str, Any] = {
    **dict.fromkeys(("name", "type", "allowed_callers")),
    "defer_loading": _UNSET,
    **dict.fromkeys(("description", "output_schema", "parameters", "strict")),
}
_HOSTED_ECHO: dict[str, dict[str, Any]] = {
    "web_search_preview": {
        "type": None,
        "search_content_types": _UNSET,
        "search_context_size": _UNSET,
        "user_location": None,
    },
    "web_search": {
        "type": None,
        "external_web_access": True,
        "filters": None,
        "search_context_size": "medium",
        "user_location": None,
    },
    "code_interpreter": dict.fromkeys(("container", "type", "allowed_callers")),
}
_AUTO_CONTAINER_ECHO: dict[str, Any] = {
    "type": None,
    "file_ids": _UNSET,
    "memory_limit": None,
    "network_policy": _UNSET,
}


@dataclass(frozen=True, slots=True)
class ToolSet:
    """The declared tools, as the developer message and the response object need them.

    `namespaces`: Harmony namespaces for the developer message (plain functions under
    `functions`); `function_names`: names in the `functions` namespace; `namespace_names`: the
    other namespaces, whose calls come back with a `namespace`; `echo`: the response's `tools`.
    """

    namespaces: tuple[ToolNamespaceConfig, ...]
    function_names: frozenset[str]
    namespace_names: frozenset[str]
    echo: list[dict[str, Any]]


#: No names: one set for every request without tools (an empty frozenset is ~200 bytes, and a
#: stream keeps its request's for its life: bench/stream_memory.py).
_NO_NAMES: frozenset[str] = frozenset()


def read_tools(value: Any) -> ToolSet:
    """Validate `tools` (None when absent) and build the Harmony namespaces and the echo."""
    if value is None:
        return ToolSet(namespaces=(), function_names=_NO_NAMES, namespace_names=_NO_NAMES, echo=[])
    grouped: dict[str, tuple[str | None, list[ToolDescription]]] = {}
    echo: list[dict[str, Any]] = []
    for index, item in enumerate(want_list(value, "tools")):
        path = at("tools", index)
        tool = want_object(item, path)
        kind = present(tool, "type")
        if kind is None:
            missing(at(path, "type"))
        if kind == "function":
            description = _add_member(grouped, FUNCTIONS, None, tool, path)
            echo.append(_function_echo(tool, _FUNCTION_ECHO, description))
        elif kind == "namespace":
            echo.append(_read_namespace(grouped, tool, path))
        elif isinstance(kind, str) and kind in SKIPPED_TYPES:
            echo.append(_hosted_echo(tool))
        else:
            fail(
                at(path, "type"),
                kind,
                "this tool type is not supported by gpt-oss behind this proxy (supported: "
                "'function', 'namespace'; 'web_search', 'web_search_preview' and "
                "'code_interpreter' are accepted and skipped)",
                code="unsupported_value",
            )
        check_shape(tool, TOOL, path)
    namespaces = tuple(
        ToolNamespaceConfig(name=name, description=description, tools=tools)
        for name, (description, tools) in grouped.items()
    )
    functions = grouped.get(FUNCTIONS, (None, []))[1]
    return ToolSet(
        namespaces=namespaces,
        function_names=frozenset(tool.name for tool in functions),
        namespace_names=frozenset(name for name in grouped if name != FUNCTIONS),
        echo=echo,
    )


def _read_namespace(
    grouped: dict[str, tuple[str | None, list[ToolDescription]]],
    tool: dict[str, Any],
    path: str,
) -> dict[str, Any]:
    name = present(tool, "name")
    if name is None:
        missing(at(path, "name"))
    want_str(name, at(path, "name"))
    if not name or "." in name:
        # The proxy maps a call to `NS.fn` back to namespace NS and name fn at the first dot.
        fail(at(path, "name"), name, "a namespace name must be non-empty and contain no '.'")
    description = present(tool, "description")
    if description is not None:
        want_str(description, at(path, "description"))
    members: list[dict[str, Any]] = []
    members_value = present(tool, "tools")
    if members_value is None:
        missing(at(path, "tools"))
    for index, item in enumerate(want_list(members_value, at(path, "tools"))):
        member_path = at(at(path, "tools"), index)
        member = want_object(item, member_path)
        if present(member, "type") != "function":
            fail(
                at(member_path, "type"),
                present(member, "type"),
                "only 'function' tools are supported inside a namespace",
                code="unsupported_value",
            )
        # The `functions` namespace is Harmony's default one: rendered exactly as plain tools.
        ns_description = None if name == FUNCTIONS else description
        member_description = _add_member(grouped, name, ns_description, member, member_path)
        members.append(_function_echo(member, _NAMESPACE_MEMBER_ECHO, member_description))
    # `description` is required and not nullable in OpenAI's spec: left out when unset.
    echo = {"description": description, "name": name, "tools": members, "type": "namespace"}
    if description is None:
        del echo["description"]
    return echo


def _add_member(
    grouped: dict[str, tuple[str | None, list[ToolDescription]]],
    namespace: str,
    namespace_description: str | None,
    tool: dict[str, Any],
    path: str,
) -> str | None:
    name = present(tool, "name")
    if name is None:
        if isinstance(present(tool, "function"), dict):
            _chat_completions_shape(path)
        missing(at(path, "name"))
    name = want_str(name, at(path, "name"))
    raw_description = present(tool, "description")
    description = (
        None if raw_description is None else want_str(raw_description, at(path, "description"))
    )
    parameters = present(tool, "parameters")
    if parameters is not None:
        want_object(parameters, at(path, "parameters"))
    strict = present(tool, "strict")
    if strict is not None:
        want_bool(strict, at(path, "strict"))
    # Missing description → "" (fixture d28.expected_fixed): no `//` line is rendered.
    entry = ToolDescription.new(name=name, description=description or "", parameters=parameters)
    _, tools = grouped.setdefault(namespace, (namespace_description, []))
    tools.append(entry)
    return description


def _chat_completions_shape(path: str) -> NoReturn:
    """A `{"type": "function", "function": {...}}` tool: say the Responses shape is flat."""
    fail(
        at(path, "function"),
        {},
        "Responses function tools are flat: put 'name', 'description' and 'parameters' on the "
        "tool itself, not under 'function' (that is the chat-completions shape)",
        code="invalid_value",
    )


def _function_echo(
    tool: dict[str, Any], defaults: dict[str, Any], description: str | None
) -> dict[str, Any]:
    echo = _echo(defaults, tool)
    echo["description"] = description
    echo["type"] = "function"
    return echo


def _hosted_echo(tool: dict[str, Any]) -> dict[str, Any]:
    kind: str = tool["type"]
    if kind.startswith("web_search_preview"):
        family = "web_search_preview"
    elif kind.startswith("web_search"):
        family = "web_search"
    else:
        family = kind
    echo = _echo(_HOSTED_ECHO.get(family, {}), tool)
    container = present(tool, "container")
    if isinstance(container, dict):
        echo["container"] = _echo(_AUTO_CONTAINER_ECHO, container)
    return echo


def _echo(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` in the model's key order (`defaults`), unset keys as the table says, and only
    the table's keys. An explicit null is unset, as everywhere on the OpenAI wire."""
    echo: dict[str, Any] = {}
    for key, default in defaults.items():
        value = present(given, key)
        if value is None:
            value = default
        if value is not _UNSET:
            echo[key] = value
    return echo
