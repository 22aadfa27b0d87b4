"""Rules of the request side, each asserting the exact prompt text or the exact error.

The prompt text is the decoded prompt ids (`decode_utf8`), special tokens written out.
"""

from __future__ import annotations

import copy
import typing
from typing import Any

import orjson
import pytest
from openai.types.responses import response_create_params, response_input_item_param
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError
from proxy.harmony import tokens
from proxy.harmony.request.fields import EXTRA_FIELDS, RESPONSES_FIELDS
from proxy.harmony.request.prepare import PreparedRequest, parse_body, prepare_request
from proxy.harmony.request.shapes import INPUT_ITEM
from tests import request_clients as clients

MODEL = clients.MODEL


def system(effort: str = "medium", *, functions: bool = False) -> str:
    """The system message upstream renders: SystemContent.new() with the effort applied."""
    calls = (
        "\nCalls to these tools must go to the commentary channel: 'functions'."
        if functions
        else ""
    )
    return (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\n\n"
        f"Reasoning: {effort}\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        f"message.{calls}<|end|>"
    )


EMPTY_DEVELOPER = "<|start|>developer<|message|><|end|>"
ASSISTANT = "<|start|>assistant"


def call(recipient: str, arguments: str) -> str:
    """A function_call item as upstream renders it: content type json, no <|constrain|>."""
    return (
        f"<|start|>assistant to={recipient}<|channel|>commentary json<|message|>{arguments}<|call|>"
    )


def prepare(encoding: HarmonyEncoding, **fields: Any) -> PreparedRequest:
    return prepare_request({"model": MODEL, **fields}, encoding)


def text_of(encoding: HarmonyEncoding, prepared: PreparedRequest) -> str:
    return encoding.decode_utf8(prepared.prompt_token_ids)


def rejected(encoding: HarmonyEncoding, body: Any) -> ClientError:
    with pytest.raises(ClientError) as caught:
        prepare_request(body, encoding)
    error = caught.value
    assert 400 <= error.status < 500
    orjson.dumps(error.to_body())  # always serialisable, whatever the client sent
    return error


# --- parse_body ---


def test_parse_body_returns_the_object() -> None:
    assert parse_body(b'{"model": "m", "input": "hi"}') == {"model": "m", "input": "hi"}


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"{'a': 1}", b"\xff\xfe", b'{"a": "\xc3"}', b"[1, 2]", b"42", b'"hi"']
)
def test_parse_body_rejects_what_is_not_a_json_object(raw: bytes) -> None:
    with pytest.raises(ClientError) as caught:
        parse_body(raw)
    assert caught.value.status == 400
    assert caught.value.code == "invalid_json"
    assert caught.value.to_body()["error"]["type"] == "invalid_request_error"


# --- system and developer messages ---


def test_string_input_with_instructions_and_effort(encoding: HarmonyEncoding) -> None:
    prepared = prepare(
        encoding,
        input="Grüße aus Köln!",
        instructions="Answer briefly.",
        reasoning={"effort": "low"},
    )
    assert text_of(encoding, prepared) == (
        system("low")
        + "<|start|>developer<|message|># Instructions\n\nAnswer briefly.<|end|>"
        + "<|start|>user<|message|>Grüße aus Köln!<|end|>"
        + ASSISTANT
    )


def test_empty_instructions_still_render_their_section(encoding: HarmonyEncoding) -> None:
    # Upstream calls with_instructions for any non-null value, "" included.
    prepared = prepare(encoding, input="x", instructions="")
    assert text_of(encoding, prepared) == (
        system()
        + "<|start|>developer<|message|># Instructions\n\n<|end|>"
        + "<|start|>user<|message|>x<|end|>"
        + ASSISTANT
    )


def test_roles_system_developer_user_assistant(encoding: HarmonyEncoding) -> None:
    prepared = prepare(
        encoding,
        input=[
            {"role": "system", "content": "Be terse."},
            {
                "role": "system",
                "content": [
                    {"type": "input_text", "text": "A"},
                    {"type": "input_text", "text": "B"},
                ],
            },
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Use SI units."}],
            },
            {"role": "user", "content": "How far is the Moon?"},
            {"role": "assistant", "content": "About 384,400 km."},
            {"role": "user", "content": "In miles?"},
        ],
    )
    assert text_of(encoding, prepared) == (
        system()
        + EMPTY_DEVELOPER
        + "<|start|>developer<|message|>Instructions:\nBe terse.<|end|>"
        # upstream prefixes every part of a system message's list content
        + "<|start|>developer<|message|>Instructions:\nAInstructions:\nB<|end|>"
        + "<|start|>developer<|message|>Use SI units.<|end|>"
        + "<|start|>user<|message|>How far is the Moon?<|end|>"
        + "<|start|>assistant<|message|>About 384,400 km.<|end|>"
        + "<|start|>user<|message|>In miles?<|end|>"
        + ASSISTANT
    )


