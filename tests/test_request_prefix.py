"""The prefix cache (request/prefix.py) changes no prompt id: cached renders equal the one-piece
render for every body and message list, hits and the bound work, and no prefix leaks into another
request's prompt."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    Role,
    SystemContent,
    TextContent,
    ToolDescription,
)

from proxy import vocab
from proxy.errors import ClientError
from proxy.harmony.request.prefix import (
    PrefixCache,
    PrefixCacheStats,
    developer_message,
    render_prompt,
    system_message,
)
from proxy.harmony.request.prepare import PreparedRequest, prepare_request
from proxy.harmony.request.tools import ToolSet, read_tools
from tests.request_clients import CLIENT_BODIES, MODEL
from tests.test_request_fuzz import FUZZ, POOL, _mutate
from tests.test_request_golden import STEPS


@pytest.fixture(scope="module")
def shared(encoding: HarmonyEncoding) -> PrefixCache:
    """One small cache for a whole module's examples: they hit, miss and evict one another."""
    return PrefixCache(encoding, capacity=8)


def one_piece(
    encoding: HarmonyEncoding,
    effort: str | None,
    instructions: str | None,
    toolset: ToolSet,
    inputs: list[Message],
) -> list[int]:
    """The reference: the whole prompt rendered in one piece, without the cache."""
    messages = [system_message(effort), developer_message(instructions, toolset), *inputs]
    return encoding.render_conversation_for_completion(
        Conversation.from_messages(messages), Role.ASSISTANT
    )


def outcome(call: Callable[[], Any]) -> Any:
    """The value, or the exception as (type, text): what must not change."""
    try:
        return call()
    except Exception as exc:  # compared, never swallowed: the test asserts on it
        return type(exc), str(exc)


def prepared_or_error(
    body: Any, encoding: HarmonyEncoding, prefixes: PrefixCache | None
) -> PreparedRequest | tuple[int, str, str | None, str | None]:
    try:
        return prepare_request(body, encoding, prefixes=prefixes)
    except ClientError as error:
        return error.status, error.message, error.param, error.code


# -- fixtures and real clients ---------------------------------------------------------------


@pytest.mark.parametrize("rounds", [1, 2], ids=["cold", "warm"])
def test_fixture_prompts_through_the_cache(encoding: HarmonyEncoding, rounds: int) -> None:
    """Every golden prompt (tests/fixtures/trtllm-prompts) comes out of the cache unchanged."""
    prefixes = PrefixCache(encoding)
    checked = 0
    for _ in range(rounds):
        for name, step in STEPS:
            fixed = step["fixed"]
            if fixed is not None:
                expected = fixed["expected_prompt_token_ids"]
            elif step["http_status"] == 200 and "previous_response_id" not in step["request_body"]:
                expected = step["prompt_token_ids"]
            else:
                continue
            prepared = prepare_request(step["request_body"], encoding, prefixes=prefixes)
            assert prepared.prompt_token_ids == expected, name
            checked += 1
    assert checked >= 20 * rounds
    stats = prefixes.stats()
    assert stats.misses == len(prefixes) < checked // rounds  # fixtures share prefixes
    assert stats.hits == checked - stats.misses


@pytest.mark.parametrize("name", sorted(CLIENT_BODIES))
def test_client_bodies_through_the_cache(
    encoding: HarmonyEncoding, shared: PrefixCache, name: str
) -> None:
    body = CLIENT_BODIES[name]
    assert prepare_request(body, encoding, prefixes=shared) == prepare_request(body, encoding)


# -- properties: bodies ------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_mutated_bodies_same_with_and_without_cache(
    encoding: HarmonyEncoding, shared: PrefixCache, data: st.DataObject
) -> None:
    """The request fuzzer's near-valid bodies: the same prepared request, or the same 4xx."""
    body = copy.deepcopy(data.draw(st.sampled_from(POOL)))
    for _ in range(data.draw(st.integers(min_value=0, max_value=3))):
        body = _mutate(data, body)
    assert prepared_or_error(body, encoding, shared) == prepared_or_error(body, encoding, None)


