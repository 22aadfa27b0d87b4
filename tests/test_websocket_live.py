"""WebSocket mode of `GET /v1/responses` on a real uvicorn with the HTTP guard, the simulator as
upstream: openai-python's `responses.connect()`, a tool loop continued with
`previous_response_id` and `store: false`, and the session's bounds with a raw client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from proxy.simulator import SimulatorConfig, create_simulator_app
from tests.agents_support import MODEL as AGENT_MODEL
from tests.agents_support import weather_agent
from tests.live import LiveServer
from tests.reliability import Proxy, running_proxy
from tests.stateful_support import TOOLS

SIM = SimulatorConfig(stream_interval=4, token_seconds=0.0005, first_token_seconds=0.001)
MODEL = "gpt-oss-120b"


@pytest.fixture(scope="module")
def upstream(encoding: HarmonyEncoding) -> Iterator[str]:
    with LiveServer(create_simulator_app(SIM, encoding)) as server:
        yield server.url


@pytest.fixture(scope="module")
def proxy(upstream: str, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    with running_proxy(upstream, encoding, store_url="off") as proxy:
        yield proxy


def client_of(proxy: Proxy) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)


def one_turn(connection: Any, **request: Any) -> list[Any]:
    connection.response.create(**request)
    events = []
    for event in connection:
        events.append(event)
        if event.type in ("response.completed", "response.failed", "response.incomplete", "error"):
            return events
    raise AssertionError("the connection ended without a terminal event")


def test_responses_connect_answers_a_turn_with_the_events_of_the_sse_stream(proxy: Proxy) -> None:
    with client_of(proxy) as client, client.responses.connect() as connection:
        events = one_turn(connection, model=MODEL, input="Say hello.")
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_a_tool_loop_continues_the_connections_last_response_with_store_false(
    proxy: Proxy,
) -> None:
    tools = TOOLS
    with client_of(proxy) as client, client.responses.connect() as connection:
        first = one_turn(
            connection, model=MODEL, input="Weather in Paris?", tools=tools, store=False
        )[-1].response
        calls = [item for item in first.output if item.type == "function_call"]
        assert calls, [item.type for item in first.output]
        outputs: Any = [
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
            for call in calls
        ]
        second = one_turn(
            connection,
            model=MODEL,
            input=outputs,
            tools=tools,
            store=False,
            previous_response_id=first.id,
        )[-1]
    assert second.type == "response.completed", second
    assert second.response.previous_response_id == first.id
    # The history came from the connection: the prompt holds the first turn's input.
    assert second.response.usage.input_tokens > first.usage.input_tokens
    # Over HTTP, with the store off, nothing knows that response.
    with client_of(proxy) as client, pytest.raises(Exception, match=r"previous_response|store"):
        client.responses.create(
            model=MODEL, input=outputs, tools=tools, store=False, previous_response_id=first.id
        )


def test_the_agents_sdk_websocket_model_runs_a_tool_loop(proxy: Proxy) -> None:
    import agents  # the openai-agents package (dev set)
    from openai import AsyncOpenAI

    calls: list[str] = []

    async def run() -> object:
        async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x") as client:
            agent = weather_agent(client, calls)
            agent.model = agents.OpenAIResponsesWSModel(model=AGENT_MODEL, openai_client=client)
            first = await agents.Runner.run(agent, "What's the weather in Paris?")
            second = await agents.Runner.run(
                agent, [*first.to_input_list(), {"role": "user", "content": "And in Tokyo?"}]
            )
            await agent.model.close()
            return second.final_output

    final = asyncio.run(run())
    assert len(calls) >= 2  # the model called the tool in each run, over the WebSocket
    assert isinstance(final, str)
    assert final
    assert proxy.metric("proxy_websocket_messages_total", direction="in") >= 4


@pytest.fixture(scope="module")
def stored(upstream: str, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    with running_proxy(upstream, encoding, store_url="memory://") as proxy:
        yield proxy


def test_a_stored_response_continues_over_the_socket_as_over_http_for_its_credential(
    stored: Proxy,
) -> None:
    with (
        OpenAI(base_url=stored.url + "/v1", api_key="sk-alice", max_retries=0) as alice,
        OpenAI(base_url=stored.url + "/v1", api_key="sk-bob", max_retries=0) as bob,
    ):
        made = alice.responses.create(model=MODEL, input="Remember the number 7.")
        with alice.responses.connect() as connection:
            turn = one_turn(
                connection, model=MODEL, input="Which number?", previous_response_id=made.id
            )[-1]
            kept = turn.response.id
            # The session's own last response, stored: continued through the store.
            again = one_turn(connection, model=MODEL, input="Again?", previous_response_id=kept)
        with bob.responses.connect() as connection:
            foreign = one_turn(
                connection, model=MODEL, input="Which number?", previous_response_id=made.id
            )[-1]
        later = alice.responses.retrieve(again[-1].response.id)
    assert turn.type == "response.completed"
    assert turn.response.usage is not None
    assert made.usage is not None
    assert turn.response.usage.input_tokens > made.usage.input_tokens
    assert again[-1].type == "response.completed"
    assert later.previous_response_id == kept
    assert foreign.type == "error"
    assert foreign.error.code == "previous_response_not_found"


def test_a_session_forgets_its_unstored_response_when_it_closes(proxy: Proxy) -> None:
    with client_of(proxy) as client:
        with client.responses.connect() as connection:
            first = one_turn(connection, model=MODEL, input="Hi", store=False)[-1].response
        with client.responses.connect() as connection:
            refused = one_turn(
                connection, model=MODEL, input="Again", store=False, previous_response_id=first.id
            )[-1]
    assert refused.type == "error"
    assert refused.status == 400


def test_a_stored_warm_up_is_retrievable_and_continued_over_http(stored: Proxy) -> None:
    with OpenAI(base_url=stored.url + "/v1", api_key="sk-carol", max_retries=0) as client:
        with client.responses.connect() as connection:
            connection.send(
                {"type": "response.create", "model": MODEL, "input": "Hi", "generate": False}
            )
            warm = None
            for event in connection:
                if event.type == "response.completed":
                    warm = event.response
                    break
        assert warm is not None
        kept = client.responses.retrieve(warm.id)
        later = client.responses.create(
            model=MODEL, input="Go on.", previous_response_id=warm.id, max_output_tokens=16
        )
    assert kept.status == "completed"
    assert kept.output == []
    assert later.previous_response_id == warm.id