def test_list_content_is_one_text_content_per_part(encoding: HarmonyEncoding) -> None:
    parts = ["foo", "bar", " — ", "日本語", "👋🏽"]
    listed = prepare(
        encoding,
        input=[{"role": "user", "content": [{"type": "input_text", "text": p} for p in parts]}],
    )
    joined = prepare(encoding, input=[{"role": "user", "content": "".join(parts)}])
    expected = (
        system()
        + EMPTY_DEVELOPER
        + "<|start|>user<|message|>foobar — 日本語👋🏽<|end|>"
        + ASSISTANT
    )
    assert text_of(encoding, listed) == text_of(encoding, joined) == expected
    # Each part is tokenized on its own, so the seams differ from one joined string (d29 rule).
    assert listed.prompt_token_ids != joined.prompt_token_ids


def test_unicode_everywhere(encoding: HarmonyEncoding) -> None:
    prepared = prepare(
        encoding,
        instructions="Réponds en français 🇫🇷.",
        input=[{"role": "user", "content": "مرحبا — नमस्ते — 你好 — 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"}],
        tools=[
            {
                "type": "function",
                "name": "traduire",
                "description": "Traduit un texte (日本語 aussi).",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "texte": {"type": "string", "description": "Le texte à traduire"}
                    },
                    "required": ["texte"],
                },
            }
        ],
    )
    assert text_of(encoding, prepared) == (
        system(functions=True)
        + "<|start|>developer<|message|># Instructions\n\nRéponds en français 🇫🇷.\n\n# Tools\n\n"
        "## functions\n\nnamespace functions {\n\n// Traduit un texte (日本語 aussi).\n"
        "type traduire = (_: {\n// Le texte à traduire\ntexte: string,\n}) => any;\n\n"
        "} // namespace functions<|end|>"
        + "<|start|>user<|message|>مرحبا — नमस्ते — 你好 — 𝔘𝔫𝔦𝔠𝔬𝔡𝔢<|end|>"
        + ASSISTANT
    )


# --- tools ---

NESTED_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "create_order",
        "description": "Create an order.",
        "parameters": {
            "type": "object",
            "properties": {
                "customer": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "tier": {"type": "string", "enum": ["free", "pro"]},
                    },
                    "required": ["id"],
                },
                "lines": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                        "required": ["sku", "qty"],
                    },
                },
                "note": {"type": ["string", "null"], "description": "Free text"},
            },
            "required": ["customer", "lines"],
        },
    },
    {"type": "function", "name": "ping", "description": "Check the service.", "parameters": None},
    {
        "type": "function",
        "name": "no_description",
        "parameters": {"type": "object", "properties": {}},
    },
]


def test_several_tools_with_nested_schemas(encoding: HarmonyEncoding) -> None:
    prepared = prepare(encoding, input="Order two apples for c1.", tools=NESTED_TOOLS)
    assert text_of(encoding, prepared) == (
        system(functions=True)
        + "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
        "// Create an order.\ntype create_order = (_: {\ncustomer: {\n    id: string,\n"
        '    tier?: "free" | "pro",\n    },\nlines: {\n    sku: string,\n    qty: number,\n'
        "    }[],\n// Free text\nnote?: string | null,\n}) => any;\n\n"
        "// Check the service.\ntype ping = () => any;\n\n"
        # a tool without description: rendered with "" (no comment line), upstream 400s (d28)
        "type no_description = (_: {\n}) => any;\n\n"
        "} // namespace functions<|end|>"
        + "<|start|>user<|message|>Order two apples for c1.<|end|>"
        + ASSISTANT
    )
    assert prepared.function_names == {"create_order", "ping", "no_description"}
    assert prepared.namespaces == frozenset()


