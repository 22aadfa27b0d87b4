"""The system + developer head of a Harmony prompt, and a bounded cache of its rendered ids.

Theory of operation. `render_prompt` returns exactly
`encoding.render_conversation_for_completion([system, developer, *inputs], Role.ASSISTANT)`.
openai-harmony spends ~35-50 µs on every formatting token it renders (`render_formatting_token`
encodes the token's text with all ~1,100 special tokens allowed: a fresh set of them and a regex
alternation over them), so each message costs ~150 µs before its text; the system and developer
messages (the tool schemas are the bulk of a prompt) are the same on every request of an agent.
With a `PrefixCache`, the prompt is assembled as

    ids of render_conversation([system, developer])    cached, keyed by what builds them
    + ids of render_conversation(inputs)               rendered per request
    + ids of render_conversation_for_completion([], Role.ASSISTANT)   `<|start|>assistant`, once

which equals the one-piece render. The inputs are the per-request part: when every one is a
plain user message (one text, no name, channel, recipient or content type: the first turn of a
chat), `inputs` assembles them from the ids of `<|start|>user<|message|>` and `<|end|>`,
rendered once, around each text encoded as ordinary text (openai-harmony encodes message text
so, special-token strings included): ~3 µs for a short message against openai-harmony's ~75
warm and ~300 on a cold cache (bench/prepare.py). It checks once that this assembly equals
openai-harmony's render and otherwise leaves every render to it. Why the split is exact, from
openai-harmony 0.0.8 (`src/encoding.rs`):

- `render_conversation_into` renders the messages one by one with the same `RenderOptions` for
  all; `render_conversation_for_completion_into` is that plus `<|start|>` and the role, appended.
- The only cross-message input to a message's rendering is `conversation_has_function_tools`:
  true when *any* message holds a `DeveloperContent` whose `functions` namespace has tools. Only
  `SystemContent` reads it (it adds "Calls to these tools must go to the commentary channel:
  'functions'."). So the system message depends on the developer message — they are rendered and
  cached as a pair — and the split is exact only while the inputs hold neither content kind:
  `render_prompt` checks that every input content is a `TextContent` (request/items.py builds
  nothing else) and renders in one piece otherwise.
- `auto_drop_analysis` drops analysis messages before the first `final` one when the last
  assistant message is `final`. The system and developer messages have no channel and are not
  assistant messages, so the drop decisions on the inputs are the same with or without them.

The key is everything `system_message` and `developer_message` read: the effort, the
instructions and every namespace's name, description and tools (name, description, parameters
with their key order, which openai-harmony keeps). It is serialised with orjson, which is exact on
the plain JSON `check_json` admits (it writes NaN as null, a value `check_json` rejects first).

A render that fails in pieces is redone in one piece, so a bad request fails with exactly the
error it fails with without the cache; failures are never cached. Sans-IO; not thread-safe (the
proxy renders on its event loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from openai_harmony import (
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    TextContent,
)

from proxy.harmony.request.tools import ToolSet

_EFFORTS = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}

#: Default number of distinct prefixes kept: one per (agent, effort, tool set) in use at once.
DEFAULT_CAPACITY = 256


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """What a `PrefixCache` did so far: lookups that hit and missed, entries evicted, held."""

    hits: int
    misses: int
    evictions: int
    entries: int


class PrefixCache:
    """Rendered [system, developer] pairs of one encoding; least recently used evicted first."""

    def __init__(self, encoding: HarmonyEncoding, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._encoding = encoding
        self._capacity = capacity
        self._entries: dict[bytes, tuple[int, ...]] = {}  # insertion order = recency order
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._suffix = tuple(
            encoding.render_conversation_for_completion(Conversation(), Role.ASSISTANT)
        )
        self._user = _user_frame(encoding)

    @property
    def encoding(self) -> HarmonyEncoding:
        """The encoding every cached id belongs to."""
        return self._encoding

    @property
    def suffix(self) -> tuple[int, ...]:
        """`<|start|>assistant`: what the encoding appends to a conversation for completion."""
        return self._suffix

    def __len__(self) -> int:
        return len(self._entries)

    def inputs(self, messages: Sequence[Message]) -> list[int]:
        """Ids of `render_conversation(messages)`; plain user messages assembled (module doc)."""
        texts = [_plain_user_text(message) for message in messages]
        if self._user is not None and None not in texts:
            head, end = self._user
            ids: list[int] = []
            for text in texts:
                ids += head
                ids += self._encoding.encode(text or "", disallowed_special=())
                ids += end
            return ids
        return self._encoding.render_conversation(Conversation.from_messages(messages))

    def stats(self) -> PrefixCacheStats:
        """A snapshot of the counters."""
        return PrefixCacheStats(self._hits, self._misses, self._evictions, len(self._entries))

    def prefix(
        self, effort: str | None, instructions: str | None, toolset: ToolSet
    ) -> tuple[int, ...]:
        """Ids of `render_conversation([system, developer])`; raises what that call raises."""
        key = _key(effort, instructions, toolset)
        ids = self._entries.pop(key, None)
        if ids is None:
            self._misses += 1
            pair = [system_message(effort), developer_message(instructions, toolset)]
            ids = tuple(self._encoding.render_conversation(Conversation.from_messages(pair)))
            if len(self._entries) >= self._capacity:
                del self._entries[next(iter(self._entries))]
                self._evictions += 1
        else:
            self._hits += 1
        self._entries[key] = ids  # (re)inserted last: the most recently used
        return ids


def system_message(effort: str | None) -> Message:
    """The system message upstream sends: `SystemContent.new()`, with the effort when set."""
    content = SystemContent.new()
    if effort is not None:
        content = content.with_reasoning_effort(_EFFORTS[effort])
    return Message.from_role_and_content(Role.SYSTEM, content)


def developer_message(instructions: str | None, toolset: ToolSet) -> Message:
    """The developer message upstream sends: the instructions and the tool namespaces."""
    content = DeveloperContent.new()
    if instructions is not None:  # upstream: even "" renders an (empty) "# Instructions" section
        content = content.with_instructions(instructions)
    for namespace in toolset.namespaces:
        content = content.with_tools(namespace)
    return Message.from_role_and_content(Role.DEVELOPER, content)


def render_prompt(
    encoding: HarmonyEncoding,
    effort: str | None,
    instructions: str | None,
    toolset: ToolSet,
    inputs: Sequence[Message],
    prefixes: PrefixCache | None = None,
) -> list[int]:
    """`render_conversation_for_completion([system, developer, *inputs], Role.ASSISTANT)`.

    With `prefixes`, the system + developer ids come from that cache (module doc); tool
    parameters must then be plain JSON as `check_json` admits. Raises what the one-piece render
    raises (`ValueError`, `HarmonyError`), and `ValueError` when `prefixes` belongs to another
    encoding.
    """
    if prefixes is not None:
        if prefixes.encoding is not encoding:
            raise ValueError("the prefix cache belongs to another HarmonyEncoding")
        if _text_only(inputs):
            ids = _render_in_pieces(prefixes, effort, instructions, toolset, inputs)
            if ids is not None:
                return ids
    messages = [system_message(effort), developer_message(instructions, toolset), *inputs]
    return encoding.render_conversation_for_completion(
        Conversation.from_messages(messages), Role.ASSISTANT
    )


def _render_in_pieces(
    prefixes: PrefixCache,
    effort: str | None,
    instructions: str | None,
    toolset: ToolSet,
    inputs: Sequence[Message],
) -> list[int] | None:
    """The prompt from the cached prefix, or None when a piece fails to render or to key."""
    try:
        prefix = prefixes.prefix(effort, instructions, toolset)
        body = prefixes.inputs(inputs)
    except (ValueError, RuntimeError, orjson.JSONEncodeError):
        # The caller renders in one piece: the same error as without the cache, whichever
        # message openai-harmony trips on first, and of the same type (`render_conversation`
        # raises a plain RuntimeError where `render_conversation_for_completion` raises a
        # HarmonyError; both bindings raise ValueError for JSON they cannot parse).
        return None
    return [*prefix, *body, *prefixes.suffix]


def _plain_user_text(message: Message) -> str | None:
    """The text of a user message of one text and nothing else (rendered `<|start|>user
    <|message|>`, the text, `<|end|>`); None for any other message."""
    author = message.author
    if (
        author.role is not Role.USER
        or author.name is not None
        or message.channel is not None
        or message.recipient is not None
        or message.content_type is not None
        or len(message.content) != 1
    ):
        return None
    content = message.content[0]
    return content.text if type(content) is TextContent else None


#: A text that tells the frame apart from the text: ordinary tokens, one or several.
_PROBE = "Where is my order? 😀 <|end|>"


def _user_frame(encoding: HarmonyEncoding) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids before and after a plain user message's text, as openai-harmony renders them;
    None when the assembly would not equal its render (another encoding or version)."""

    def render(text: str) -> list[int]:
        message = Message.from_role_and_content(Role.USER, text)
        return encoding.render_conversation(Conversation.from_messages([message]))

    empty = render("")
    head, end = tuple(empty[:-1]), tuple(empty[-1:])
    if render(_PROBE) != [*head, *encoding.encode(_PROBE, disallowed_special=()), *end]:
        return None
    return head, end


def _text_only(inputs: Sequence[Message]) -> bool:
    """True when no input can change how the system message renders (module doc)."""
    return all(type(content) is TextContent for message in inputs for content in message.content)


def _key(effort: str | None, instructions: str | None, toolset: ToolSet) -> bytes:
    namespaces = [
        [
            namespace.name,
            namespace.description,
            [[tool.name, tool.description, tool.parameters] for tool in namespace.tools],
        ]
        for namespace in toolset.namespaces
    ]
    return orjson.dumps([effort, instructions, namespaces])
