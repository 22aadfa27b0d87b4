"""`created_before_upstream`: the response is announced before upstream's answer head.

`response.created` and `response.in_progress` go out once the request is admitted, so a client
sees them while upstream still reads the request; a refusal that comes with upstream's head
(an HTTP error, a cut before the status line, no head in time) then ends the stream as any
later failure does — `error` + `response.failed`, exactly one terminal event — and is counted
as the same refusal is with the setting off. `stream: false` is unchanged: an HTTP error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from tests.fault_metrics import assert_clean_logs, assert_serves_next, changes, snapshot
from tests.live import LiveServer
from tests.reliability import FAST_SIM, Proxy, RawUpstream, body, running_proxy, sse_events
from tests.simulator_helpers import SimThread
from tests.upstream_double import UpstreamDouble, script_for
from tests.wellformed import assert_well_formed

FIRST_TOKEN = 1.0
HEAD_DELAY = 0.6
ANSWER = [200005, 17196, 200008, 12194, 13, 200002]  # assistant final: "Hi." <|return|>


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST_SIM) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: SimThread, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    assert sim.server is not None
    with running_proxy(
        sim.server.url, encoding, first_token_timeout=FIRST_TOKEN, created_before_upstream=True
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as http:
        yield http


def assert_failed_after_created(events: list[dict[str, object]], code: str) -> None:
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    response = assert_well_formed(events)  # exactly one terminal event, last, and every rule
    assert response["status"] == "failed"
    assert events[-2]["type"] == "error"
    assert events[-2]["code"] == code, events[-2]
    assert response["output"] == []


@pytest.mark.parametrize(
    ("status", "code", "counted"),
    [
        (500, "upstream_error", {"failed": 1, "upstream_error": 1}),
        (503, "upstream_error", {"failed": 1, "upstream_error": 1}),
        (429, "upstream_rejected", {"failed": 1}),
        (400, "upstream_rejected", {"failed": 1}),
    ],
)
def test_an_upstream_http_error_ends_the_announced_stream(
    proxy: Proxy, client: httpx.Client, status: int, code: str, counted: dict[str, float]
) -> None:
    before = snapshot(proxy)
    answer = client.post(
        proxy.url + "/v1/responses", json=body(), headers={"X-Sim-Fault": f"http:{status}"}
    )
    assert answer.status_code == 200
    events = sse_events(answer.content)
    assert_failed_after_created(events, code)
    assert f"HTTP {status}" in str(events[-2]["message"])  # the simulator's words are passed on
    assert changes(proxy, before, counted) == counted
    assert_serves_next(proxy, client)
    assert_clean_logs(proxy)


def test_stream_false_still_answers_an_http_error(proxy: Proxy, client: httpx.Client) -> None:
    answer = client.post(
        proxy.url + "/v1/responses",
        json=body(stream=False),
        headers={"X-Sim-Fault": "http:500"},
    )
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_error"


def test_strict_sdk_reads_the_failure_as_events(proxy: Proxy) -> None:
    sdk = OpenAI(
        base_url=proxy.url + "/v1",
        api_key="unused",
        max_retries=0,
        _strict_response_validation=True,
        default_headers={"X-Sim-Fault": "http:400"},
    )
    with sdk.responses.create(model="gpt-oss-120b", input="Hi", stream=True) as events:
        kinds = [event.type for event in events]
    assert kinds == ["response.created", "response.in_progress", "error", "response.failed"]


@pytest.fixture(scope="module")
def double_proxy(encoding: HarmonyEncoding) -> Iterator[tuple[UpstreamDouble, Proxy]]:
    double = UpstreamDouble()
    with (
        LiveServer(double) as upstream,
        running_proxy(
            upstream.url,
            encoding,
            first_token_timeout=FIRST_TOKEN,
            created_before_upstream=True,
        ) as running,
    ):
        yield double, running


def test_created_arrives_before_upstreams_head(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client
) -> None:
    double, proxy = double_proxy
    double.queue = [[("sleep", HEAD_DELAY), *script_for(ANSWER)]]
    started = time.monotonic()
    arrivals: list[tuple[float, bytes]] = []
    with client.stream("POST", proxy.url + "/v1/responses", json=body()) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: "):
                arrivals.append((time.monotonic() - started, line.encode()))
    events = sse_events(b"\n".join(raw for _, raw in arrivals))
    assert assert_well_formed(events)["status"] == "completed"
    assert events[0]["type"] == "response.created"
    created_at, last_at = arrivals[0][0], arrivals[-1][0]
    assert created_at < HEAD_DELAY / 2, arrivals[:2]  # while upstream had not answered
    assert last_at >= HEAD_DELAY


def test_no_head_in_time_is_a_failed_stream(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client
) -> None:
    double, proxy = double_proxy
    double.queue = [[("sleep", FIRST_TOKEN + 0.5)]]
    before = snapshot(proxy)
    answer = client.post(proxy.url + "/v1/responses", json=body())
    assert answer.status_code == 200
    assert_failed_after_created(sse_events(answer.content), "upstream_timeout")
    expected = {"failed": 1, "upstream_timeout": 1, "timeout_first_byte": 1}
    assert changes(proxy, before, expected) == expected
    assert_serves_next(proxy, client)
    assert_clean_logs(proxy)


def test_a_connection_cut_before_the_status_line_is_a_failed_stream(
    client: httpx.Client, encoding: HarmonyEncoding
) -> None:
    with (
        RawUpstream() as upstream,
        running_proxy(upstream.url, encoding, created_before_upstream=True) as proxy,
    ):
        before = snapshot(proxy)
        answer = client.post(proxy.url + "/v1/responses", json=body())
        assert answer.status_code == 200
        assert_failed_after_created(sse_events(answer.content), "upstream_unreachable")
        expected = {"failed": 1, "upstream_unreachable": 1}
        assert changes(proxy, before, expected) == expected
        assert_clean_logs(proxy)