def test_hosted_tools_are_skipped_but_echoed(encoding: HarmonyEncoding) -> None:
    tools = [
        {"type": "web_search"},
        {"type": "web_search_preview", "search_context_size": "low"},
        {"type": "code_interpreter", "container": "cntr_1"},
    ]
    prepared = prepare(encoding, input="hi", tools=tools)
    assert text_of(encoding, prepared) == (
        system() + EMPTY_DEVELOPER + "<|start|>user<|message|>hi<|end|>" + ASSISTANT
    )
    assert prepared.echo["tools"] == [
        # unset fields: the spec's default, or left out where it has none
        {
            "type": "web_search",
            "external_web_access": True,
            "filters": None,
            "search_context_size": "medium",
            "user_location": None,
        },
        {"type": "web_search_preview", "search_context_size": "low", "user_location": None},
        {"container": "cntr_1", "type": "code_interpreter", "allowed_callers": None},
    ]


def test_namespace_tools_render_as_their_own_namespace(encoding: HarmonyEncoding) -> None:
    tools = [
        {
            "type": "namespace",
            "name": "crm",
            "description": "Customer records.",
            "tools": [
                {
                    "type": "function",
                    "name": "lookup",
                    "description": "Find a customer.",
                    "parameters": {"type": "object", "properties": {"email": {"type": "string"}}},
                },
                {"type": "function", "name": "count"},
            ],
        },
        # The default namespace of Codex: its tools are plain function tools.
        {
            "type": "namespace",
            "name": "functions",
            "description": "Defaults.",
            "tools": [{"type": "function", "name": "now", "description": "Time."}],
        },
    ]
    input_items = [
        {"role": "user", "content": "Who is a@b.c?"},
        {
            "type": "function_call",
            "namespace": "crm",
            "name": "lookup",
            "arguments": '{"email":"a@b.c"}',
            "call_id": "c1",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "Ada"},
    ]
    prepared = prepare(encoding, input=input_items, tools=tools)
    assert text_of(encoding, prepared) == (
        system(functions=True) + "<|start|>developer<|message|># Tools\n\n"
        "## crm\n\n// Customer records.\nnamespace crm {\n\n// Find a customer.\n"
        "type lookup = (_: {\nemail?: string,\n}) => any;\n\ntype count = () => any;\n\n"
        "} // namespace crm\n\n"
        "## functions\n\nnamespace functions {\n\n// Time.\ntype now = () => any;\n\n"
        "} // namespace functions<|end|>"
        + "<|start|>user<|message|>Who is a@b.c?<|end|>"
        + call("crm.lookup", '{"email":"a@b.c"}')
        + "<|start|>crm.lookup<|message|>Ada<|end|>"
        + ASSISTANT
    )
    assert prepared.namespaces == {"crm"}
    assert prepared.function_names == {"now"}
    assert prepared.echo["tools"][0] == {
        "description": "Customer records.",
        "name": "crm",
        "tools": [
            {
                "name": "lookup",
                "type": "function",
                "allowed_callers": None,
                "description": "Find a customer.",
                "output_schema": None,
                "parameters": {"type": "object", "properties": {"email": {"type": "string"}}},
                "strict": None,
            },
            {
                "name": "count",
                "type": "function",
                "allowed_callers": None,
                "description": None,
                "output_schema": None,
                "parameters": None,
                "strict": None,
            },
        ],
        "type": "namespace",
    }


def test_only_namespace_tools(encoding: HarmonyEncoding) -> None:
    # openai-harmony adds the "Calls to these tools..." line for the `functions` namespace only.
    tools = [
        {
            "type": "namespace",
            "name": "kb",
            "description": "",
            "tools": [{"type": "function", "name": "get", "description": "Get."}],
        }
    ]
    prepared = prepare(encoding, input="x", tools=tools)
    assert text_of(encoding, prepared) == (
        system() + "<|start|>developer<|message|># Tools\n\n## kb\n\nnamespace kb {\n\n// Get.\n"
        "type get = () => any;\n\n} // namespace kb<|end|>"
        + "<|start|>user<|message|>x<|end|>"
        + ASSISTANT
    )


# --- input items ---

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME_TOOL = {
    "type": "function",
    "name": "get_time",
    "description": "Local time.",
    "parameters": None,
}
TOOLS_HEADER = (
    system(functions=True)
    + "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
    "// Weather for a city.\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n"
    "// Local time.\ntype get_time = () => any;\n\n} // namespace functions<|end|>"
)


