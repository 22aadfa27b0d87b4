"""WebSocket sessions of `GET /v1/responses` against hostile and unlucky clients, with a raw
`websockets` client on a real uvicorn with the HTTP guard: bad messages are `error` events and
the session goes on; an oversized message closes with 1009; a second `response.create` mid-turn
is refused; a client gone mid-turn cancels the upstream request; an idle session is closed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from proxy.simulator import SimulatorConfig, create_simulator_app, simulator_state
from tests.live import LiveServer, wait_for
from tests.openapi import assert_events_match_spec, spec_errors
from tests.reliability import Proxy, running_proxy

#: Slow tokens: a turn lasts long enough to be interrupted.
SLOW = SimulatorConfig(stream_interval=1, token_seconds=0.01, first_token_seconds=0.001)
MODEL = "gpt-oss-120b"
TERMINAL = ("response.completed", "response.failed", "response.incomplete")


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[Any]:
    app = create_simulator_app(SLOW, encoding)
    with LiveServer(app) as server:
        yield server, app


@pytest.fixture(scope="module")
def proxy(sim: Any, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    with running_proxy(
        sim[0].url, encoding, store_url="off", ws_max_message_bytes=4096, ws_idle_timeout=1.0
    ) as proxy:
        yield proxy


def ws(proxy: Proxy) -> ClientConnection:
    return connect(proxy.url.replace("http://", "ws://") + "/v1/responses", open_timeout=5)


def receive(connection: Any) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(connection.recv(timeout=10))
    return event


def create(connection: Any, **fields: Any) -> None:
    body = {"type": "response.create", "model": MODEL, "input": "Tell me a long story.", **fields}
    connection.send(json.dumps(body))


def test_bad_messages_are_error_events_and_the_session_goes_on(proxy: Proxy) -> None:
    with ws(proxy) as connection:
        connection.send("{not json")
        bad_json = receive(connection)
        connection.send(json.dumps({"type": "session.update"}))
        unknown = receive(connection)
        connection.send(json.dumps({"type": "response.create", "model": MODEL, "background": True}))
        background = receive(connection)
        create(connection, max_output_tokens=16)
        events = [receive(connection)]
        while events[-1]["type"] not in TERMINAL:
            events.append(receive(connection))
    assert (bad_json["type"], bad_json["status"], bad_json["error"]["code"]) == (
        "error",
        400,
        "invalid_json",
    )
    assert unknown["error"]["code"] == "unknown_event_type"
    assert unknown["error"]["param"] == "type"
    assert background["error"]["param"] == "background"
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    # every message is one of the spec's WebSocket server events
    for event in [bad_json, unknown, background, *events]:
        assert spec_errors(event, "ResponsesServerEvent") == [], event
    assert_events_match_spec(events)
    # counted and logged per response as over HTTP, the transport named
    lines = [
        vars(r)
        for r in proxy.logs.records
        if r.getMessage() == "request" and getattr(r, "transport", None) == "ws"
    ]
    assert any(line["outcome"] in ("completed", "incomplete") for line in lines), lines
    assert wait_for(lambda: proxy.metric("proxy_websocket_turns_per_session_count") >= 1, 5)


def test_an_oversized_message_closes_the_connection_with_1009(proxy: Proxy) -> None:
    with ws(proxy) as connection:
        connection.send(json.dumps({"type": "response.create", "input": "x" * 10_000}))
        with pytest.raises(ConnectionClosed) as closed:
            connection.recv(timeout=10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009


def test_previous_response_id_with_conversation_is_refused_as_over_http(proxy: Proxy) -> None:
    with ws(proxy) as connection:
        create(connection, max_output_tokens=16, store=False)
        events = [receive(connection)]
        while events[-1]["type"] not in TERMINAL:
            events.append(receive(connection))
        create(
            connection,
            previous_response_id=events[-1]["response"]["id"],
            conversation="conv_123",
        )
        refused = receive(connection)
    assert refused["type"] == "error"
    assert refused["status"] == 400


def test_a_second_create_mid_turn_is_refused_and_the_first_turn_ends(proxy: Proxy) -> None:
    with ws(proxy) as connection:
        create(connection, stream_id="lane_1")
        first = receive(connection)
        create(connection)
        events = [first]
        while events[-1]["type"] not in TERMINAL:
            events.append(receive(connection))
    errors = [event for event in events if event["type"] == "error"]
    assert len(errors) == 1
    assert errors[0]["error"]["code"] == "websocket_stream_limit_reached"
    turn = [event for event in events if event["type"] != "error"]
    assert all(event["stream_id"] == "lane_1" for event in turn)
    assert [event["sequence_number"] for event in turn] == list(range(len(turn)))


def test_a_client_gone_mid_turn_cancels_the_upstream_request(proxy: Proxy, sim: Any) -> None:
    state = simulator_state(sim[1])
    before = len(state.requests)
    with ws(proxy) as connection:
        create(connection)
        while receive(connection)["type"] != "response.output_text.delta":
            pass
    assert wait_for(lambda: len(state.requests) > before and state.requests[-1].closed, 5)
    record = state.requests[-1]
    assert record.disconnected
    assert not record.completed
    assert wait_for(lambda: proxy.in_flight() == 0, 5)
    # the session ends just after its turn's cancellation is done
    assert wait_for(lambda: proxy.metric("proxy_websocket_sessions") == 0, 5)


def test_an_idle_session_is_closed(proxy: Proxy) -> None:
    with ws(proxy) as connection:
        started = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            connection.recv(timeout=10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1000
    assert 0.9 < time.monotonic() - started < 5


def test_a_websocket_on_another_path_is_refused(proxy: Proxy) -> None:
    with pytest.raises(Exception, match="403"):
        connect(proxy.url.replace("http://", "ws://") + "/v1/chat/completions", open_timeout=5)


def test_a_warm_up_generates_nothing_and_its_response_can_be_continued(
    proxy: Proxy, sim: Any
) -> None:
    state = simulator_state(sim[1])
    with ws(proxy) as connection:
        before = len(state.requests)
        create(connection, generate=False, store=False, instructions="Be brief.")
        warm = [receive(connection) for _ in range(3)]
        assert len(state.requests) == before  # nothing reached upstream
        create(
            connection,
            input="And now?",
            store=False,
            max_output_tokens=16,
            previous_response_id=warm[-1]["response"]["id"],
        )
        events = [receive(connection)]
        while events[-1]["type"] not in TERMINAL:
            events.append(receive(connection))
    assert [event["type"] for event in warm] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    assert warm[-1]["response"]["output"] == []
    assert warm[-1]["response"]["usage"]["output_tokens"] == 0
    assert_events_match_spec(warm)
    continued = events[-1]["response"]
    assert continued["previous_response_id"] == warm[-1]["response"]["id"]
    assert continued["usage"]["input_tokens"] > warm[-1]["response"]["usage"]["input_tokens"]
