"""`/v1/chat/completions` for gpt-oss: a plain, correct Harmony chat, streaming and not.

Not a model of upstream's chat path (`chat_harmony` and `harmony_adapter.py`), only close to it:
the request is rendered with openai-harmony (system message with the reasoning effort; a
developer message with the system/developer instructions and the function tools; user,
assistant — with `reasoning_content`, `content` and `tool_calls` — and tool messages), the
completion is parsed token by token, and every engine output becomes one chunk whose delta holds
the new `reasoning_content`, `content` (final answer and preambles) and `tool_calls`. Unknown
request fields are accepted. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    HarmonyError,
    Message,
    ReasoningEffort,
    Role,
    StreamableParser,
    SystemContent,
    ToolDescription,
)

from proxy.harmony.tokens import MESSAGE_ENDS

_EFFORTS = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}


class ChatRequestError(ValueError):
    """The chat request cannot be rendered: 400 with this text."""


def render_chat(body: dict[str, Any], encoding: HarmonyEncoding) -> list[int]:
    """The Harmony prompt of a chat request, ending in `<|start|>assistant`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("'messages' must be a non-empty list")
    system = SystemContent.new()
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in _EFFORTS:
            raise ChatRequestError(f"reasoning_effort {effort!r} is not low, medium or high")
        system = system.with_reasoning_effort(_EFFORTS[effort])
    instructions: list[str] = []
    conversation: list[Message] = []
    call_names: dict[str, str] = {}
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatRequestError(f"messages[{index}] is not an object")
        role, text = message.get("role"), _text(message.get("content"), index)
        if role in ("system", "developer"):
            instructions.append(text)
        elif role == "user":
            conversation.append(Message.from_role_and_content(Role.USER, text))
        elif role == "assistant":
            conversation += _assistant(message, text, call_names, index)
        elif role == "tool":
            name = call_names.get(str(message.get("tool_call_id")), message.get("name") or "tool")
            author = Author.new(Role.TOOL, f"functions.{name}")
            tool_message = Message.from_author_and_content(author, text)
            conversation.append(tool_message.with_channel("commentary"))
        else:
            raise ChatRequestError(f"messages[{index}].role {role!r} is not supported")
    developer = DeveloperContent.new()
    if instructions:
        developer = developer.with_instructions("\n\n".join(instructions))
    tools = _tools(body.get("tools"))
    if tools:
        developer = developer.with_function_tools(tools)
    rendered = [
        Message.from_role_and_content(Role.SYSTEM, system),
        Message.from_role_and_content(Role.DEVELOPER, developer),
        *conversation,
    ]
    try:
        return encoding.render_conversation_for_completion(
            Conversation.from_messages(rendered), Role.ASSISTANT
        )
    except (HarmonyError, ValueError) as exc:
        raise ChatRequestError(f"the conversation cannot be rendered: {exc}") from exc


def _text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    raise ChatRequestError(f"messages[{index}].content must be a string or a list of text parts")


def _assistant(
    message: dict[str, Any], text: str, call_names: dict[str, str], index: int
) -> list[Message]:
    rendered: list[Message] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        rendered.append(
            Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis")
        )
    if text:
        rendered.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatRequestError(f"messages[{index}].tool_calls needs function names")
        call_names[str(call.get("id"))] = function["name"]
        arguments = function.get("arguments")
        call_message = Message.from_role_and_content(
            Role.ASSISTANT, arguments if isinstance(arguments, str) else "{}"
        )
        rendered.append(
            call_message.with_channel("commentary")
            .with_recipient(f"functions.{function['name']}")
            .with_content_type("json")
        )
    return rendered


def _tools(tools: Any) -> list[ToolDescription]:
    described: list[ToolDescription] = []
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatRequestError("each tool needs a function with a name")
        described.append(
            ToolDescription.new(
                function["name"], function.get("description") or "", function.get("parameters")
            )
        )
    return described


class ChatStream:
    """Chunks of one chat completion (module doc)."""

    def __init__(
        self, encoding: HarmonyEncoding, *, response_id: str, created: int, model: str
    ) -> None:
        self._parser = StreamableParser(encoding, role=Role.ASSISTANT)
        self._id = response_id
        self._envelope: dict[str, Any] = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._broken = False
        self._call: str | None = None  # recipient of the call being streamed
        self.calls = 0
        self.reasoning = ""
        self.content = ""
        self.tool_calls: list[dict[str, Any]] = []

    def first(self) -> dict[str, Any]:
        """The opening chunk: the role."""
        return self._chunk({"role": "assistant", "content": ""}, None, None)

    def feed(
        self, token_ids: Sequence[int], finish_reason: str | None, stop_reason: int | None
    ) -> dict[str, Any]:
        """The chunk of one engine output."""
        delta: dict[str, Any] = {}
        calls: list[dict[str, Any]] = []
        for token in token_ids:
            for key, value in self._process(token):
                if key == "tool_calls":
                    calls.append(value)
                else:
                    delta[key] = delta.get(key, "") + value
        if calls:
            delta["tool_calls"] = calls
        if finish_reason == "stop" and self.calls:
            finish_reason = "tool_calls"
        return self._chunk(delta, finish_reason, stop_reason)

    def message(self) -> dict[str, Any]:
        """The non-streaming `message` of everything fed."""
        return {
            "role": "assistant",
            "content": self.content or None,
            "reasoning_content": self.reasoning or None,
            "tool_calls": self.tool_calls,
        }

    def _process(self, token: int) -> list[tuple[str, Any]]:
        if self._broken:
            return []
        parser = self._parser
        try:
            parser.process(token)
        except (HarmonyError, ValueError, OverflowError):
            self._broken = True  # the rest is not Harmony: dropped, as a client would
            return []
        if token in MESSAGE_ENDS:
            self._call = None  # the next call is a new one, even to the same function
            return []
        delta = parser.last_content_delta
        if not delta:
            return []
        recipient, channel = parser.current_recipient, parser.current_channel
        if recipient is not None and recipient.startswith("functions."):
            return [("tool_calls", self._call_delta(recipient, delta))]
        if channel == "analysis":
            self.reasoning += delta
            return [("reasoning_content", delta)]
        self.content += delta
        return [("content", delta)]

    def _call_delta(self, recipient: str, delta: str) -> dict[str, Any]:
        if recipient != self._call:
            self._call = recipient
            self.calls += 1
            call_id = f"chatcmpl-tool-{self._id.removeprefix('chatcmpl-')}{self.calls}"
            name = recipient.removeprefix("functions.")
            self.tool_calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            )
            head = {"id": call_id, "type": "function", "index": self.calls - 1}
            self.tool_calls[-1]["function"]["arguments"] += delta
            return {**head, "function": {"name": name, "arguments": delta}}
        self.tool_calls[-1]["function"]["arguments"] += delta
        return {"index": self.calls - 1, "function": {"arguments": delta}}

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None, stop_reason: int | None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta}
        if finish_reason is not None:
            choice["finish_reason"] = finish_reason
            choice["stop_reason"] = stop_reason
        return {**self._envelope, "choices": [choice]}
