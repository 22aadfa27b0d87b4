"""The Agents SDK's `OpenAIResponsesCompactionSession` on a long multi-turn tool loop through
the proxy: the session compacts with `responses.compact` whenever its history grows, the prompt
upstream reads shrinks each time, the agent keeps calling its tool and answering, and every
compact answer validates against the spec."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from openai_harmony import HarmonyEncoding

from proxy.store.memory import MemoryStore
from tests.agents_support import MODEL, weather_agent
from tests.openapi import assert_matches_spec, assert_response_matches_spec
from tests.stateful_support import Stack, stack

CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Accra", "Riga")


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding) -> Iterator[Stack]:
    with stack(encoding, MemoryStore(), reasoning_keys=(("k1", b"3" * 32),)) as running:
        yield running


@pytest.mark.parametrize("mode", ["input", "previous_response_id"])
def test_a_long_agent_run_with_the_compaction_session(live: Stack, mode: str) -> None:
    import agents

    calls: list[str] = []
    answers: list[dict[str, Any]] = []

    async def keep(response: httpx.Response) -> None:
        if response.request.url.path.endswith("/responses/compact"):
            await response.aread()
            assert response.status_code == 200, response.text
            answers.append(response.json())
        elif response.request.url.path.endswith("/responses") and response.status_code == 200:
            await response.aread()
            assert_response_matches_spec(response.json())

    async def run() -> tuple[list[str], list[Any]]:
        hooks = {"response": [keep]}
        async with (
            httpx.AsyncClient(event_hooks=hooks) as http,
            AsyncOpenAI(base_url=live.base_url, api_key="key-agents", http_client=http) as client,
        ):
            agent = weather_agent(client, calls)
            session = agents.OpenAIResponsesCompactionSession(
                f"run-{mode}",
                agents.SQLiteSession(f"run-{mode}"),
                client=client,
                model=MODEL,
                compaction_mode=mode,  # type: ignore[arg-type]
            )
            finals = []
            for city in CITIES:
                result = await agents.Runner.run(
                    agent, f"What's the weather in {city}?", session=session
                )
                finals.append(str(result.final_output))
            return finals, await session.get_items()

    before = len(live.completions())
    finals, items = asyncio.run(run())
    # The agent kept working: one tool call per turn, each answer from the tool's output.
    assert calls == [f"What's the weather in {city}?" for city in CITIES]  # the scripted model
    assert all("21 °C" in final for final in finals)
    # The session compacted, several times, and the answers validate against the spec.
    assert len(answers) >= 3
    for answer in answers:
        assert_matches_spec(answer, "CompactResource")
        assert answer["output"][-1]["type"] == "compaction"
        assert answer["usage"]["output_tokens"] > 0
    assert [item.get("type") for item in items].count("compaction") == 1  # the latest only
    # The prompt shrinks: the turns right after a compaction read less than the turns
    # before it, and the last turn reads far less than the whole history would need.
    records = [r for r in live.completions()[before:] if r.path == "/v1/completions"]
    turn_prompts = [len(r.prompt_ids) for r in records]
    drops = sum(1 for a, b in itertools.pairwise(turn_prompts) if b < a * 0.8)
    assert drops >= 3, turn_prompts
    growth = turn_prompts[1] - turn_prompts[0]  # what one tool round adds
    assert max(turn_prompts) < turn_prompts[0] + growth * len(CITIES), turn_prompts
