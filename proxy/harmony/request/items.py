"""`input` of a `/v1/responses` request → the Harmony messages that follow the developer message.

Each item renders as upstream's `_parse_response_input` (trtllm `responses_utils.py`) renders it:

- a string input: one user message;
- `message` (or an item without `type` but with `role`): role user / assistant / developer, and
  `system` as a developer message whose text is prefixed `"Instructions:\\n"`. String content is
  one text content; list content is one text content per part, each part's text on its own —
  upstream prefixes *every* part of a system message, and so do we. Assistant messages carry no
  channel;
- `function_call`: an assistant message to `functions.NAME`, channel `commentary`, content type
  `json`, content the arguments;
- `function_call_output`: a message from author `functions.NAME`, NAME found by `call_id`;
- `reasoning`: an assistant message (no channel) holding the reasoning text.

Where upstream wrongly rejects or drops valid input, we render the equivalent shape it accepts
(the prompts are in `tests/fixtures/trtllm-prompts/*.expected_fixed.json`):

- `function_call_output` also finds its call among the earlier `function_call` items of the same
  input, newest first (upstream only searches the previous response; fixture d13);
- assistant messages in output form (`type`, `id`, `status`, `output_text` parts) are rendered
  like list content (upstream silently drops them; fixture d29);
- a `reasoning` item with only `summary` renders the summary texts joined with `"\\n\\n"`; one
  with neither content nor summary text is skipped (upstream 400s); several content parts give
  one text content each (upstream asserts exactly one);
- a call or output carrying `namespace` NS (a Codex namespace tool) uses `NS.NAME` instead of
  `functions.NAME`: the recipient the model wrote;
- `item_reference` items are replaced by the stored items they name before rendering (the
  shell resolves them from the response store, and answers 404 for an unknown id or
  400 when the store is off); one that reaches the renderer is skipped;
- a `reasoning` item with `encrypted_content` the proxy sealed (include
  `reasoning.encrypted_content`) is opened and renders exactly as the plain item with
  those text parts; one that does not open (altered, foreign, old key) is a 400;
- a `refusal` part renders its refusal text;
- a `compaction` item (sealed by this proxy, request/compaction.py) renders as the kept user
  messages and the checkpoint summary it seals; every item before the latest one is checked,
  then dropped. One that does not open is a 400, as for reasoning. A `compaction_trigger`
  renders nothing (the shell compacted first); after the latest compaction it must be last.

gpt-oss reads text only: image, file and audio parts are rejected, as is any other item type.
"""

from __future__ import annotations

from typing import Any

from openai_harmony import Author, Content, Message, Role, TextContent

from proxy.harmony.reasoning_seal import ReasoningKeys, SealError
from proxy.harmony.request import compaction
from proxy.harmony.request.check import (
    at,
    check_shape,
    fail,
    missing,
    present,
    want_list,
    want_object,
    want_str,
)
from proxy.harmony.request.inputs import as_items
from proxy.harmony.request.shapes import INPUT_ITEM
from proxy.harmony.request.tools import FUNCTIONS

_ROLES = {
    "user": Role.USER,
    "assistant": Role.ASSISTANT,
    "developer": Role.DEVELOPER,
    "system": Role.DEVELOPER,  # upstream: "Instructions:\n" + text, as a developer message
}
_SYSTEM_PREFIX = "Instructions:\n"

_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_MEDIA_PARTS = frozenset({"input_image", "input_file", "input_audio"})
_REASONING_PARTS = frozenset({"reasoning_text", "text"})