def test_multi_turn_with_tool_calls_and_outputs(encoding: HarmonyEncoding) -> None:
    items = [
        {"role": "user", "content": "Weather and time in Oslo?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Call both."}],
        },
        {
            "type": "function_call",
            "call_id": "a",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
            "id": "fc_1",
            "status": "completed",
        },
        {"type": "function_call", "call_id": "b", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "b", "output": "09:30"},
        {
            "type": "function_call_output",
            "call_id": "a",
            "output": [
                {"type": "input_text", "text": "Rain, "},
                {"type": "input_text", "text": "8 °C"},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Rainy, 8 °C, ", "annotations": []},
                {"type": "output_text", "text": "09:30.", "annotations": []},
            ],
        },
        {"role": "user", "content": "Thanks!"},
    ]
    prepared = prepare(encoding, input=items, tools=[WEATHER_TOOL, TIME_TOOL])
    assert text_of(encoding, prepared) == (
        TOOLS_HEADER
        + "<|start|>user<|message|>Weather and time in Oslo?<|end|>"
        + "<|start|>assistant<|message|>Call both.<|end|>"
        + call("functions.get_weather", '{"city":"Oslo"}')
        + call("functions.get_time", "{}")
        + "<|start|>functions.get_time<|message|>09:30<|end|>"
        + "<|start|>functions.get_weather<|message|>Rain, 8 °C<|end|>"
        + "<|start|>assistant<|message|>Rainy, 8 °C, 09:30.<|end|>"
        + "<|start|>user<|message|>Thanks!<|end|>"
        + ASSISTANT
    )


def test_call_id_resolves_to_the_newest_earlier_call(encoding: HarmonyEncoding) -> None:
    items = [
        {"type": "function_call", "call_id": "dup", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "dup", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "dup", "output": "x"},
    ]
    text = text_of(encoding, prepare(encoding, input=items, tools=[WEATHER_TOOL, TIME_TOOL]))
    assert text.endswith("<|start|>functions.get_time<|message|>x<|end|>" + ASSISTANT)


def test_output_before_its_call_is_rejected(encoding: HarmonyEncoding) -> None:
    items = [
        {"type": "function_call_output", "call_id": "late", "output": "x"},
        {"type": "function_call", "call_id": "late", "name": "get_time", "arguments": "{}"},
    ]
    error = rejected(encoding, {"model": MODEL, "input": items})
    assert error.param == "input[0].call_id"
    assert "'late'" in error.message


@pytest.mark.parametrize(
    ("item", "rendered"),
    [
        # summary only (what SDKs send back): the summary texts joined with "\n\n"
        (
            {
                "type": "reasoning",
                "id": "rs",
                "summary": [
                    {"type": "summary_text", "text": "One."},
                    {"type": "summary_text", "text": "Two."},
                ],
            },
            "<|start|>assistant<|message|>One.\n\nTwo.<|end|>",
        ),
        # content wins over summary
        (
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "S"}],
                "content": [{"type": "reasoning_text", "text": "C"}],
            },
            "<|start|>assistant<|message|>C<|end|>",
        ),
        # several content parts: one text content each
        (
            {
                "type": "reasoning",
                "summary": [],
                "content": [
                    {"type": "reasoning_text", "text": "a"},
                    {"type": "reasoning_text", "text": "b"},
                ],
            },
            "<|start|>assistant<|message|>ab<|end|>",
        ),
        # neither content nor summary text (e.g. encrypted only): skipped
        ({"type": "reasoning", "summary": [], "encrypted_content": "gAAAA..."}, ""),
        (
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": ""}],
                "content": None,
            },
            "",
        ),
        ({"type": "reasoning", "summary": [], "content": []}, ""),
        # item references are skipped until the proxy keeps a response store
        ({"type": "item_reference", "id": "msg_123"}, ""),
        # a refusal part renders its text
        (
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
            "<|start|>assistant<|message|>I can't.<|end|>",
        ),
        # an empty list content is an empty message, as upstream renders it
        ({"role": "user", "content": []}, "<|start|>user<|message|><|end|>"),
    ],
)
def test_item_rendering(encoding: HarmonyEncoding, item: dict[str, Any], rendered: str) -> None:
    prepared = prepare(encoding, input=[{"role": "user", "content": "Q"}, item])
    assert text_of(encoding, prepared) == (
        system() + EMPTY_DEVELOPER + "<|start|>user<|message|>Q<|end|>" + rendered + ASSISTANT
    )


def test_nulls_mean_unset(encoding: HarmonyEncoding) -> None:
    nulls = dict.fromkeys(
        [
            *("instructions", "reasoning", "tools", "text", "tool_choice", "temperature"),
            *("top_p", "max_output_tokens", "metadata", "store", "stream", "user"),
            *("previous_response_id", "conversation", "prompt", "background"),
        ]
    )
    assert prepare(encoding, input="hi", **nulls) == prepare(encoding, input="hi")


# --- the requests of real clients ---

