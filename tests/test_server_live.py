"""The proxy on a real uvicorn socket in front of a scripted upstream: behaviour end to end."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.response import CountingIds
from proxy.server.app import create_app
from tests.harmony import ids_of
from tests.live import LiveServer, wait_for
from tests.openapi import assert_response_matches_spec, spec_errors
from tests.upstream_double import MODEL, UpstreamDouble, script_for
from tests.wellformed import assert_well_formed

ANSWER = (
    "<|channel|>analysis<|message|>The user greets me. Answer politely and briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help you today? 👋<|return|>"
)
TOOL_CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city":"Paris"}<|call|>'
)
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[UpstreamDouble, LiveServer]]:
    double = UpstreamDouble()
    with LiveServer(double) as server:
        yield double, server


@pytest.fixture
def double(upstream: tuple[UpstreamDouble, LiveServer]) -> UpstreamDouble:
    double = upstream[0]
    double.seen.clear()
    double.capable = True
    double.healthy = True
    return double


def start_proxy(upstream_url: str, encoding: HarmonyEncoding, **overrides: Any) -> LiveServer:
    settings = dataclasses.replace(Settings(upstream_url=upstream_url), **overrides)
    app = create_app(settings, encoding, ids=CountingIds())
    server = LiveServer(app).__enter__()
    # the capability probe runs at start-up
    assert wait_for(lambda: app.state.proxy.capability.reachable, 5)
    return server


@pytest.fixture
def proxy(
    upstream: tuple[UpstreamDouble, LiveServer], double: UpstreamDouble, encoding: HarmonyEncoding
) -> Iterator[LiveServer]:
    server = start_proxy(upstream[1].url, encoding, keepalive_interval=0.2, idle_timeout=1.0)
    yield server
    server.__exit__()


def sse_events(body: bytes) -> list[dict[str, Any]]:
    events = []
    for block in body.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                events.append(orjson.loads(line[6:]))
    return events


def post(proxy: LiveServer, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(proxy.url + "/v1/responses", json=body, timeout=10, **kwargs)


# -- the happy paths, through real clients ------------------------------------------------------


def test_openai_sdk_stream_gets_the_whole_answer(
    proxy: LiveServer, double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    double.script = script_for(ids_of(encoding, ANSWER), 20)
    client = OpenAI(base_url=proxy.url + "/v1", api_key="x", _strict_response_validation=True)
    events = [
        e.model_dump(mode="json", exclude_unset=True)
        for e in client.responses.create(model=MODEL, input="Hi!", stream=True)
    ]
    response = assert_well_formed(events)
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Hello! How can I help you today? 👋"


def test_openai_sdk_stream_helper_assembles_tool_call(
    proxy: LiveServer, double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    double.script = script_for(ids_of(encoding, TOOL_CALL), 20, stop=200012)
    client = OpenAI(base_url=proxy.url + "/v1", api_key="x", _strict_response_validation=True)
    with client.responses.stream(model=MODEL, input="Weather?", tools=TOOLS) as stream:  # type: ignore[arg-type]
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.name, c.arguments, c.status) for c in calls] == [
        ("get_weather", '{"city":"Paris"}', "completed")
    ]
    assert calls[0].call_id.startswith("call_")


def test_upstream_gets_the_rendered_prompt_and_token_id_request(
    proxy: LiveServer, double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    body = {"model": MODEL, "input": "Hi!", "stream": True, "max_output_tokens": 50}
    post(proxy, body, headers={"Authorization": "Bearer sk-test", "X-Request-Id": "req-123"})
    (seen,) = double.completions()
    sent = seen.json()
    assert sent == prepare_request(body, encoding).completion_body
    assert sent["detokenize"] is False
    assert sent["max_tokens"] == 50
    assert seen.headers["authorization"] == "Bearer sk-test"
    assert seen.headers["x-request-id"] == "req-123"


def test_stream_headers_and_request_id(proxy: LiveServer, double: UpstreamDouble) -> None:
    answer = post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert answer.headers["cache-control"] == "no-cache"
    assert answer.headers["x-accel-buffering"] == "no"
    assert len(answer.headers["x-request-id"]) == 32  # created when the client sent none
    assert answer.content.startswith(b"event: response.created\ndata: {")
    again = post(
        proxy, {"model": MODEL, "input": "Hi", "stream": True}, headers={"X-Request-Id": "abc-1"}
    )
    assert again.headers["x-request-id"] == "abc-1"


def test_non_streaming_answer_is_the_terminal_snapshot(
    proxy: LiveServer, double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    double.script = script_for(ids_of(encoding, ANSWER), 7)
    answer = post(proxy, {"model": MODEL, "input": "Hi!"})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    snapshot = answer.json()
    assert_response_matches_spec(snapshot)
    streamed = sse_events(post(proxy, {"model": MODEL, "input": "Hi!", "stream": True}).content)
    terminal = streamed[-1]["response"]
    for item_a, item_b in zip(snapshot["output"], terminal["output"], strict=True):
        assert {**item_a, "id": ""} == {**item_b, "id": ""}
    assert snapshot["status"] == "completed"
    assert snapshot["usage"]["output_tokens"] == len(ids_of(encoding, ANSWER))


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"), [(500, 502), (503, 502), (400, 400), (429, 429), (404, 404)]
)
def test_upstream_error_before_first_byte_is_an_http_error(
    proxy: LiveServer, double: UpstreamDouble, status: int, expected: int
) -> None:
    double.script = [("status", status, {"object": "error", "message": "engine says no"})]
    answer = post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
    assert answer.status_code == expected
    error = answer.json()["error"]
    assert "engine says no" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    assert spec_errors(answer.json(), "ErrorResponse") == []


def _failed(events: list[dict[str, Any]], code: str) -> dict[str, Any]:
    response = assert_well_formed(events)
    assert response["status"] == "failed"
    assert events[-2]["type"] == "error"
    assert events[-2]["code"] == code, events[-2]
    return response


@pytest.mark.parametrize(
    ("steps", "code"),
    [
        ([("cut",)], "upstream_disconnected"),
        ([("raw", b'data: {"error": {"message": "boom"}}\n\n'), ("done",)], "upstream_error"),
        ([("raw", b"data: {not json\n\n")], "malformed_frame"),
        ([("raw", b'data: {"choices": [{"text": "x"}]}\n\n')], "missing_token_ids"),
        ([("done",)], "upstream_incomplete"),
        ([], "upstream_incomplete"),
        ([("sleep", 1.6)], "upstream_timeout"),
    ],
    ids=["cut", "error_frame", "malformed", "no_token_ids", "done_early", "closed", "idle"],
)
def test_failure_after_the_stream_started_ends_with_response_failed(
    proxy: LiveServer,
    double: UpstreamDouble,
    encoding: HarmonyEncoding,
    steps: list[tuple[Any, ...]],
    code: str,
) -> None:
    ids = ids_of(encoding, ANSWER)
    double.script = script_for(ids[:15], 20, finish=None)[:-2] + steps  # type: ignore[arg-type]
    answer = post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
    assert answer.status_code == 200
    response = _failed(sse_events(answer.content), code)
    assert response["output"][0]["type"] == "reasoning"
    # the proxy still serves the next request
    double.script = script_for(ids, 20)
    assert assert_well_formed(
        sse_events(post(proxy, {"model": MODEL, "input": "x", "stream": True}).content)
    )


def test_non_streaming_failure_is_an_http_error(proxy: LiveServer, double: UpstreamDouble) -> None:
    double.script = [("frame", [200005], None, None), ("cut",)]
    answer = post(proxy, {"model": MODEL, "input": "Hi"})
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_disconnected"
    assert spec_errors(answer.json(), "ErrorResponse") == []


def test_create_app_refuses_a_seam_it_does_not_have(encoding: HarmonyEncoding) -> None:
    settings = Settings(upstream_url="http://127.0.0.1:9", render_workers=0)
    with pytest.raises(TypeError, match="unknown seams: regsitry"):
        create_app(settings, encoding, regsitry=None)


def test_unreachable_upstream_is_502_and_not_ready(encoding: HarmonyEncoding) -> None:
    with LiveServer(create_app(Settings(upstream_url="http://127.0.0.1:9"), encoding)) as proxy:
        answer = post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
        assert answer.status_code in (502, 503)
        assert "upstream" in answer.json()["error"]["message"]
        assert httpx.get(proxy.url + "/readyz").status_code == 503
        assert httpx.get(proxy.url + "/healthz").status_code == 200


def test_incapable_upstream_gets_an_actionable_error_or_passthrough(
    upstream: tuple[UpstreamDouble, LiveServer], double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    double.capable = False
    proxy = start_proxy(upstream[1].url, encoding)
    try:
        answer = post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
        assert answer.status_code == 502
        assert "token_ids" in answer.json()["error"]["message"]
        ready = httpx.get(proxy.url + "/readyz")
        assert ready.status_code == 503
        assert ready.json()["token_ids"] is False
    finally:
        proxy.__exit__()
    proxy = start_proxy(upstream[1].url, encoding, passthrough_when_incapable=True)
    try:
        answer = post(proxy, {"model": MODEL, "input": "Hi"})
        assert answer.json()["path"] == "/v1/responses"  # the double echoed it: passed through
    finally:
        proxy.__exit__()


# -- disconnects, keepalives, limits ----------------------------------------------------------


def test_client_disconnect_closes_upstream_within_a_second(
    proxy: LiveServer, double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    double.script = script_for(ids_of(encoding, ANSWER) * 20, 1, pause=0.05)
    with httpx.stream(
        "POST",
        proxy.url + "/v1/responses",
        timeout=10,
        json={"model": MODEL, "input": "Hi", "stream": True},
    ) as answer:
        for line in answer.iter_lines():
            if "output_text.delta" in line or "reasoning_text.delta" in line:
                break
        left = time.monotonic()
    assert wait_for(lambda: double.completions()[-1].ended is not None, 3)
    seen = double.completions()[-1]
    assert seen.disconnected
    assert seen.ended is not None
    assert seen.ended - left < 1.0


def test_keepalive_comments_during_silence(
    proxy: LiveServer, double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    ids = ids_of(encoding, ANSWER)
    double.script = [("frame", ids[:5], None, None), ("sleep", 0.5), *script_for(ids[5:], 20)]
    answer = post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
    assert b"\n: keepalive\n\n" in answer.content
    assert_well_formed(sse_events(answer.content))


def test_body_limit_and_concurrency_limit(
    upstream: tuple[UpstreamDouble, LiveServer], double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    proxy = start_proxy(upstream[1].url, encoding, max_body_bytes=1000, max_concurrent_streams=1)
    try:
        big = post(proxy, {"model": MODEL, "input": "x" * 2000})
        assert big.status_code == 413
        assert big.json()["error"]["code"] == "request_too_large"
        double.script = script_for(ids_of(encoding, ANSWER), 1, pause=0.1)
        with httpx.stream(
            "POST",
            proxy.url + "/v1/responses",
            timeout=10,
            json={"model": MODEL, "input": "Hi", "stream": True},
        ) as first:
            lines = first.iter_lines()  # keep it: a dropped iterator closes the stream
            next(lines)
            second = post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
            assert second.status_code == 429
            assert second.headers["retry-after"] == "1"
    finally:
        proxy.__exit__()


def test_bad_requests_never_reach_upstream(proxy: LiveServer, double: UpstreamDouble) -> None:
    bad = httpx.post(proxy.url + "/v1/responses", content=b"{nope", timeout=5)
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
    unknown = post(proxy, {"model": MODEL, "input": "Hi", "seed": 3})
    assert unknown.status_code == 400
    assert "seed" in unknown.json()["error"]["message"]
    assert spec_errors(unknown.json(), "ErrorResponse") == spec_errors(bad.json(), "ErrorResponse")
    assert spec_errors(bad.json(), "ErrorResponse") == []
    assert double.completions() == []


# -- pass-through -------------------------------------------------------------------------------


def test_passthrough_keeps_method_path_query_body_status_and_headers(
    proxy: LiveServer, double: UpstreamDouble
) -> None:
    answer = httpx.put(
        proxy.url + "/v1/some/thing?a=1&b=two&status=201",
        content=b"raw \x00 body",
        headers={"X-Custom": "yes", "Authorization": "Bearer k"},
        timeout=5,
    )
    assert answer.status_code == 201
    echoed = answer.json()
    assert echoed["method"] == "PUT"
    assert echoed["path"] == "/v1/some/thing"
    assert echoed["query"] == "a=1&b=two&status=201"
    assert echoed["body"] == "raw \x00 body"
    assert echoed["headers"]["x-custom"] == "yes"
    assert echoed["headers"]["authorization"] == "Bearer k"
    assert answer.headers["x-upstream"] == "double"
    assert "x-drop-me" not in answer.headers  # named in Connection: hop-by-hop


def test_passthrough_streams_sse_as_it_comes(proxy: LiveServer, double: UpstreamDouble) -> None:
    arrivals = []
    with httpx.stream("GET", proxy.url + "/sse", timeout=5) as answer:
        for chunk in answer.iter_raw():
            arrivals.append((time.monotonic(), chunk))
    body = b"".join(chunk for _, chunk in arrivals)
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert arrivals[-1][0] - arrivals[0][0] > 0.4, "the body was buffered"


def test_other_models_pass_through(
    upstream: tuple[UpstreamDouble, LiveServer], double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    proxy = start_proxy(upstream[1].url, encoding, repair_models=("openai/gpt-oss-*",))
    try:
        answer = post(proxy, {"model": "llama-3", "input": "Hi"})
        assert answer.json()["path"] == "/v1/responses"
        assert orjson.loads(answer.json()["body"]) == {"model": "llama-3", "input": "Hi"}
    finally:
        proxy.__exit__()


def test_upstream_metrics_under_its_own_path(proxy: LiveServer, double: UpstreamDouble) -> None:
    answer = httpx.get(proxy.url + "/upstream/metrics", timeout=5)
    assert answer.json()["path"] == "/metrics"
    ours = httpx.get(proxy.url + "/metrics", timeout=5)
    assert "proxy_requests_total" in ours.text


def test_health_endpoints(proxy: LiveServer, double: UpstreamDouble) -> None:
    assert httpx.get(proxy.url + "/healthz").json() == {"status": "ok"}
    # ready once the render worker has loaded the encoding (rendering/pool.py)
    assert wait_for(lambda: httpx.get(proxy.url + "/readyz").status_code == 200, 30)
    ready = httpx.get(proxy.url + "/readyz")
    assert ready.json()["token_ids"] is True
    assert ready.json()["render_ready"] is True
    double.healthy = False
    assert httpx.get(proxy.url + "/readyz").status_code == 503


@pytest.mark.parametrize(
    ("script", "wait_for_line"),
    [
        ([("sleep", 5.0)], None),  # upstream has not answered yet
        ([("frame", [], None, None), ("sleep", 5.0)], "response.in_progress"),  # before a token
    ],
    ids=["before_upstream_answers", "before_first_token"],
)
def test_disconnect_in_every_phase_releases_upstream(
    proxy: LiveServer,
    double: UpstreamDouble,
    script: list[tuple[Any, ...]],
    wait_for_line: str | None,
) -> None:
    double.script = script
    with httpx.Client(timeout=10) as client:
        request = client.build_request(
            "POST",
            proxy.url + "/v1/responses",
            json={"model": MODEL, "input": "Hi", "stream": True},
            timeout=httpx.Timeout(10, read=0.5 if wait_for_line is None else 10),
        )
        if wait_for_line is None:
            # no status line yet: we give up waiting, as an impatient client does
            with contextlib.suppress(httpx.ReadTimeout):
                client.send(request, stream=True)
        else:
            answer = client.send(request, stream=True)
            lines = answer.iter_lines()
            assert any(wait_for_line in line for line in lines)
            answer.close()
        left = time.monotonic()
    assert wait_for(lambda: bool(double.completions()) and double.completions()[-1].ended, 3)
    seen = double.completions()[-1]
    assert seen.disconnected
    assert seen.ended is not None
    assert seen.ended - left < 1.0


def test_first_event_goes_out_before_the_first_token(
    proxy: LiveServer, double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    double.script = [
        ("frame", [], None, None),
        ("sleep", 0.5),
        *script_for(ids_of(encoding, ANSWER)),
    ]
    started = time.monotonic()
    with httpx.stream(
        "POST",
        proxy.url + "/v1/responses",
        timeout=10,
        json={"model": MODEL, "input": "Hi", "stream": True},
    ) as answer:
        arrivals = []
        for line in answer.iter_lines():
            if line.startswith("event: "):
                arrivals.append((line[7:], time.monotonic() - started))
    first = dict(arrivals)
    assert first["response.created"] < 0.3
    assert first["response.in_progress"] < 0.3
    assert arrivals[2][1] >= 0.45  # the first item waited for the first token


def test_upstream_stall_before_headers_is_504(
    upstream: tuple[UpstreamDouble, LiveServer], double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    proxy = start_proxy(upstream[1].url, encoding, first_token_timeout=0.5)
    try:
        double.script = [("sleep", 2.0)]
        answer = post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
        assert answer.status_code == 504
        assert answer.json()["error"]["code"] == "upstream_timeout"
        metrics = httpx.get(proxy.url + "/metrics").text
        assert 'proxy_timeouts_total{kind="first_byte"} 1.0' in metrics
    finally:
        proxy.__exit__()


def test_metrics_count_outcomes_and_recovery(
    proxy: LiveServer, double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    double.script = script_for(ids_of(encoding, ANSWER), 20)
    post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
    double.script = [("frame", [200005], None, None), ("cut",)]
    post(proxy, {"model": MODEL, "input": "Hi", "stream": True})
    text = httpx.get(proxy.url + "/metrics").text
    labels = 'model="other",outcome="{}",route="responses",stream="true"'
    assert f"proxy_requests_total{{{labels.format('completed')}}} 1.0" in text
    assert f"proxy_requests_total{{{labels.format('failed')}}} 1.0" in text
    assert 'proxy_upstream_errors_total{kind="upstream_disconnected"} 1.0' in text
    assert "proxy_unpatched_text_differs_total 1.0" in text
    assert 'proxy_recovered_chars_total{channel="final"}' in text
    assert "proxy_selfcheck_failures_total 0.0" in text
    assert "proxy_streams_in_flight 0.0" in text


def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(
    upstream: tuple[UpstreamDouble, LiveServer], double: UpstreamDouble, encoding: HarmonyEncoding
) -> None:
    proxy = start_proxy(upstream[1].url, encoding, send_timeout=0.5)
    header = ids_of(encoding, "<|channel|>final<|message|>")
    spaces = [72056] * 1000  # 128 spaces each: 8 MB of text, more than every socket buffer
    double.script = [("frame", header, None, None)] + [("frame", spaces, None, None)] * 64
    double.script.append(("sleep", 30.0))
    payload = orjson.dumps({"model": MODEL, "input": "Hi", "stream": True})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.connect(("127.0.0.1", proxy.port))
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
        )  # ... and never read
        assert wait_for(lambda: bool(double.completions()) and double.completions()[-1].ended, 10)
        assert double.completions()[-1].disconnected  # upstream released
        metrics = httpx.get(proxy.url + "/metrics").text
        assert 'proxy_timeouts_total{kind="client_send"} 1.0' in metrics
    finally:
        sock.close()
        proxy.__exit__()


def test_content_is_logged_only_when_asked(
    upstream: tuple[UpstreamDouble, LiveServer],
    double: UpstreamDouble,
    encoding: HarmonyEncoding,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="responses_repair_proxy")
    secret = "my-secret-question-42"
    for log_content in (False, True):
        caplog.clear()
        proxy = start_proxy(upstream[1].url, encoding, log_content=log_content)
        try:
            double.script = script_for(ids_of(encoding, ANSWER))
            post(
                proxy,
                {"model": MODEL, "input": secret, "stream": True},
                headers={"Authorization": "Bearer sk-never-logged"},
            )
        finally:
            proxy.__exit__()
        (line,) = [r for r in caplog.records if r.getMessage() == "request"]
        fields = vars(line)
        assert fields["outcome"] == "completed"
        assert fields["request_id"]
        text = repr(fields)
        assert "sk-never-logged" not in text
        assert (secret in text) is log_content
        assert ("How can I help you today" in text) is log_content