def input_messages(
    value: Any, keys: ReasoningKeys | None = None, *, current_turn: bool = False
) -> list[Message]:
    """Validate `input` and render it as Harmony messages (module doc); `keys` open sealed
    reasoning (None: `encrypted_content` is left unread, as upstream leaves it);
    `current_turn` (`reasoning.context: "current_turn"`) leaves out the reasoning items before
    the last user message, as OpenAI's spec defines it (otherwise all are rendered, as upstream
    renders them)."""
    if value is None:
        missing("input")
    items = as_items(value) if isinstance(value, str) else want_list(value, "input")
    turn_start = _last_user_message(items) if current_turn else 0
    window_start = compaction.latest(items)  # the items before it are checked, then dropped
    messages: list[Message] = []
    calls: dict[str, str] = {}  # call_id → recipient of the newest function_call so far
    for index, raw in enumerate(items):
        path = at("input", index)
        kind, item = _checked(raw, path)
        if kind == "compaction":
            rendered = _compaction(item, path, keys)
            if index == window_start:
                messages = rendered
            continue
        if kind == "compaction_trigger":
            if index > window_start and index != len(items) - 1:
                fail(path, raw, "must be the last input item", code="invalid_value")
            continue  # the shell compacted before rendering (or it is history: dropped)
        message = _render_item(kind, item, path, calls, keys)
        if kind == "reasoning" and index < turn_start:
            continue  # checked like any item, then left out (reasoning.context current_turn)
        if message is not None and index > window_start:
            messages.append(message)
    return messages


def check_items(value: Any, path: str, keys: ReasoningKeys | None = None) -> list[Any]:
    """Validate items kept to be rendered later — a conversation's — exactly as
    `input_messages` validates them, but for one thing: a `function_call_output` may answer a
    call kept earlier (in the conversation), so its `call_id` is not looked up here; the render
    of the whole conversation does that."""
    items = want_list(value, path)
    for index, raw in enumerate(items):
        kind, item = _checked(raw, at(path, index))
        if kind == "compaction":
            _compaction(item, at(path, index), keys)
        elif kind != "compaction_trigger":
            _render_item(kind, item, at(path, index), None, keys)
    return items


def _checked(raw: Any, path: str) -> tuple[str, dict[str, Any]]:
    """One item: an object of a type gpt-oss reads, with that type's keys only, in it and in
    its parts (request/shapes.py)."""
    item = want_object(raw, path)
    kind = present(item, "type")
    if kind is None and "role" in item:
        kind = "message"
    if kind is None:
        missing(at(path, "type"))
    if not isinstance(kind, str) or kind not in INPUT_ITEM.by_type:
        fail(
            at(path, "type"),
            kind,
            "gpt-oss behind this proxy reads 'message', 'function_call', "
            "'function_call_output', 'reasoning', 'compaction', 'compaction_trigger' and "
            "'item_reference' items",
            code="unsupported_value",
        )
    check_shape(item, INPUT_ITEM.by_type[kind], path)
    return kind, item


def _last_user_message(items: list[Any]) -> int:
    """The index of the last user message item (0 when there is none)."""
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if isinstance(item, dict) and item.get("role") == "user":
            return index
    return 0


def _render_item(
    kind: str,
    item: dict[str, Any],
    path: str,
    calls: dict[str, str] | None,
    keys: ReasoningKeys | None,
) -> Message | None:
    """One checked item as a Harmony message (None: nothing to render). `calls` maps the call
    ids seen so far to their recipients; None: checked only, calls are kept elsewhere."""
    if kind == "message":
        return _message(item, path)
    if kind == "function_call":
        name = _required_str(item, "name", path)
        arguments = _required_str(item, "arguments", path)
        call_id = _required_str(item, "call_id", path)
        recipient = f"{_namespace(item, path)}.{name}"
        if calls is not None:
            calls[call_id] = recipient
        message = Message.from_role_and_content(Role.ASSISTANT, arguments)
        return (
            message.with_channel("commentary").with_recipient(recipient).with_content_type("json")
        )
    if kind == "function_call_output":
        call_id = _required_str(item, "call_id", path)
        if calls is not None and call_id not in calls:
            fail(
                at(path, "call_id"),
                call_id,
                "no earlier function_call item in this input has that call_id (the proxy keeps "
                "no previous responses to look it up in)",
            )
        _namespace(item, path)  # type-checked only: the matched call decides the author
        contents = _output_contents(present(item, "output"), at(path, "output"))
        if calls is None:
            return None
        return Message(author=Author.new(Role.TOOL, calls[call_id]), content=contents)
    if kind == "reasoning":
        return _reasoning(item, path, keys)
    _required_str(item, "id", path)  # item_reference: resolved by the shell (module doc)
    return None


