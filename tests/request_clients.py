"""Request bodies as real Responses clients send them to gpt-oss: first turn and the turn after a
tool call. Written from the clients' own request-building code:

- Codex (openai/codex `codex-rs`): `ResponsesApiRequest` serialises model, instructions, input,
  tools, tool_choice "auto", parallel_tool_calls, reasoning, store false, stream true, include,
  prompt_cache_key (the thread id) and client_metadata; tools are `ToolSpec`s (`function` with
  strict false, `web_search`, `namespace` groups of MCP tools); input items are `ResponseItem`s:
  messages with `input_text` parts, reasoning with `summary` / `content` / `encrypted_content`
  (null), `function_call` with `namespace` for namespaced tools, `function_call_output`.
- openai-agents (`OpenAIResponsesModel._build_response_create_kwargs`): input, include (a list,
  often empty), instructions, tools (strict function schemas), stream; replayed output items are
  `model_dump(exclude_unset=True)` of what the server sent, so null fields stay in.
- Vercel AI SDK (`@ai-sdk/openai` `convertToOpenAIResponsesInput`): for a model id starting with
  "o" (as `openai/gpt-oss-120b` does) the system prompt is a developer message; user content is a
  list of `input_text` parts; with the default `store` the reasoning of earlier steps is sent back
  as an `item_reference`, function calls in full; with `store: false` assistant text comes back
  as `{"role": "assistant", "content": [output_text parts], "id": ...}`.
"""

from __future__ import annotations

from typing import Any

MODEL = "openai/gpt-oss-120b"

CODEX_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The command to execute",
                },
                "workdir": {
                    "type": "string",
                    "description": "The working directory to execute the command in",
                },
                "timeout_ms": {
                    "type": "number",
                    "description": "The timeout for the command in milliseconds",
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {"type": "web_search", "external_web_access": False},
    {
        "type": "namespace",
        "name": "mcp__docs__",
        "description": "Tools in the mcp__docs__ namespace.",
        "tools": [
            {
                "type": "function",
                "name": "search",
                "description": "Search the project docs.",
                "strict": False,
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"],
                    "additionalProperties": False,
                },
            }
        ],
    },
]

CODEX_FIRST: dict[str, Any] = {
    "model": MODEL,
    "instructions": "You are Codex, a coding agent. Keep going until the task is done.",
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [
                {
                    "type": "input_text",
                    "text": "<permissions instructions>\nSandbox: workspace-write.\n"
                    "</permissions instructions>",
                }
            ],
        },
        {
            "type": "message",
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": "<environment_context>\n  <cwd>/home/dev/app</cwd>\n"
                    "  <shell>bash</shell>\n</environment_context>",
                }
            ],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Which docs mention the cache?"}],
        },
    ],
    "tools": CODEX_TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "high", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199a6f2-8c1e-7d30-9a4b-3f0e2c1d5b6a",
    "client_metadata": {"x-codex-installation-id": "5d1c0e3a-1b2f-4c6d-8e9f-0a1b2c3d4e5f"},
}

CODEX_AFTER_TOOL: dict[str, Any] = {
    **CODEX_FIRST,
    "input": [
        *CODEX_FIRST["input"],
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Search the docs for cache."}],
            "encrypted_content": None,
        },
        {
            "type": "function_call",
            "name": "search",
            "namespace": "mcp__docs__",
            "arguments": '{"query":"cache"}',
            "call_id": "call_7Hq2",
        },
        {
            "type": "function_call_output",
            "call_id": "call_7Hq2",
            "output": "docs/caching.md: Cache invalidation",
        },
        {
            "type": "function_call",
            "name": "shell",
            "arguments": '{"command":["cat","docs/caching.md"]}',
            "call_id": "call_9Kx4",
        },
        {
            "type": "function_call_output",
            "call_id": "call_9Kx4",
            "output": "# Caching\nEntries expire after 5 minutes.",
        },
    ],
}

AGENTS_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "parameters": {
        "properties": {"city": {"title": "City", "type": "string"}},
        "required": ["city"],
        "title": "get_weather_args",
        "type": "object",
        "additionalProperties": False,
    },
    "strict": True,
    "type": "function",
    "description": "Get the current weather for a city.",
}