CODEX_HEADER = (
    system("high", functions=True) + "<|start|>developer<|message|># Instructions\n\n"
    "You are Codex, a coding agent. Keep going until the task is done.\n\n# Tools\n\n"
    "## functions\n\nnamespace functions {\n\n// Runs a shell command and returns its output.\n"
    "type shell = (_: {\n// The command to execute\ncommand: string[],\n"
    "// The working directory to execute the command in\nworkdir?: string,\n"
    "// The timeout for the command in milliseconds\ntimeout_ms?: number,\n}) => any;\n\n"
    "} // namespace functions\n\n## mcp__docs__\n\n// Tools in the mcp__docs__ namespace.\n"
    "namespace mcp__docs__ {\n\n// Search the project docs.\ntype search = (_: {\nquery: string,\n"
    "}) => any;\n\n} // namespace mcp__docs__<|end|>"
    + "<|start|>developer<|message|><permissions instructions>\nSandbox: workspace-write.\n"
    "</permissions instructions><|end|>"
    + "<|start|>user<|message|><environment_context>\n  <cwd>/home/dev/app</cwd>\n"
    "  <shell>bash</shell>\n</environment_context><|end|>"
    + "<|start|>user<|message|>Which docs mention the cache?<|end|>"
)
AGENTS_HEADER = (
    system(functions=True)
    + "<|start|>developer<|message|># Instructions\n\nYou are a helpful weather agent.\n\n"
    "# Tools\n\n## functions\n\nnamespace functions {\n\n// Get the current weather for a city.\n"
    # openai-harmony renders the pydantic `title` as a comment followed by an empty one
    "type get_weather = (_: {\n// City\n//\ncity: string,\n}) => any;\n\n"
    "} // namespace functions<|end|>"
    + "<|start|>user<|message|>What's the weather in Tokyo?<|end|>"
)
AGENTS_AFTER_TOOL = (
    AGENTS_HEADER
    + "<|start|>assistant<|message|>I should call get_weather.<|end|>"
    + call("functions.get_weather", '{"city":"Tokyo"}')
    + "<|start|>functions.get_weather<|message|>Sunny, 22 °C<|end|>"
)
VERCEL_HEADER = (
    system(functions=True)
    + "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
    "// Get the weather in a location\ntype weather = (_: {\n"
    "// The location to get the weather for\nlocation: string,\n}) => any;\n\n"
    "} // namespace functions<|end|>"
    + "<|start|>developer<|message|>You are a helpful assistant.<|end|>"
    + "<|start|>user<|message|>What is the weather in Berlin?<|end|>"
)
VERCEL_AFTER_TOOL = (
    VERCEL_HEADER
    + call("functions.weather", '{"location":"Berlin"}')
    + '<|start|>functions.weather<|message|>{"location":"Berlin","temperature":18}<|end|>'
)

CLIENT_PROMPTS = {
    "codex_first": CODEX_HEADER + ASSISTANT,
    "codex_after_tool": CODEX_HEADER
    + "<|start|>assistant<|message|>Search the docs for cache.<|end|>"
    + call("mcp__docs__.search", '{"query":"cache"}')
    + "<|start|>mcp__docs__.search<|message|>docs/caching.md: Cache invalidation<|end|>"
    + call("functions.shell", '{"command":["cat","docs/caching.md"]}')
    + "<|start|>functions.shell<|message|># Caching\nEntries expire after 5 minutes.<|end|>"
    + ASSISTANT,
    "agents_first": AGENTS_HEADER + ASSISTANT,
    "agents_after_tool": AGENTS_AFTER_TOOL + ASSISTANT,
    "agents_next_turn": AGENTS_AFTER_TOOL
    + "<|start|>assistant<|message|>It is sunny in Tokyo, 22 °C.<|end|>"
    + "<|start|>user<|message|>And tomorrow?<|end|>"
    + ASSISTANT,
    "vercel_first": VERCEL_HEADER + ASSISTANT,
    # the reasoning came back as an item_reference: skipped
    "vercel_after_tool": VERCEL_AFTER_TOOL + ASSISTANT,
    "vercel_stateless_next_turn": VERCEL_AFTER_TOOL
    + "<|start|>assistant<|message|>It is 18 °C in Berlin.<|end|>"
    + "<|start|>user<|message|>Should I take a coat?<|end|>"
    + ASSISTANT,
}


