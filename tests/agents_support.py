"""openai-agents, as the live tests use it: a weather agent with one function tool."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

MODEL = "openai/gpt-oss-120b"


def weather_agent(client: AsyncOpenAI, calls: list[str]) -> Any:
    """An `agents.Agent` on `client` whose `get_weather` tool records each city in `calls`."""
    import agents  # the openai-agents package (dev set)

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return f"It is sunny and 21 °C in {city}."

    return agents.Agent(
        name="weather",
        instructions="Use the tool to answer.",
        tools=[get_weather],
        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
    )