AGENTS_FIRST: dict[str, Any] = {
    "instructions": "You are a helpful weather agent.",
    "model": MODEL,
    "input": [{"content": "What's the weather in Tokyo?", "role": "user"}],
    "include": [],
    "tools": [AGENTS_TOOL],
    "stream": True,
}

AGENTS_AFTER_TOOL: dict[str, Any] = {
    **AGENTS_FIRST,
    "input": [
        *AGENTS_FIRST["input"],
        {
            "id": "rs_00000000000000000000000000000003",
            "summary": [],
            "type": "reasoning",
            "content": [{"text": "I should call get_weather.", "type": "reasoning_text"}],
            "encrypted_content": None,
            "status": None,
        },
        {
            "arguments": '{"city":"Tokyo"}',
            "call_id": "call_00000000000000000000000000000005",
            "name": "get_weather",
            "type": "function_call",
            "id": "fc_00000000000000000000000000000004",
            "status": "completed",
        },
        {
            "call_id": "call_00000000000000000000000000000005",
            "output": "Sunny, 22 °C",
            "type": "function_call_output",
        },
    ],
}

AGENTS_NEXT_TURN: dict[str, Any] = {
    **AGENTS_FIRST,
    "input": [
        *AGENTS_AFTER_TOOL["input"],
        {
            "id": "msg_00000000000000000000000000000007",
            "content": [
                {
                    "annotations": [],
                    "text": "It is sunny in Tokyo, 22 °C.",
                    "type": "output_text",
                    "logprobs": None,
                }
            ],
            "role": "assistant",
            "status": "completed",
            "type": "message",
            "phase": None,
        },
        {"content": "And tomorrow?", "role": "user"},
    ],
}

VERCEL_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "weather",
    "description": "Get the weather in a location",
    "parameters": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The location to get the weather for"}
        },
        "required": ["location"],
        "additionalProperties": False,
    },
    "strict": False,
}

VERCEL_FIRST: dict[str, Any] = {
    "model": MODEL,
    "input": [
        {"role": "developer", "content": "You are a helpful assistant."},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "What is the weather in Berlin?"}],
        },
    ],
    "tools": [VERCEL_TOOL],
    "tool_choice": "auto",
    "stream": True,
}

VERCEL_AFTER_TOOL: dict[str, Any] = {
    **VERCEL_FIRST,
    "input": [
        *VERCEL_FIRST["input"],
        {"type": "item_reference", "id": "rs_00000000000000000000000000000003"},
        {
            "type": "function_call",
            "call_id": "call_00000000000000000000000000000005",
            "name": "weather",
            "arguments": '{"location":"Berlin"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_00000000000000000000000000000005",
            "output": '{"location":"Berlin","temperature":18}',
        },
    ],
}

VERCEL_STATELESS_NEXT_TURN: dict[str, Any] = {
    **VERCEL_FIRST,
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "input": [
        *VERCEL_FIRST["input"],
        {
            "type": "function_call",
            "call_id": "call_00000000000000000000000000000005",
            "name": "weather",
            "arguments": '{"location":"Berlin"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_00000000000000000000000000000005",
            "output": '{"location":"Berlin","temperature":18}',
        },
        {
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is 18 °C in Berlin."}],
            "id": "msg_00000000000000000000000000000007",
        },
        {"role": "user", "content": [{"type": "input_text", "text": "Should I take a coat?"}]},
    ],
}

CLIENT_BODIES: dict[str, dict[str, Any]] = {
    "codex_first": CODEX_FIRST,
    "codex_after_tool": CODEX_AFTER_TOOL,
    "agents_first": AGENTS_FIRST,
    "agents_after_tool": AGENTS_AFTER_TOOL,
    "agents_next_turn": AGENTS_NEXT_TURN,
    "vercel_first": VERCEL_FIRST,
    "vercel_after_tool": VERCEL_AFTER_TOOL,
    "vercel_stateless_next_turn": VERCEL_STATELESS_NEXT_TURN,
}