@pytest.mark.parametrize("name", sorted(clients.CLIENT_BODIES))
def test_client_request(encoding: HarmonyEncoding, name: str) -> None:
    body = copy.deepcopy(clients.CLIENT_BODIES[name])
    prepared = prepare_request(body, encoding)
    assert body == clients.CLIENT_BODIES[name]  # the body is never mutated
    assert text_of(encoding, prepared) == CLIENT_PROMPTS[name]
    assert prepared.stream is True
    orjson.dumps(prepared.completion_body)
    orjson.dumps(prepared.echo)


def test_codex_request_details(encoding: HarmonyEncoding) -> None:
    prepared = prepare_request(clients.CODEX_AFTER_TOOL, encoding)
    assert prepared.namespaces == {"mcp__docs__"}
    assert prepared.function_names == {"shell"}
    assert prepared.store is False
    assert prepared.echo["reasoning"] == {
        "context": None,
        "effort": "high",
        "generate_summary": None,
        "summary": "auto",
    }
    assert prepared.echo["prompt_cache_key"] == clients.CODEX_FIRST["prompt_cache_key"]
    assert "client_metadata" not in prepared.completion_body


# --- the /v1/completions body ---


def test_completion_body_defaults(encoding: HarmonyEncoding) -> None:
    prepared = prepare(encoding, input="hi")
    assert prepared.completion_body == {
        "model": MODEL,
        "prompt": prepared.prompt_token_ids,
        "stream": True,
        "detokenize": False,
        "max_tokens": None,
        "temperature": 1.0,
        "top_p": 1.0,
        "n": 1,
        "stop_token_ids": [200002, 200012],
        "include_stop_str_in_output": True,
        "stream_options": {"include_usage": True},
    }
    assert sorted(prepared.completion_body["stop_token_ids"]) == sorted(
        encoding.stop_tokens_for_assistant_actions()
    )
    assert prepared.prompt_token_ids[-2:] == [tokens.START, 173781]  # <|start|>assistant


def test_completion_body_sampling(encoding: HarmonyEncoding) -> None:
    prepared = prepare(
        encoding,
        input="hi",
        temperature=0,
        top_p=0.5,
        max_output_tokens=64,
        thinking_token_budget=128,
        top_logprobs=3,
        stream=False,
    )
    body = prepared.completion_body
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.0, 0.5, 64)
    assert body["thinking_token_budget"] == 128
    assert body["stream"] is True
    assert prepared.stream is False
    assert "logprobs" not in body
    assert prepared.echo["top_logprobs"] == 3
    assert prepared.echo["temperature"] == 0.0


def test_json_object_format_constrains_the_final_channel(encoding: HarmonyEncoding) -> None:
    prepared = prepare(
        encoding, input="hi", text={"format": {"type": "json_object"}, "verbosity": "medium"}
    )
    assert prepared.completion_body["response_format"] == {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<|start|>assistant<|channel|>final<|message|>"],
            "tags": [
                {
                    "type": "tag",
                    "begin": "<|start|>assistant<|channel|>final<|message|>",
                    "content": {"type": "json_schema", "json_schema": {"type": "object"}},
                    "end": "",
                }
            ],
            "at_least_one": False,
            "stop_after_first": True,
        },
    }
    assert prepared.echo["text"] == {"format": {"type": "json_object"}, "verbosity": "medium"}