words = st.sampled_from(["a", "b", "x y", "", "<|end|>", "<|start|>assistant", "é👋🏽", "\n\n"])
names = st.sampled_from(["f0", "f1", "shell", "read_file"])
schemas = st.recursive(
    st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["string", "number", "integer"])}),
        st.fixed_dictionaries(
            {"type": st.just("string"), "enum": st.lists(words, min_size=1, max_size=2)}
        ),
        st.fixed_dictionaries(
            {"type": st.just("boolean")}, optional={"description": words, "default": st.booleans()}
        ),
    ),
    lambda inner: st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("array"), "items": inner}, optional={"description": words}
        ),
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(names, inner, max_size=3)},
            optional={"required": st.lists(names, max_size=2), "description": words},
        ),
        st.fixed_dictionaries({"oneOf": st.lists(inner, min_size=1, max_size=2)}),
    ),
    max_leaves=5,
)
function_tools = st.fixed_dictionaries(
    {"type": st.just("function"), "name": names},
    optional={"description": words, "parameters": schemas, "strict": st.booleans()},
)
namespace_tools = st.fixed_dictionaries(
    {
        "type": st.just("namespace"),
        "name": st.sampled_from(["mcp__docs__", "functions", "ns"]),
        "tools": st.lists(function_tools, max_size=2),
    },
    optional={"description": words},
)
tools = st.lists(
    st.one_of(function_tools, namespace_tools, st.just({"type": "web_search"})), max_size=3
)


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """An agent's input: messages of every role, reasoning, tool calls and their outputs."""
    items: list[dict[str, Any]] = []
    for index in range(draw(st.integers(min_value=0, max_value=6))):
        kind = draw(st.sampled_from(["message", "parts", "reasoning", "call"]))
        if kind == "message":
            role = draw(st.sampled_from(["user", "assistant", "system", "developer"]))
            items.append({"role": role, "content": draw(words)})
        elif kind == "parts":
            parts = st.fixed_dictionaries({"type": st.just("input_text"), "text": words})
            items.append(
                {"type": "message", "role": "user", "content": draw(st.lists(parts, max_size=2))}
            )
        elif kind == "reasoning":
            summary = [{"type": "summary_text", "text": draw(words)}]
            items.append({"type": "reasoning", "id": f"rs_{index}", "summary": summary})
        else:
            call = {"type": "function_call", "call_id": f"c{index}", "name": draw(names)}
            call["arguments"] = draw(st.sampled_from(["{}", '{"a": 1}']))
            if draw(st.booleans()):
                call["namespace"] = "ns"
            output = {"type": "function_call_output", "call_id": f"c{index}"}
            output["output"] = draw(words)
            items += [call, output]
    return items


bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL), "input": st.one_of(words, histories())},
    optional={
        "instructions": st.one_of(st.none(), words),
        "reasoning": st.fixed_dictionaries(
            {}, optional={"effort": st.sampled_from(["low", "medium", "high"])}
        ),
        "tools": tools,
    },
)


@FUZZ
@given(body=bodies)
def test_agent_bodies_same_with_and_without_cache(
    encoding: HarmonyEncoding, shared: PrefixCache, body: dict[str, Any]
) -> None:
    """Valid bodies with tools, instructions, efforts and histories: the very same prompt."""
    with_cache = prepared_or_error(body, encoding, shared)
    assert with_cache == prepared_or_error(body, encoding, None)
    if isinstance(with_cache, PreparedRequest):  # the draw is meant to be valid, mostly
        assert prepare_request(body, encoding, prefixes=shared) == with_cache


# -- properties: messages (channels the request side never produces) ---------------------------


@st.composite
def input_message(draw: st.DrawFn) -> Message:
    role = draw(
        st.sampled_from([Role.USER, Role.ASSISTANT, Role.DEVELOPER, Role.SYSTEM, Role.TOOL])
    )
    author = Author(role=role, name=draw(st.sampled_from(["functions.f0", "ns.f1", None])))
    contents: list[Any] = [TextContent(text=text) for text in draw(st.lists(words, max_size=2))]
    if role is Role.DEVELOPER and draw(st.integers(0, 5)) == 0:
        # Not what request/items.py builds, but it would change the system message: one piece.
        tool = ToolDescription.new("f0", "d", {"type": "object", "properties": {}})
        contents.append(DeveloperContent.new().with_function_tools([tool]))
    if role is Role.SYSTEM and draw(st.integers(0, 5)) == 0:
        contents.append(SystemContent.new())
    message = Message(author=author, content=contents)
    if (channel := draw(st.sampled_from([None, "analysis", "final", "commentary"]))) is not None:
        message = message.with_channel(channel)
    if (recipient := draw(st.sampled_from([None, "functions.f0", "all"]))) is not None:
        message = message.with_recipient(recipient)
    if (content_type := draw(st.sampled_from([None, "json", "<|constrain|>json"]))) is not None:
        message = message.with_content_type(content_type)
    return message


