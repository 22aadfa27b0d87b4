"""Upstream faults at every point of a stream, through the proxy, on real sockets.

The trtllm-serve simulator injects each fault (`X-Sim-Fault`, forwarded by the proxy) after an
exact number of generated tokens: right after `response.created` (0 tokens), inside the
reasoning, inside the answer, inside a function call's arguments, and after the last token
(before the usage frame and `[DONE]`). Before the first byte: upstream's HTTP errors, and (from
the scripted double, which can fail before its status line) a cut connection and a stall.

Every case: exactly one terminal event (or the right HTTP error before the first byte), the
error counted in the metrics, nothing unhandled in the logs, and the next request served.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.tokens import MESSAGE
from tests.fault_metrics import assert_clean_logs, assert_serves_next, changes, snapshot
from tests.live import LiveServer
from tests.reliability import (
    FAST_SIM,
    TOOLS,
    Proxy,
    RawUpstream,
    body,
    completion,
    expected_texts,
    running_proxy,
    sse_events,
    texts,
)
from tests.simulator_helpers import SimThread
from tests.upstream_double import UpstreamDouble, script_for
from tests.wellformed import assert_well_formed

IDLE = 0.5  # the proxy's idle timeout in these tests (seconds)
FIRST_TOKEN = 1.0  # its first-token timeout
#: The fault kinds that fire inside a stream, and the error code the client must see.
STREAM_FAULTS = {
    "cut": "upstream_disconnected",
    "malformed": "malformed_frame",
    "no-token-ids": "missing_token_ids",
    "error": "upstream_error",
    "eof": "upstream_incomplete",
    "done": "upstream_incomplete",
    "stall:2": "upstream_timeout",  # 2 s: past both timeouts below
}
POINTS = ("after_created", "mid_reasoning", "mid_answer", "mid_call_arguments", "after_last_token")


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST_SIM) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: SimThread, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    assert sim.server is not None
    with running_proxy(
        sim.server.url, encoding, idle_timeout=IDLE, first_token_timeout=FIRST_TOKEN
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as http:
        yield http


def point(encoding: HarmonyEncoding, where: str) -> tuple[dict[str, Any], int]:
    """The request and the token count after which the fault fires, for each point."""
    request = body(tools=TOOLS) if where == "mid_call_arguments" else body()
    ids = completion(encoding, request).token_ids
    messages = [index for index, token in enumerate(ids) if token == MESSAGE]
    after = {
        "after_created": 0,
        "mid_reasoning": messages[0] + 4,
        "mid_answer": messages[-1] + 4,
        "mid_call_arguments": messages[-1] + 3,
        "after_last_token": len(ids),
    }[where]
    return request, after


def fault_spec(kind: str, after: int) -> str:
    name, _, arg = kind.partition(":")
    return f"{name}@{after}" + (f":{arg}" if arg else "")


@pytest.mark.parametrize("where", POINTS)
@pytest.mark.parametrize("kind", list(STREAM_FAULTS))
def test_stream_fault_ends_with_one_terminal_event(
    proxy: Proxy,
    sim: SimThread,
    client: httpx.Client,
    encoding: HarmonyEncoding,
    kind: str,
    where: str,
) -> None:
    request, after = point(encoding, where)
    spec = fault_spec(kind, after)
    before = snapshot(proxy)
    request_id = f"fault-{spec.replace('@', '.')}-{where}"  # a sane id: [A-Za-z0-9._:-]
    answer = client.post(
        proxy.url + "/v1/responses",
        json=request,
        headers={"X-Sim-Fault": spec, "X-Request-Id": request_id},
    )
    assert answer.status_code == 200
    events = sse_events(answer.content)
    response = assert_well_formed(events)  # exactly one terminal event, last, and every rule
    record = next(r for r in reversed(sim.records) if r.request_id == request_id)
    assert record.faults == [spec], record.faults
    if where == "after_last_token":
        # Every token arrived with its finish: the stream is complete whatever follows.
        assert response["status"] == "completed", events[-2:]
        assert texts(events) == expected_texts(completion(encoding, request))
        assert changes(proxy, before, {"completed": 1}) == {"completed": 1}
    else:
        code = STREAM_FAULTS[kind]
        assert response["status"] == "failed"
        assert events[-2]["type"] == "error"
        assert events[-2]["code"] == code, events[-2]
        expected = {"failed": 1, code: 1}
        if code == "upstream_timeout":
            expected["timeout_" + ("first_token" if where == "after_created" else "idle")] = 1
        assert changes(proxy, before, expected) == expected
        # What was streamed before the fault is kept, and is a prefix of the real answer.
        done = expected_texts(completion(encoding, request))
        for (kind_got, text_got), (kind_want, text_want) in zip(texts(events), done, strict=False):
            assert kind_got == kind_want
            assert text_want.startswith(text_got)
    assert_serves_next(proxy, client)
    assert_clean_logs(proxy)


@pytest.mark.parametrize(
    ("status", "expected", "counter"),
    [
        (500, 502, "upstream_error_outcome"),
        (503, 502, "upstream_error_outcome"),
        (429, 429, "client_error"),
        (400, 400, "client_error"),
    ],
)
def test_upstream_http_error_before_the_first_byte(
    proxy: Proxy, client: httpx.Client, status: int, expected: int, counter: str
) -> None:
    before = snapshot(proxy)
    answer = client.post(
        proxy.url + "/v1/responses", json=body(), headers={"X-Sim-Fault": f"http:{status}"}
    )
    assert answer.status_code == expected
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert f"HTTP {status}" in error["message"]  # the simulator's words are passed on
    expected = {counter: 1, "upstream_error": 1} if status >= 500 else {counter: 1}
    assert changes(proxy, before, expected) == expected
    assert_serves_next(proxy, client)
    assert_clean_logs(proxy)


# -- before upstream's status line: the scripted double can fail there -----------------------------


@pytest.fixture(scope="module")
def double_proxy(encoding: HarmonyEncoding) -> Iterator[tuple[UpstreamDouble, Proxy]]:
    double = UpstreamDouble()
    with (
        LiveServer(double) as upstream,
        running_proxy(
            upstream.url, encoding, idle_timeout=IDLE, first_token_timeout=FIRST_TOKEN
        ) as running,
    ):
        yield double, running


def test_connection_cut_before_the_status_line_is_502(
    client: httpx.Client, encoding: HarmonyEncoding
) -> None:
    with RawUpstream() as upstream, running_proxy(upstream.url, encoding) as proxy:
        before = snapshot(proxy)
        answer = client.post(proxy.url + "/v1/responses", json=body())
        assert answer.status_code == 502
        assert answer.json()["error"]["code"] == "upstream_unreachable"
        expected = {"upstream_unreachable": 1, "upstream_error_outcome": 1}
        assert changes(proxy, before, expected) == expected
        assert_clean_logs(proxy)


def test_stall_before_the_status_line_is_504(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client
) -> None:
    double, proxy = double_proxy
    double.queue = [[("sleep", FIRST_TOKEN + 0.5)]]
    before = snapshot(proxy)
    answer = client.post(proxy.url + "/v1/responses", json=body())
    assert answer.status_code == 504
    assert answer.json()["error"]["code"] == "upstream_timeout"
    expected = {"upstream_timeout": 1, "timeout_first_byte": 1, "upstream_error_outcome": 1}
    assert changes(proxy, before, expected) == expected
    double.script = script_for([200005, 17196, 200008, 12194, 13, 200002])
    assert_serves_next(proxy, client)
    assert_clean_logs(proxy)
