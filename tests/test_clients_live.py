"""Real clients through the proxy in front of the simulator: the openai SDK and openai-agents."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import orjson
import pytest
from openai import AsyncOpenAI, OpenAI
from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.server.app import create_app
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from tests.agents_support import weather_agent
from tests.live import LiveServer, wait_for

MODEL = "openai/gpt-oss-120b"


@pytest.fixture(scope="module")
def servers(encoding: HarmonyEncoding) -> Iterator[tuple[str, str]]:
    config = SimulatorConfig(stream_interval=20, token_seconds=0.0005, first_token_seconds=0.001)
    with LiveServer(create_simulator_app(config, encoding)) as simulator:
        app = create_app(Settings(upstream_url=simulator.url), encoding)
        with LiveServer(app) as proxy:
            assert wait_for(lambda: app.state.proxy.capability.token_ids, 10)
            yield simulator.url, proxy.url + "/v1"


@pytest.fixture
def proxy_url(servers: tuple[str, str]) -> str:
    return servers[1]


@pytest.fixture
def simulator_url(servers: tuple[str, str]) -> str:
    return servers[0]


def test_sdk_stream_helper_long_answer_with_unicode(proxy_url: str) -> None:
    client = OpenAI(base_url=proxy_url, api_key="x", _strict_response_validation=True)
    with (
        client,
        client.responses.stream(
            model=MODEL,
            input="Tell me about 東京 and café culture ☕",
            extra_headers={"X-Sim-Tokens": "600"},
        ) as stream,
    ):
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert "".join(deltas) == final.output_text
    assert len(final.output_text) > 200
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.usage is not None
    assert final.usage.output_tokens >= 500


def test_openai_agents_runs_a_function_tool_through_the_proxy(proxy_url: str) -> None:
    import agents  # the openai-agents package (dev set)

    calls: list[str] = []

    async def run() -> tuple[object, object]:
        async with AsyncOpenAI(base_url=proxy_url, api_key="x") as client:
            agent = weather_agent(client, calls)
            result = await agents.Runner.run(agent, "What's the weather in Paris?")
            streamed = agents.Runner.run_streamed(agent, "And in Tokyo?")
            async for _ in streamed.stream_events():
                pass
            return result.final_output, streamed.final_output

    final, streamed_final = asyncio.run(run())
    assert len(calls) == 2  # one tool call per run, made by the model through the proxy
    assert isinstance(final, str)
    assert "21" in final  # the answer used the tool's output
    assert isinstance(streamed_final, str)
    assert streamed_final


def _chat_chunks(url: str) -> list[dict[str, object]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi there"}], "stream": True}
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(answer.iter_raw())
    chunks = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: {"):
            chunk = orjson.loads(block[6:])
            chunk.pop("id", None)
            chunk.pop("created", None)
            chunks.append(chunk)
    assert raw.endswith(b"data: [DONE]\n\n")
    return chunks


def test_chat_completion_stream_passes_through_unchanged(
    proxy_url: str, simulator_url: str
) -> None:
    direct = _chat_chunks(simulator_url + "/v1")
    proxied = _chat_chunks(proxy_url)
    assert proxied == direct
    assert len(proxied) > 3