@FUZZ
@given(
    effort=st.sampled_from([None, "low", "medium", "high"]),
    instructions=st.one_of(st.none(), words),
    declared=tools,
    inputs=st.lists(input_message(), max_size=6),
)
def test_messages_same_with_and_without_cache(
    encoding: HarmonyEncoding,
    shared: PrefixCache,
    effort: str | None,
    instructions: str | None,
    declared: list[dict[str, Any]],
    inputs: list[Message],
) -> None:
    """Analysis / final / commentary history (auto_drop_analysis), tool calls, unnamed tool
    authors (a render error), non-text contents: ids or error exactly the one-piece render's."""
    toolset = read_tools(declared)
    expected = outcome(lambda: one_piece(encoding, effort, instructions, toolset, inputs))
    cached = outcome(lambda: render_prompt(encoding, effort, instructions, toolset, inputs, shared))
    assert cached == expected


#: Texts with what a tokenizer could trip on: special-token strings, emoji, CJK, whitespace runs.
user_texts = st.lists(
    st.sampled_from(["<|end|>", "<|start|>", "<|message|>", "<|", "😀", "中文", "  ", "\n\n", "é"])
    | st.text(max_size=12),
    max_size=8,
).map("".join)


@FUZZ
@given(texts=st.lists(user_texts, min_size=1, max_size=5))
def test_plain_user_messages_assembled_as_openai_harmony_renders_them(
    encoding: HarmonyEncoding, shared: PrefixCache, texts: list[str]
) -> None:
    """The first turn of a chat skips openai-harmony's per-message render: the same ids."""
    messages = [Message.from_role_and_content(Role.USER, text) for text in texts]
    expected = encoding.render_conversation(Conversation.from_messages(messages))
    assert shared.inputs(messages) == expected