def test_text_format_text_and_verbosity_only(encoding: HarmonyEncoding) -> None:
    plain = prepare(encoding, input="hi", text={"format": {"type": "text"}})
    assert "response_format" not in plain.completion_body
    assert plain.echo["text"] == {"format": {"type": "text"}}
    medium = prepare(encoding, input="hi", text={"verbosity": "medium"})
    assert medium.echo["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    for other in ("low", "high"):  # gpt-oss has no verbosity control: as OpenAI answers it
        with pytest.raises(ClientError) as caught:
            prepare(encoding, input="hi", text={"verbosity": other})
        assert (caught.value.param, caught.value.code) == ("text.verbosity", "unsupported_value")
    assert prepare(encoding, input="hi").echo["text"] == {"format": {"type": "text"}}


def test_echo_of_request_fields(encoding: HarmonyEncoding) -> None:
    prepared = prepare(
        encoding,
        input="hi",
        metadata={"k": "v"},
        user="u1",
        safety_identifier="s1",
        prompt_cache_retention="24h",
        service_tier="flex",
        truncation="auto",
        max_tool_calls=3,
        parallel_tool_calls=True,
        tool_choice={"type": "function", "name": "f"},
        tools=[{"type": "function", "name": "f"}],
        store=True,
        include=["message.output_text.logprobs"],
        stream_options={"include_obfuscation": False},
    )
    echo = prepared.echo
    assert (echo["metadata"], echo["user"], echo["safety_identifier"]) == ({"k": "v"}, "u1", "s1")
    assert (echo["prompt_cache_retention"], echo["truncation"]) == ("24h", "auto")
    assert "service_tier" not in echo  # the response names the tier used
    assert (echo["max_tool_calls"], echo["parallel_tool_calls"], echo["store"]) == (3, True, True)
    assert echo["tool_choice"] == {"type": "function", "name": "f"}
    assert prepared.store is True


# --- rejections ---


@pytest.mark.parametrize(
    ("body", "param", "shown"),
    [
        ({"model": MODEL, "input": "x", "seed": 7}, "seed", "7"),
        ({"model": MODEL, "input": "x", "frequency_penalty": 0.5}, "frequency_penalty", "0.5"),
        ({"model": MODEL, "input": "x", "stop": ["\n"]}, "stop", "an array"),
        ({"model": MODEL, "input": "x", "n": 2}, "n", "2"),
        ({"model": MODEL, "input": "x", "max_tokens": 9}, "max_tokens", "max_output_tokens"),
        ({"model": MODEL, "messages": []}, "messages", "'input'"),
        (
            {"model": MODEL, "input": [{"role": "user", "content": "x", "name": "bob"}]},
            "input[0].name",
            "'bob'",
        ),
        (
            {
                "model": MODEL,
                "input": [
                    {
                        "type": "function_call",
                        "call_id": "c",
                        "name": "f",
                        "arguments": "{}",
                        "seed": 1,
                    }
                ],
            },
            "input[0].seed",
            "1",
        ),
        (
            {"model": MODEL, "input": "x", "reasoning": {"effort": "minimal"}},
            "reasoning.effort",
            "'minimal'",
        ),
        (
            {"model": MODEL, "input": "x", "reasoning": {"effort": "xhigh"}},
            "reasoning.effort",
            "'xhigh'",
        ),
        (
            {
                "model": MODEL,
                "input": "x",
                "tools": [{"type": "file_search", "vector_store_ids": []}],
            },
            "tools[0].type",
            "'file_search'",
        ),
        (
            {"model": MODEL, "input": "x", "tools": [{"type": "mcp", "server_label": "s"}]},
            "tools[0].type",
            "'mcp'",
        ),
        (
            {"model": MODEL, "input": "x", "tools": [{"type": "image_generation"}]},
            "tools[0].type",
            "'image_generation'",
        ),
        (
            {"model": MODEL, "input": "x", "tools": [{"type": "computer_use_preview"}]},
            "tools[0].type",
            "'computer_use_preview'",
        ),
        (
            {"model": MODEL, "input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]},
            "tools[0].type",
            "'custom'",
        ),
        (
            {
                "model": MODEL,
                "input": "x",
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "tools[0].function",
            "flat",
        ),
        (
            {
                "model": MODEL,
                "input": "x",
                "tools": [{"type": "namespace", "name": "a.b", "tools": []}],
            },
            "tools[0].name",
            "'a.b'",
        ),
        (
            {
                "model": MODEL,
                "input": "x",
                "tools": [
                    {"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": "c"}]}
                ],
            },
            "tools[0].tools[0].type",
            "'custom'",
        ),
        (
            {"model": MODEL, "input": [{"type": "web_search_call", "id": "ws"}]},
            "input[0].type",
            "'web_search_call'",
        ),
        ({"model": MODEL, "input": [{"type": "banana"}]}, "input[0].type", "'banana'"),
        ({"model": MODEL, "input": [{"content": "x"}]}, "input[0].type", "Missing"),
        ({"model": MODEL, "input": [{"role": "tool", "content": "x"}]}, "input[0].role", "'tool'"),
        (
            {
                "model": MODEL,
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://x/y.png"}],
                    }
                ],
            },
            "input[0].content[0].type",
            "text only",
        ),
        (
            {
                "model": MODEL,
                "input": [
                    {"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}
                ],
            },
            "input[0].content[0].type",
            "'input_file'",
        ),
        (
            {
                "model": MODEL,
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {
                        "type": "function_call_output",
                        "call_id": "c",
                        "output": [{"type": "input_image", "image_url": "u"}],
                    },
                ],
            },
            "input[1].output[0].type",
            "'input_image'",
        ),
        (
            {
                "model": MODEL,
                "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}],
            },
            "input[0].call_id",
            "'nope'",
        ),
        (
            {"model": MODEL, "input": "x", "background": True, "store": False},
            "background",
            "'store': true",
        ),
        (
            {"model": MODEL, "input": "x", "previous_response_id": "resp_1"},
            "previous_response_id",
            "store is off",
        ),
        (
            {"model": MODEL, "input": "x", "previous_response_id": "msg_1"},
            "previous_response_id",
            "begins with 'resp_'",
        ),
        ({"model": MODEL, "input": "x", "conversation": "conv_1"}, "conversation", "'conv_1'"),
        ({"model": MODEL, "input": "x", "prompt": {"id": "pmpt_1"}}, "prompt", "templates"),
        ({"input": "x"}, "model", "Missing"),
        ({"model": 3, "input": "x"}, "model", "3"),
        ({"model": MODEL}, "input", "Missing"),
        ({"model": MODEL, "input": 5}, "input", "5"),
        ({"model": MODEL, "input": {"role": "user"}}, "input", "an object"),
        ({"model": MODEL, "input": "x", "temperature": 3}, "temperature", "3"),
        ({"model": MODEL, "input": "x", "temperature": True}, "temperature", "true"),
        ({"model": MODEL, "input": "x", "top_p": "1"}, "top_p", "'1'"),
        ({"model": MODEL, "input": "x", "max_output_tokens": 0}, "max_output_tokens", "0"),
        ({"model": MODEL, "input": "x", "top_logprobs": 21}, "top_logprobs", "21"),
        ({"model": MODEL, "input": "x", "stream": "yes"}, "stream", "'yes'"),
        ({"model": MODEL, "input": "x", "metadata": {"k": 1}}, "metadata.k", "1"),
        ({"model": MODEL, "input": "x", "tool_choice": "sometimes"}, "tool_choice", "'sometimes'"),
        (
            {"model": MODEL, "input": "x", "text": {"format": {"type": "grammar"}}},
            "text.format.type",
            "'grammar'",
        ),
        (
            {
                "model": MODEL,
                "input": "x",
                "text": {"format": {"type": "json_schema", "name": "n"}},
            },
            "text.format.schema",
            "Missing",
        ),
        ({"model": MODEL, "input": "x", "instructions": ["a"]}, "instructions", "an array"),
        ({"model": MODEL, "input": "\ud800"}, "input", "surrogate"),
        (
            {
                "model": MODEL,
                "input": "x",
                "tools": [{"type": "function", "name": "f", "parameters": {"x": float("nan")}}],
            },
            "tools[0].parameters.x",
            "finite",
        ),
        ({"model": MODEL, "input": "x", "metadata": {"k": 2**70}}, "metadata.k", "64-bit"),
    ],
)
def test_rejections_name_the_field_and_value(
    encoding: HarmonyEncoding, body: dict[str, Any], param: str, shown: str
) -> None:
    error = rejected(encoding, body)
    assert error.status == 400
    assert error.param == param
    assert param in error.message or param.split(".")[-1] in error.message
    assert shown in error.message
    assert error.to_body()["error"]["type"] == "invalid_request_error"


