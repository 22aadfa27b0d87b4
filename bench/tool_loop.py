"""Shared by the benchmarks that run an agent's tool loop against the simulator
(compaction_cost.py, ws_loop.py): the function tool its scripted model calls when a request
offers one and holds no tool output yet."""

from __future__ import annotations

from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
#: The tools of each request of the loop.
TOOLS = [WEATHER_TOOL]