def test_the_assembly_is_on_for_this_encoding_and_off_for_any_other_message(
    encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = PrefixCache(encoding)
    renders: list[int] = []
    real = encoding.render_conversation

    def counted(conversation: Conversation, *args: Any) -> list[int]:
        renders.append(len(conversation.messages))
        return real(conversation, *args)

    monkeypatch.setattr(encoding, "render_conversation", counted)

    def user() -> Message:  # a new one each time: openai-harmony's `with_*` change the message
        return Message.from_role_and_content(Role.USER, "Where is my order?")

    assert cache.inputs([user(), user()]) == real(Conversation.from_messages([user(), user()]))
    assert renders == []  # assembled, not rendered
    others = [
        Message.from_author_and_content(Author.new(Role.USER, "named"), "hi"),
        user().with_channel("final"),
        user().with_recipient("all"),
        user().with_content_type("json"),
        Message.from_role_and_contents(Role.USER, [TextContent(text="a"), TextContent(text="b")]),
        Message.from_role_and_content(Role.ASSISTANT, "hi"),
    ]
    for other in others:
        assert cache.inputs([user(), other]) == real(Conversation.from_messages([user(), other]))
    assert renders == [2] * len(others)


# -- why the pair, and why the text-only check ---------------------------------------------------


def test_system_message_depends_on_the_developer_message(encoding: HarmonyEncoding) -> None:
    """So the system message cannot be cached on its own (module doc)."""
    toolset = read_tools([{"type": "function", "name": "f", "description": "d"}])
    alone = encoding.render_conversation(Conversation.from_messages([system_message("low")]))
    pair = encoding.render_conversation(
        Conversation.from_messages([system_message("low"), developer_message(None, toolset)])
    )
    line = "Calls to these tools must go to the commentary channel: 'functions'."
    assert line not in encoding.decode(alone)
    assert line in encoding.decode(pair)


def test_inputs_with_developer_content_are_rendered_in_one_piece(
    encoding: HarmonyEncoding,
) -> None:
    """A DeveloperContent with function tools among the inputs changes the system message: a
    split render would be wrong, so the cache is bypassed."""
    empty = read_tools(None)
    tool = ToolDescription.new("f", "d")
    inputs = [
        Message.from_role_and_content(
            Role.DEVELOPER, DeveloperContent.new().with_function_tools([tool])
        )
    ]
    prefixes = PrefixCache(encoding)
    split = [
        *prefixes.prefix(None, None, empty),
        *encoding.render_conversation(Conversation.from_messages(inputs)),
        *prefixes.suffix,
    ]
    expected = one_piece(encoding, None, None, empty, inputs)
    assert split != expected
    assert render_prompt(encoding, None, None, empty, inputs, prefixes) == expected
    assert prefixes.stats() == PrefixCacheStats(hits=0, misses=1, evictions=0, entries=1)


def test_analysis_before_a_final_answer_is_dropped_alike(encoding: HarmonyEncoding) -> None:
    """auto_drop_analysis acts on the inputs alone: the prefix never shifts its decision."""
    toolset = read_tools([{"type": "function", "name": "f", "description": "d"}])
    assistant = Message.from_role_and_content
    inputs = [
        Message.from_role_and_content(Role.USER, "Question?"),
        assistant(Role.ASSISTANT, "Thinking it over.").with_channel("analysis"),
        assistant(Role.ASSISTANT, "Answer.").with_channel("final"),
        Message.from_role_and_content(Role.USER, "And now?"),
        assistant(Role.ASSISTANT, "More thought.").with_channel("analysis"),
        assistant(Role.ASSISTANT, "Done.").with_channel("final"),
    ]
    ids = render_prompt(encoding, "high", "Be brief.", toolset, inputs, PrefixCache(encoding))
    assert ids == one_piece(encoding, "high", "Be brief.", toolset, inputs)
    text = encoding.decode(ids)
    assert "Thinking it over." not in text
    assert "More thought." in text  # after the first final: kept
    assert "Answer." in text


def test_suffix_is_start_assistant(encoding: HarmonyEncoding) -> None:
    assert encoding.decode(list(PrefixCache(encoding).suffix)) == "<|start|>assistant"


# -- hits, misses, the bound ---------------------------------------------------------------------


def body_with(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "What is 2 + 2?", **fields}


def test_hits_misses_and_least_recently_used_eviction(encoding: HarmonyEncoding) -> None:
    prefixes = PrefixCache(encoding, capacity=2)
    a, b, c = (body_with(instructions=name) for name in "abc")

    def ask(body: dict[str, Any]) -> list[int]:
        return prepare_request(body, encoding, prefixes=prefixes).prompt_token_ids

    assert prefixes.stats() == PrefixCacheStats(hits=0, misses=0, evictions=0, entries=0)
    first = ask(a)
    assert prefixes.stats() == PrefixCacheStats(hits=0, misses=1, evictions=0, entries=1)
    assert ask(a) == first
    assert prefixes.stats() == PrefixCacheStats(hits=1, misses=1, evictions=0, entries=1)
    ask(b)
    ask(a)  # a is now the most recently used: c evicts b
    ask(c)
    assert prefixes.stats() == PrefixCacheStats(hits=2, misses=3, evictions=1, entries=2)
    ask(a)
    assert prefixes.stats().hits == 3
    ask(b)  # evicted: a miss, which evicts c (a was used after c)
    assert prefixes.stats() == PrefixCacheStats(hits=3, misses=4, evictions=2, entries=2)
    ask(a)
    assert prefixes.stats().hits == 4
    assert len(prefixes) == 2
    for body in (a, b, c):
        assert ask(body) == prepare_request(body, encoding).prompt_token_ids


def test_bound_holds_under_many_prefixes(encoding: HarmonyEncoding) -> None:
    prefixes = PrefixCache(encoding, capacity=3)
    for number in range(10):
        prepare_request(body_with(instructions=str(number)), encoding, prefixes=prefixes)
        assert len(prefixes) <= 3
    assert prefixes.stats() == PrefixCacheStats(hits=0, misses=10, evictions=7, entries=3)


def test_capacity_must_be_positive(encoding: HarmonyEncoding) -> None:
    with pytest.raises(ValueError, match="capacity"):
        PrefixCache(encoding, capacity=0)


def test_cache_of_another_encoding_is_misuse(encoding: HarmonyEncoding) -> None:
    other = vocab.load_encoding(vocab.ensure_vocab(os.environ))
    prefixes = PrefixCache(other)
    with pytest.raises(ValueError, match="another HarmonyEncoding"):
        prepare_request(body_with(), encoding, prefixes=prefixes)
    with pytest.raises(ValueError, match="another HarmonyEncoding"):
        render_prompt(encoding, None, None, read_tools(None), [], prefixes)


# -- no leaks --------------------------------------------------------------------------------------


def schema(*keys: str) -> dict[str, Any]:
    return {"type": "object", "properties": {key: {"type": "string"} for key in keys}}


def tool(name: str = "f", description: str = "d", **extra: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": description, **extra}


#: Bodies that differ in one thing each that reaches the system or developer message.
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": body_with(),
    "empty instructions": body_with(instructions=""),
    "instructions": body_with(instructions="Be brief."),
    "other instructions": body_with(instructions="Be verbose."),
    "low": body_with(reasoning={"effort": "low"}),
    "high": body_with(reasoning={"effort": "high"}),
    "tool": body_with(tools=[tool()]),
    "tool renamed": body_with(tools=[tool("g")]),
    "tool described": body_with(tools=[tool(description="e")]),
    "tool schema": body_with(tools=[tool(parameters=schema("a", "b"))]),
    "tool schema reordered": body_with(tools=[tool(parameters=schema("b", "a"))]),
    "tool schema typed": body_with(
        tools=[tool(parameters={"type": "object", "properties": {"a": {"type": "number"}}})]
    ),
    "two tools": body_with(tools=[tool(), tool("g")]),
    "two tools swapped": body_with(tools=[tool("g"), tool()]),
    "namespace": body_with(tools=[{"type": "namespace", "name": "ns", "tools": [tool()]}]),
    "namespace described": body_with(
        tools=[{"type": "namespace", "name": "ns", "description": "N", "tools": [tool()]}]
    ),
    "namespace and tool": body_with(
        tools=[tool(), {"type": "namespace", "name": "ns", "description": "N", "tools": [tool()]}]
    ),
}


def test_no_prefix_leaks_into_another_request(encoding: HarmonyEncoding) -> None:
    """One cache, warm with every variant: each prompt is its own one-piece render, all differ."""
    prefixes = PrefixCache(encoding, capacity=len(VARIANTS))
    for body in VARIANTS.values():  # warm every entry first, so later lookups could collide
        prepare_request(body, encoding, prefixes=prefixes)
    prompts: dict[tuple[int, ...], str] = {}
    for name, body in VARIANTS.items():
        cached = prepare_request(body, encoding, prefixes=prefixes).prompt_token_ids
        assert cached == prepare_request(body, encoding).prompt_token_ids, name
        assert tuple(cached) not in prompts, (name, prompts.get(tuple(cached)))
        prompts[tuple(cached)] = name
    assert prefixes.stats().hits == len(VARIANTS)


def test_non_finite_schema_is_rejected_before_any_cached_lookup(encoding: HarmonyEncoding) -> None:
    """The key is orjson's, which writes NaN as null: check_json must refuse NaN first."""
    prefixes = PrefixCache(encoding)
    null = body_with(tools=[tool(parameters={"type": "number", "default": None})])
    nan = body_with(tools=[tool(parameters={"type": "number", "default": math.nan})])
    prepare_request(null, encoding, prefixes=prefixes)
    with pytest.raises(ClientError, match="finite"):
        prepare_request(nan, encoding, prefixes=prefixes)


def test_requests_without_tools_share_their_empty_name_sets() -> None:
    """A stream keeps its request's name sets for its life: without tools, one pair for all."""
    first, second = read_tools(None), read_tools(None)
    assert first.function_names is second.function_names is first.namespace_names
    assert not first.function_names
    assert first.echo == []
    assert first.echo is not second.echo  # the echo is each response's own
