"""WebSocket mode of `GET /v1/responses` on a real uvicorn with the HTTP guard, the simulator as
upstream: openai-python's `responses.connect()`, a tool loop continued with
`previous_response_id` and `store: false`, and the session's bounds with a raw client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from proxy.simulator import SimulatorConfig, create_simulator_app
from tests.live import LiveServer
from tests.reliability import Proxy, running_proxy

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
    with client_of(proxy).responses.connect() as connection:
        events = one_turn(connection, model=MODEL, input="Say hello.")
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