def test_deep_nesting_is_rejected(encoding: HarmonyEncoding) -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(150):
        schema = {"type": "object", "properties": {"a": schema}}
    error = rejected(
        encoding,
        {
            "model": MODEL,
            "input": "x",
            "tools": [{"type": "function", "name": "f", "parameters": schema}],
        },
    )
    assert "nested deeper" in error.message


def test_non_object_bodies_are_rejected(encoding: HarmonyEncoding) -> None:
    for body in (None, [], "x", 1, {1: 2}):
        rejected(encoding, body)


# --- the accepted field lists follow openai-python ---


def test_accepted_fields_are_responses_create_params() -> None:
    params = response_create_params.ResponseCreateParamsStreaming
    assert params.__required_keys__ | params.__optional_keys__ == RESPONSES_FIELDS
    assert not EXTRA_FIELDS & RESPONSES_FIELDS


def _literal_strings(annotation: Any) -> list[str]:
    """The strings of a Literal, also inside Optional[...]."""
    if isinstance(annotation, str):
        return [annotation]
    return [text for arg in typing.get_args(annotation) for text in _literal_strings(arg)]


def test_item_keys_are_those_of_openai_input_items() -> None:
    by_type: dict[str, set[str]] = {}
    for member in typing.get_args(response_input_item_param.ResponseInputItemParam):
        keys = member.__required_keys__ | member.__optional_keys__
        for kind in _literal_strings(typing.get_type_hints(member)["type"]):
            by_type.setdefault(kind, set()).update(keys)
    for kind, shape in INPUT_ITEM.by_type.items():
        assert shape.allowed == by_type[kind], kind