def _message(item: dict[str, Any], path: str) -> Message:
    role_value = present(item, "role")
    if role_value is None:
        missing(at(path, "role"))
    role = _ROLES.get(role_value) if isinstance(role_value, str) else None
    if role is None:
        fail(
            at(path, "role"),
            role_value,
            "supported roles are 'user', 'assistant', 'system' and 'developer'",
            code="unsupported_value",
        )
    prefix = _SYSTEM_PREFIX if role_value == "system" else ""
    content = present(item, "content")
    if content is None:
        missing(at(path, "content"))
    if isinstance(content, str):
        return Message.from_role_and_content(role, prefix + content)
    parts = want_list(content, at(path, "content"))
    texts = [_part_text(part, at(at(path, "content"), i)) for i, part in enumerate(parts)]
    return Message.from_role_and_contents(role, [TextContent(text=prefix + t) for t in texts])


def _part_text(value: Any, path: str) -> str:
    part = want_object(value, path)
    kind = present(part, "type")
    if kind is None:
        missing(at(path, "type"))
    if isinstance(kind, str) and kind in _MEDIA_PARTS:
        fail(at(path, "type"), kind, "gpt-oss reads text only", code="unsupported_value")
    key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
    if key is None:
        fail(
            at(path, "type"),
            kind,
            "supported content parts are 'input_text', 'output_text' and 'refusal'",
            code="unsupported_value",
        )
    return _required_str(part, key, path)


def _output_contents(value: Any, path: str) -> list[Content]:
    if value is None:
        missing(path)
    if isinstance(value, str):
        return [TextContent(text=value)]
    parts = want_list(value, path)
    return [TextContent(text=_part_text(part, at(path, i))) for i, part in enumerate(parts)]


def _reasoning(item: dict[str, Any], path: str, keys: ReasoningKeys | None) -> Message | None:
    content = present(item, "content")
    texts: list[str] = []
    if content is not None:
        for index, raw in enumerate(want_list(content, at(path, "content"))):
            part_path = at(at(path, "content"), index)
            part = want_object(raw, part_path)
            kind = present(part, "type")
            if not isinstance(kind, str) or kind not in _REASONING_PARTS:
                fail(at(part_path, "type"), kind, "expected 'reasoning_text'", code="invalid_value")
            texts.append(_required_str(part, "text", part_path))
    summary: list[str] = []
    raw_summary = present(item, "summary")
    if raw_summary is not None:
        for index, raw in enumerate(want_list(raw_summary, at(path, "summary"))):
            part_path = at(at(path, "summary"), index)
            summary.append(_required_str(want_object(raw, part_path), "text", part_path))
    encrypted = present(item, "encrypted_content")
    if encrypted is not None:
        want_str(encrypted, at(path, "encrypted_content"))
        if keys is not None:
            # What the model wrote, sealed by us: it renders as that plain item would.
            texts = _opened(keys, encrypted, at(path, "encrypted_content"))
    if texts:
        return Message.from_role_and_contents(Role.ASSISTANT, [TextContent(text=t) for t in texts])
    joined = "\n\n".join(summary)
    if joined:
        return Message.from_role_and_content(Role.ASSISTANT, joined)
    return None


def _compaction(item: dict[str, Any], path: str, keys: ReasoningKeys | None) -> list[Message]:
    blob_path = at(path, "encrypted_content")
    blob = present(item, "encrypted_content")
    if blob is None:
        missing(blob_path)
    if keys is None:  # only a render without the shell's keys: nothing to open with
        fail(blob_path, blob, "cannot be opened here", code="invalid_encrypted_content")
    return compaction.render(compaction.open_sealed(keys, blob, blob_path))


def _opened(keys: ReasoningKeys, blob: str, path: str) -> list[str]:
    try:
        return keys.open(blob)
    except SealError as exc:
        fail(path, blob, f"cannot be opened: {exc}", code="invalid_encrypted_content")


def _namespace(item: dict[str, Any], path: str) -> str:
    namespace = present(item, "namespace")
    if namespace is None:
        return FUNCTIONS
    return want_str(namespace, at(path, "namespace")) or FUNCTIONS


def _required_str(obj: dict[str, Any], key: str, path: str) -> str:
    value = present(obj, key)
    if value is None:
        missing(at(path, key))
    return want_str(value, at(path, key))
