"""Serving the simulator: `start_simulator` in the caller's loop, the `simulate` command, the
simple routes, and the Harmony chat route."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from proxy.errors import UpstreamError
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.tokens import CALL, RETURN
from proxy.simulator import SimulatorConfig, main, simulator_state, start_simulator
from proxy.simulator.server import build_parser, config_from_args
from proxy.upstream.client import Upstream
from tests.simulator_helpers import FAST, SimThread, run, simulator

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST) as running:
        yield running


# -- start_simulator -----------------------------------------------------------------------------


def test_start_simulator_serves_in_the_current_loop(encoding: HarmonyEncoding) -> None:
    async def scenario() -> None:
        server = await start_simulator(FAST, encoding)
        try:
            assert server.host == "127.0.0.1"
            assert server.port > 0
            assert server.url == f"http://127.0.0.1:{server.port}"
            async with httpx.AsyncClient(base_url=server.url) as client:
                models = await client.get("/v1/models")
                assert models.json()["data"][0]["id"] == "openai/gpt-oss-120b"
                # Streaming works while the caller's loop is busy with the client.
                async with client.stream("POST", "/v1/responses", json=_responses()) as answer:
                    lines = [line async for line in answer.aiter_lines() if line]
                assert lines[-1].startswith("data: ")
                assert "response.completed" in lines[-2]
            assert simulator_state(server.app).requests[-1].completed
        finally:
            await server.stop()
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(base_url=server.url) as client:
                await client.get("/health")

    run(scenario())


def test_two_simulators_and_a_busy_port(encoding: HarmonyEncoding) -> None:
    async def scenario() -> None:
        async with simulator(encoding) as first, simulator(encoding) as second:
            assert first.server.port != second.server.port
            with pytest.raises(OSError, match="in use"):
                await start_simulator(FAST, encoding, port=first.server.port)

    run(scenario())


def _responses(**overrides: Any) -> dict[str, Any]:
    return {
        "model": "openai/gpt-oss-120b",
        "input": "Where is my order?",
        "stream": True,
        **overrides,
    }


# -- the command -----------------------------------------------------------------------------


def test_flags_make_the_config(tmp_path: Path) -> None:
    replay = tmp_path / "ids.txt"
    replay.write_text("200005, 17196 200008\n13 200002\n")
    args = build_parser().parse_args(
        [
            "--port",
            "0",
            "--stream-interval",
            "3",
            "--token-seconds",
            "0",
            "--first-token-seconds",
            "0.5",
            "--uneven",
            "--seed",
            "9",
            "--strip-return",
            "--fault",
            "stall@2:1",
            "--sim-tokens",
            "500",
            "--preamble",
            "--replay",
            str(replay),
            "--postprocess-workers",
            "--model",
            "gpt-oss-20b",
        ]
    )
    assert config_from_args(args) == SimulatorConfig(
        model="gpt-oss-20b",
        stream_interval=3,
        first_token_seconds=0.5,
        token_seconds=0.0,
        uneven=True,
        seed=9,
        return_in_ids=False,
        fault="stall@2:1",
        sim_tokens=500,
        preamble=True,
        replay=(200005, 17196, 200008, 13, 200002),
        postprocess_workers=True,
    )
    assert config_from_args(build_parser().parse_args([])) == SimulatorConfig()


def test_setup_errors_return_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--fault", "boom"]) == 1
    assert "SimulatorConfig.fault" in capsys.readouterr().err
    assert main(["--stream-interval", "0"]) == 1
    (tmp_path / "bad").write_text("1, two")
    assert main(["--replay", str(tmp_path / "bad")]) == 1
    assert main(["--replay", str(tmp_path / "missing")]) == 1


def test_python_m_proxy_simulator_serves_until_interrupted() -> None:
    command = [
        sys.executable,
        "-m",
        "proxy.simulator",
        "--port",
        "0",
        "--token-seconds",
        "0",
        "--first-token-seconds",
        "0",
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        with httpx.Client(base_url=match[1], timeout=10) as client:
            for _ in range(200):
                try:
                    assert client.get("/health").status_code == 200
                    break
                except httpx.ConnectError:
                    continue
            answer = client.post("/v1/responses", json=_responses(stream=False))
            assert answer.json()["status"] == "completed"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


# -- simple routes ---------------------------------------------------------------------------


def test_info_routes(sim: SimThread) -> None:
    health = sim.http.get("/health")
    assert (health.status_code, health.text) == (200, "")
    generate = sim.http.get("/health_generate")
    assert (generate.status_code, generate.text) == (200, "Generation health check OK")
    assert sim.http.get("/version").json() == {"version": "1.2.0"}
    models = sim.http.get("/v1/models").json()
    assert models["object"] == "list"
    assert {k: v for k, v in models["data"][0].items() if k != "created"} == {
        "id": "openai/gpt-oss-120b",
        "object": "model",
        "owned_by": "tensorrt_llm",
    }
    assert sim.http.get("/nowhere").json() == {"detail": "Not Found"}
    assert sim.http.get("/nowhere").status_code == 404


def test_metrics_are_json_iteration_stats_drained_on_read(sim: SimThread) -> None:
    sim.http.get("/metrics")
    sim.stream("/v1/responses", _responses(), {"X-Sim-Stream-Interval": "10"})
    stats = sim.http.get("/metrics").json()
    assert isinstance(stats, list)
    assert stats
    assert {"iter", "iterLatencyMS", "numActiveRequests", "kvCacheStats"} <= set(stats[0])
    assert sim.http.get("/metrics").json() == []


def test_stored_responses_are_not_found(sim: SimThread) -> None:
    answer = sim.http.get("/v1/responses/resp_123")
    assert (answer.status_code, answer.json()["message"]) == (
        404,
        "Response with id 'resp_123' not found.",
    )
    assert sim.http.delete("/v1/responses/nope").status_code == 400


def test_previous_response_id_with_and_without_store(encoding: HarmonyEncoding) -> None:
    body = {"model": "m", "input": "And then?", "previous_response_id": "resp_x"}
    with SimThread(encoding, FAST) as store:
        assert store.http.post("/v1/responses", json=body).status_code == 404
    workers = SimulatorConfig(first_token_seconds=0, token_seconds=0, postprocess_workers=True)
    with SimThread(encoding, workers) as no_store:
        answer = no_store.http.post("/v1/responses", json=body)
        assert answer.status_code == 400
        assert "requires response storage" in answer.json()["message"]
        streamed = no_store.stream("/v1/responses", _responses())
        numbers = [json.loads(data)["sequence_number"] for data in streamed.data]
        assert numbers[:3] == [0, 1, 0]  # the worker's processor counts from 0 again


# -- /v1/responses specifics -------------------------------------------------------------------


def test_responses_stream_shows_the_defect_at_stream_interval_20(sim: SimThread) -> None:
    streamed = sim.stream("/v1/responses", _responses())
    events = [json.loads(data) for data in streamed.data]
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    answer = final["output"][-1]["content"][0]["text"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas != answer  # the client sees a different answer from the snapshot
    assert {e.get("item_id") for e in events if "item_id" in e} == {""}


def test_responses_tool_call_and_length(sim: SimThread) -> None:
    tool = {
        "type": "function",
        "name": "lookup",
        "description": "Look it up.",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        },
    }
    answer = sim.http.post("/v1/responses", json=_responses(stream=False, tools=[tool])).json()
    call = answer["output"][-1]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == (
        "function_call",
        "lookup",
        {"q": "Where is my order?"},
    )
    assert sim.last.stop_reason == CALL
    assert sim.last.token_ids[-1] != CALL  # upstream's Responses path cuts the stop word
    cut = sim.http.post("/v1/responses", json=_responses(stream=False, max_output_tokens=8))
    assert cut.json()["status"] == "incomplete"
    assert sim.last.finish_reason == "length"


def test_responses_upstream_broken_stream_is_cut(sim: SimThread) -> None:
    # An unknown recipient makes upstream's response builder raise: the stream breaks.
    text = "<|channel|>commentary to=container.exec<|message|>ls<|call|>"
    ids = sim.call(_encode(sim, text))
    streamed = sim.stream("/v1/responses", _responses(), {"X-Sim-Replay": json.dumps(ids)})
    assert streamed.broken == "RemoteProtocolError"
    assert sim.last.faults == ["upstream-broken-stream"]
    answer = sim.http.post(
        "/v1/responses", json=_responses(stream=False), headers={"X-Sim-Replay": json.dumps(ids)}
    )
    assert (answer.status_code, answer.json()["message"]) == (
        400,
        "Unknown recipient: container.exec",
    )


async def _encode(sim: SimThread, text: str) -> list[int]:
    return list(simulator_state(sim.app).encoding.encode(text, allowed_special="all"))


def test_request_errors_use_upstreams_shape(sim: SimThread) -> None:
    answer = sim.http.post("/v1/responses", json={"model": "m"})
    assert answer.status_code == 400
    assert set(answer.json()) == {"object", "message", "type", "param", "code"}
    assert sim.http.post("/v1/responses", content=b"[").status_code == 400


# -- /v1/chat/completions ----------------------------------------------------------------------


def _chat(**overrides: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Hi there"}], **overrides}


def test_chat_stream(sim: SimThread) -> None:
    streamed = sim.stream(
        "/v1/chat/completions", _chat(stream=True, stream_options={"include_usage": True})
    )
    assert streamed.data[-1] == "[DONE]"
    chunks = streamed.json()
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    assert "Hi there" in reasoning
    assert content.startswith("You asked: “Hi there”")
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == sim.last.tokens_sent
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


def test_chat_tool_call_round_trip(sim: SimThread) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    streamed = sim.stream("/v1/chat/completions", _chat(stream=True, tools=tools))
    chunks = streamed.json()
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    arguments = "".join(tc["function"]["arguments"] for tc in calls)
    assert json.loads(arguments) == {"city": "Hi there"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"][0]["stop_reason"] == CALL
    call_id = calls[0]["id"]
    follow_up = _chat(
        tools=tools,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi there"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 °C"},
        ],
    )
    answer = sim.http.post("/v1/chat/completions", json=follow_up).json()
    message = answer["choices"][0]["message"]
    assert "sunny, 21 °C" in message["content"]
    assert message["tool_calls"] == []
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert sim.last.token_ids[-1] == RETURN


def test_chat_errors(sim: SimThread) -> None:
    assert sim.http.post("/v1/chat/completions", json={"model": "m"}).status_code == 400
    bad_role = _chat(messages=[{"role": "wizard", "content": "x"}])
    assert sim.http.post("/v1/chat/completions", json=bad_role).status_code == 400
    effort = _chat(reasoning_effort="extreme")
    assert sim.http.post("/v1/chat/completions", json=effort).status_code == 400
    assert sim.http.post("/v1/chat/completions", json=_chat(max_tokens=0)).status_code == 400
    ok = sim.http.post("/v1/chat/completions", json=_chat(max_tokens=4, reasoning_effort="low"))
    assert ok.json()["choices"][0]["finish_reason"] == "length"


# -- the proxy's upstream client against it ------------------------------------------------------


def test_the_proxys_upstream_client_gets_token_ids(encoding: HarmonyEncoding) -> None:
    async def scenario() -> None:
        async with simulator(encoding) as sim:
            upstream = Upstream(sim.server.url, connect_timeout=5.0)
            try:
                capability = await upstream.probe()
                assert (capability.reachable, capability.token_ids) == (True, True)
                assert capability.model == "openai/gpt-oss-120b"
                prepared = prepare_request(_responses(), encoding)
                async with upstream.completion_stream(
                    prepared.completion_body, [], timeout=5.0
                ) as frames:
                    got = [frame async for frame in frames]
                assert got[-1].done
                ids = [t for frame in got for t in frame.token_ids]
                assert ids == sim.last.token_ids
                assert [f.finish_reason for f in got if f.finish_reason] == ["stop"]
                fault = [("X-Sim-Fault", "http:503")]
                with pytest.raises(UpstreamError):
                    async with upstream.completion_stream(
                        prepared.completion_body, fault, timeout=5.0
                    ):
                        pass
            finally:
                await upstream.aclose()

    run(scenario())
