"""What one WebSocket session of `GET /v1/responses` may hold, with a raw `websockets` client on
a real uvicorn with the HTTP guard, the simulator as upstream: only a response resets the idle
clock (junk messages and refused turns do not); the history a session keeps for
`previous_response_id` is bounded (a stored response is kept as its id alone; an unstored history
over `ws_max_message_bytes` is not kept, and naming it is a clear 400); a turn holds its message's
size in the body budget until rendered, a full budget answering it with a 503 `error` event on a
connection that stays open."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from proxy.simulator import SimulatorConfig, create_simulator_app, simulator_state
from tests.live import LiveServer, wait_for
from tests.openapi import spec_errors
from tests.reliability import Proxy, running_proxy

SIM = SimulatorConfig(stream_interval=4, token_seconds=0.0005, first_token_seconds=0.001)
MODEL = "gpt-oss-120b"
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")
IDLE = 1.5
MAX_MESSAGE = 8192
BUDGET = 16384


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[Any]:
    app = create_simulator_app(SIM, encoding)
    with LiveServer(app) as server:
        yield server, app


@pytest.fixture(scope="module")
def proxy(sim: Any, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    with running_proxy(
        sim[0].url,
        encoding,
        store_url="memory://",
        ws_max_message_bytes=MAX_MESSAGE,
        ws_idle_timeout=IDLE,
        body_budget_bytes=BUDGET,
        body_budget_wait=0.3,
    ) as proxy:
        yield proxy


def ws(proxy: Proxy) -> ClientConnection:
    return connect(proxy.url.replace("http://", "ws://") + "/v1/responses", open_timeout=5)


def receive(connection: Any) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(connection.recv(timeout=10))
    return event


def turn(connection: Any, **fields: Any) -> list[dict[str, Any]]:
    body = {"type": "response.create", "model": MODEL, "input": "Say hi.", **fields}
    connection.send(json.dumps(body))
    events = [receive(connection)]
    while events[-1]["type"] not in TERMINAL:
        events.append(receive(connection))
    return events


def closed_after(connection: Any, started: float, poke: Any = None) -> float:
    """Seconds from `started` until the server closed `connection` (`poke`: called every 0.3 s
    meanwhile, answers drained); its close code must be 1000."""
    deadline = time.monotonic() + 10
    poked = 0.0
    while time.monotonic() < deadline:
        if poke is not None and time.monotonic() - poked >= 0.3:
            poked = time.monotonic()
            with contextlib.suppress(ConnectionClosed):
                poke()
        try:
            connection.recv(timeout=0.3)
        except TimeoutError:
            continue
        except ConnectionClosed:
            took = time.monotonic() - started
            break
    else:
        raise AssertionError("the session was not closed")
    assert connection.close_code == 1000
    return took


def test_junk_and_refused_turns_do_not_keep_a_session_open(proxy: Proxy) -> None:
    junk = [
        "{}",
        "not json",
        json.dumps({"type": "session.update"}),
        json.dumps({"type": "response.create", "model": MODEL, "input": 5}),  # refused: 400
    ]
    sent = itertools.cycle(junk)
    with ws(proxy) as connection:
        started = time.monotonic()
        took = closed_after(connection, started, lambda: connection.send(next(sent)))
    assert IDLE - 0.1 < took < IDLE + 2


def test_a_response_resets_the_idle_clock(proxy: Proxy) -> None:
    with ws(proxy) as connection:
        time.sleep(IDLE * 0.6)
        events = turn(connection, store=False)
        ended = time.monotonic()
        took = closed_after(connection, ended)
    assert events[-1]["type"] == "response.completed"
    assert IDLE - 0.1 < took < IDLE + 2


def _settled(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether `check` holds within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_stored_response_is_kept_as_its_id_and_continued_through_the_store(
    proxy: Proxy,
) -> None:
    with ws(proxy) as connection:
        unstored = turn(connection, store=False, input="Remember 7. " * 40)[-1]["response"]
        # The session keeps a turn's history once its terminal event is on its way.
        kept_unstored = _settled(lambda: proxy.metric("proxy_websocket_kept_bytes") > 400)
        stored = turn(connection, previous_response_id=unstored["id"])[-1]["response"]
        kept_stored = _settled(lambda: proxy.metric("proxy_websocket_kept_bytes") == 0)
        again = turn(connection, previous_response_id=stored["id"], input="Again?")
    assert kept_unstored  # the unstored history: its input and output, encoded, over 400 bytes
    assert kept_stored  # the stored one: only its id
    assert again[-1]["type"] == "response.completed", again[-1]
    continued = again[-1]["response"]
    assert continued["previous_response_id"] == stored["id"]
    assert continued["usage"]["input_tokens"] > stored["usage"]["input_tokens"]
    assert wait_for(lambda: proxy.metric("proxy_websocket_kept_bytes") == 0, 5)


def test_an_unstored_history_over_the_message_limit_is_not_kept_and_naming_it_is_a_400(
    proxy: Proxy, sim: Any
) -> None:
    state = simulator_state(sim[1])
    with ws(proxy) as connection:
        first = turn(connection, store=False, input="a" * 3000)[-1]["response"]
        second = turn(connection, store=False, input="b" * 3000, previous_response_id=first["id"])[
            -1
        ]["response"]
        third = turn(connection, store=False, input="c" * 3000, previous_response_id=second["id"])[
            -1
        ]["response"]
        # over the bound: not kept (the gauge is set once the turn's terminal event is out)
        assert _settled(lambda: proxy.metric("proxy_websocket_kept_bytes") == 0)
        before = generations(state)
        refused = turn(
            connection, store=False, input="d", previous_response_id=third["id"], stream_id="s1"
        )[-1]
        assert generations(state) == before  # nothing reached upstream
        # The session goes on: a turn with its whole history is served.
        whole = turn(connection, store=False, input="a b c d")
    assert first["status"] == second["status"] == third["status"] == "completed"
    assert third["previous_response_id"] == second["id"]
    assert refused["type"] == "error"
    assert refused["status"] == 400
    assert refused["stream_id"] == "s1"
    error = refused["error"]
    assert error["code"] == "previous_response_not_found"
    assert error["param"] == "previous_response_id"
    assert str(MAX_MESSAGE) in error["message"]
    assert "store" in error["message"]
    assert "compact" in error["message"]
    assert spec_errors(refused, "ResponsesServerEvent") == []
    assert whole[-1]["type"] == "response.completed"


def generations(state: Any) -> int:
    return sum(1 for r in state.requests if r.path == "/v1/completions" and r.stream)


def hold_budget(proxy: Proxy) -> socket.socket:
    """A raw HTTP request whose declared body fills the whole body budget, sent no further."""
    held = socket.create_connection(("127.0.0.1", proxy.server.port))
    head = (
        "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {BUDGET}\r\n\r\n"
    )
    held.sendall(head.encode())
    return held


def test_a_turn_waits_for_the_body_budget_and_a_full_one_is_a_503_error_event(
    proxy: Proxy,
) -> None:
    with ws(proxy) as connection:
        held = hold_budget(proxy)
        try:
            assert wait_for(lambda: proxy.app.state.services.budget.used == BUDGET, 5)
            refused = turn(connection, store=False, stream_id="s2")[-1]
        finally:
            held.close()
        assert wait_for(lambda: proxy.app.state.services.budget.used == 0, 5)
        served = turn(connection, store=False)  # the connection stayed open
    assert refused["type"] == "error"
    assert refused["status"] == 503
    assert refused["stream_id"] == "s2"
    assert refused["error"]["code"] == "body_budget_exhausted"
    assert spec_errors(refused, "ResponsesServerEvent") == []
    assert served[-1]["type"] == "response.completed"
    assert proxy.app.state.services.budget.used == 0  # released once rendered
    lines = [
        vars(r)
        for r in proxy.logs.records
        if r.getMessage() == "request" and vars(r).get("error") == "body_budget_exhausted"
    ]
    assert any(line.get("transport") == "ws" for line in lines), lines
