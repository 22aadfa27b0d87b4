"""Faults as a client sees them, and the record of each exchange (disconnects with timing)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.simulator import SimulatorConfig
from proxy.simulator.faults import Fault, parse_faults
from proxy.upstream.completions import FrameError, parse_frame
from tests.simulator_helpers import FAST, SimThread, Streamed

PROBE = [200006, 1428, 200008, 13225, 200007, 200006, 173781]
COMPLETION = {
    "model": "openai/gpt-oss-120b",
    "prompt": PROBE,
    "stream": True,
    "detokenize": False,
    "stop_token_ids": [200002, 200012],
    "include_stop_str_in_output": True,
    "stream_options": {"include_usage": True},
}
RESPONSES = {"model": "openai/gpt-oss-120b", "input": "Where is my order?", "stream": True}
ONE_EACH = {"X-Sim-Stream-Interval": "1"}


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST) as running:
        yield running


def _fault(
    sim: SimThread, spec: str, path: str = "/v1/completions", extra: dict[str, str] | None = None
) -> Streamed:
    body = COMPLETION if path == "/v1/completions" else RESPONSES
    return sim.stream(path, body, {"X-Sim-Fault": spec, **ONE_EACH, **(extra or {})})


def _token_count(streamed: Streamed) -> int:
    return sum(len(f["choices"][0]["token_ids"] or []) for f in streamed.json() if f.get("choices"))


def test_grammar() -> None:
    assert parse_faults("none") == ()
    assert parse_faults(" http:429 , cut@5,stall@3:0.5,no-token-ids") == (
        Fault("http", status=429),
        Fault("cut", after=5),
        Fault("stall", after=3, seconds=0.5),
        Fault("no-token-ids", after=0),
    )
    assert [f.spec for f in parse_faults("eof@2,done,error@1,malformed@4,stall:1")] == [
        "eof@2",
        "done@0",
        "error@1",
        "malformed@4",
        "stall@0:1",
    ]
    for bad in ("http", "http:200", "http@3:500", "stall@2", "stall@1:-1", "cut:3", "boom"):
        with pytest.raises(ValueError, match="fault"):
            parse_faults(bad)
    with pytest.raises(ValueError, match=r"SimulatorConfig\.fault"):
        SimulatorConfig(fault="boom")


@pytest.mark.parametrize("status", [500, 429, 400, 503])
def test_http_error_before_the_first_byte(sim: SimThread, status: int) -> None:
    for path in ("/v1/completions", "/v1/responses", "/v1/chat/completions", "/health"):
        answer = sim.http.post(path, json={}, headers={"X-Sim-Fault": f"http:{status}"})
        if path == "/health":
            answer = sim.http.get(path, headers={"X-Sim-Fault": f"http:{status}"})
        assert answer.status_code == status
        body = answer.json()
        assert (body["object"], body["code"]) == ("error", status)
        assert sim.last.faults == [f"http:{status}"]
        assert sim.last.token_ids == []


def test_cut_after_k_tokens(sim: SimThread) -> None:
    streamed = _fault(sim, "cut@5", extra={"X-Sim-Tokens": "200"})
    assert streamed.broken == "RemoteProtocolError"
    assert _token_count(streamed) == 5
    assert "[DONE]" not in streamed.data
    record = sim.last
    assert (record.cut, record.completed, record.disconnected) == (True, False, False)
    assert record.tokens_sent == 5
    assert record.closed_at is not None


def test_cut_is_exact_at_any_grouping(sim: SimThread) -> None:
    streamed = sim.stream(
        "/v1/completions", COMPLETION, {"X-Sim-Fault": "cut@7", "X-Sim-Stream-Interval": "20"}
    )
    sizes = [len(f["choices"][0]["token_ids"]) for f in streamed.json()]
    assert sizes == [1, 6]


def test_cut_responses_stream(sim: SimThread) -> None:
    streamed = _fault(sim, "cut@10", "/v1/responses")
    assert streamed.broken == "RemoteProtocolError"
    types = [event for event, _ in streamed.messages]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert "response.completed" not in types


def test_stall(sim: SimThread) -> None:
    started = time.monotonic()
    streamed = _fault(sim, "stall@3:0.3")
    assert time.monotonic() - started >= 0.3
    assert streamed.data[-1] == "[DONE]"
    assert sim.last.faults == ["stall@3:0.3"]


def test_malformed_frame(sim: SimThread) -> None:
    streamed = _fault(sim, "malformed@2")
    bad = [data for data in streamed.data if data != "[DONE]" and not _is_json(data)]
    assert len(bad) == 1
    with pytest.raises(FrameError) as caught:
        parse_frame(bad[0])
    assert caught.value.code == "malformed_frame"
    assert streamed.data[-1] == "[DONE]"  # the server does not know it sent garbage
    responses = _fault(sim, "malformed@2", "/v1/responses")
    assert sum(not _is_json(data) for data in responses.data) == 1


def _is_json(data: str) -> bool:
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


def test_frame_without_token_ids(sim: SimThread) -> None:
    streamed = _fault(sim, "no-token-ids@4")
    frames = streamed.json()
    missing = [
        i for i, f in enumerate(frames) if f["choices"] and f["choices"][0]["token_ids"] is None
    ]
    assert len(missing) == 1
    with pytest.raises(FrameError) as caught:
        parse_frame(streamed.data[missing[0]])
    assert caught.value.code == "missing_token_ids"
    assert _token_count(streamed) == len(sim.last.token_ids) - 1


def test_mid_stream_error_frame_then_done(sim: SimThread) -> None:
    streamed = _fault(sim, "error@3")
    assert streamed.data[-1] == "[DONE]"
    error = orjson.loads(streamed.data[-2])
    assert error["error"]["object"] == "error"
    with pytest.raises(FrameError) as caught:
        parse_frame(streamed.data[-2])
    assert caught.value.code == "upstream_error"
    assert _token_count(streamed) == 3
    assert all(f["choices"][0]["finish_reason"] is None for f in streamed.json()[:-1])
    record = sim.last
    assert (record.completed, record.finish_reason) == (True, None)


def test_end_without_finish(sim: SimThread) -> None:
    eof = _fault(sim, "eof@4")
    assert (eof.broken, _token_count(eof)) == (None, 4)
    assert "[DONE]" not in eof.data
    assert all(f["choices"][0]["finish_reason"] is None for f in eof.json())
    done = _fault(sim, "done@4")
    assert done.data[-1] == "[DONE]"
    assert all(f["choices"][0]["finish_reason"] is None for f in done.json())
    responses = _fault(sim, "eof@6", "/v1/responses")
    assert responses.broken is None
    assert "response.completed" not in [event for event, _ in responses.messages]


def test_data_frame_faults_do_not_apply_to_responses(sim: SimThread) -> None:
    streamed = _fault(sim, "error@2,done@3,no-token-ids", "/v1/responses")
    assert streamed.messages[-1][0] == "response.completed"
    assert sim.last.faults == []


def test_chat_stream_faults(sim: SimThread) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    streamed = sim.stream("/v1/chat/completions", body, {"X-Sim-Fault": "error@2", **ONE_EACH})
    assert streamed.data[-1] == "[DONE]"
    assert "error" in orjson.loads(streamed.data[-2])


def test_nonstreaming_faults(sim: SimThread) -> None:
    body = {**COMPLETION, "stream": False}
    body.pop("stream_options")
    with pytest.raises(httpx.RemoteProtocolError):
        sim.http.post("/v1/completions", json=body, headers={"X-Sim-Fault": "cut"})
    assert sim.last.cut
    garbled = sim.http.post("/v1/completions", json=body, headers={"X-Sim-Fault": "malformed"})
    assert garbled.status_code == 200
    assert not _is_json(garbled.text)
    started = time.monotonic()
    slow = sim.http.post(
        "/v1/responses", json={**RESPONSES, "stream": False}, headers={"X-Sim-Fault": "stall:0.2"}
    )
    assert slow.status_code == 200
    assert time.monotonic() - started >= 0.2


def test_server_default_fault_spares_health_and_yields_to_the_header(
    encoding: HarmonyEncoding,
) -> None:
    config = SimulatorConfig(first_token_seconds=0, token_seconds=0, fault="http:503")
    with SimThread(encoding, config) as faulty:
        assert faulty.http.get("/health").status_code == 200
        assert faulty.http.get("/v1/models").status_code == 200
        assert faulty.http.post("/v1/completions", json=COMPLETION).status_code == 503
        answer = faulty.http.post(
            "/v1/completions", json=COMPLETION, headers={"X-Sim-Fault": "none"}
        )
        assert answer.status_code == 200


def test_client_disconnect_is_recorded_and_generation_stops(encoding: HarmonyEncoding) -> None:
    config = SimulatorConfig(first_token_seconds=0.0, token_seconds=0.005, stream_interval=1)
    with SimThread(encoding, config) as paced:
        headers = {"X-Sim-Tokens": "2000", "X-Request-Id": "client-42"}
        with paced.http.stream("POST", "/v1/completions", json=COMPLETION, headers=headers) as r:
            for frames, _ in enumerate(r.iter_lines(), 1):
                if frames >= 10:
                    break
            gone_at = time.monotonic()
        record = paced.last
        paced.call(record.wait_closed(timeout=2.0))
        assert record.disconnected
        assert not record.completed
        assert not record.cut
        assert record.closed_at is not None
        assert record.closed_at - gone_at <= 1.0
        assert record.request_id == "client-42"
        sent = record.tokens_sent
        assert 5 <= sent < 2000
        time.sleep(0.05)
        assert record.tokens_sent == sent  # the engine was aborted


def test_pacing_is_real_time(encoding: HarmonyEncoding) -> None:
    config = SimulatorConfig(first_token_seconds=0.15, token_seconds=0.002, stream_interval=10)
    with SimThread(encoding, config) as paced:
        started = time.monotonic()
        with paced.http.stream("POST", "/v1/completions", json=COMPLETION) as response:
            lines = response.iter_lines()
            next(lines)
            first = time.monotonic() - started
            for _ in lines:
                pass
        total = time.monotonic() - started
        tokens = paced.last.tokens_sent
        assert 0.15 <= first < 0.5
        assert total >= 0.15 + (tokens - 1) * 0.002


def test_records_of_other_routes(sim: SimThread) -> None:
    before = sim.last.number
    sim.http.get("/version")
    record = sim.last
    assert (record.number, record.method, record.path, record.status) == (
        before + 1,
        "GET",
        "/version",
        200,
    )
    assert record.completed
