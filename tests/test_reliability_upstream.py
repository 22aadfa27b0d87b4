"""Upstream faults end cleanly, on real sockets with a scripted upstream.

- The idle and first-token timeouts count from the last *token*: empty frames and usage-only
  frames for ever end the stream with `upstream_timeout`.
- An error answer whose body never ends is answered within a short bound (and never after the
  request's own deadline), with upstream's status class and a message that does not quote junk.
- A response head over the limit is refused.
- A malformed or cut pass-through answer becomes a 502 JSON before our head, or a visible abort
  after it: one log line, one counted error, nothing logged by uvicorn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from openai_harmony import HarmonyEncoding
from prometheus_client import CollectorRegistry, generate_latest

from proxy.metrics.serving import UPSTREAM_ERROR_KINDS, Metrics
from tests.live import LiveServer
from tests.reliability import (
    Proxy,
    RawUpstream,
    body,
    log_problems,
    running_proxy,
    sse_events,
    start_proxy_process,
    wait_until,
)
from tests.upstream_double import UpstreamDouble, script_for
from tests.wellformed import assert_well_formed

IDLE = 0.5  # the proxy's idle timeout in these tests (seconds)
FIRST_TOKEN = 1.0  # its first-token timeout
KEEPALIVE = 0.2  # its keepalive interval
ANSWER = [200005, 17196, 200008, 12194, 13, 200002]  # <|channel|>final<|message|>Hi.<|return|>


@pytest.fixture(scope="module")
def double_proxy(encoding: HarmonyEncoding) -> Iterator[tuple[UpstreamDouble, Proxy]]:
    double = UpstreamDouble()
    with (
        LiveServer(double) as upstream,
        running_proxy(
            upstream.url,
            encoding,
            idle_timeout=IDLE,
            first_token_timeout=FIRST_TOKEN,
            keepalive_interval=KEEPALIVE,
        ) as running,
    ):
        yield double, running


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as http:
        yield http


def counts(proxy: Proxy) -> dict[str, float]:
    """The counters these tests move."""
    out = {
        "failed": proxy.metric(
            "proxy_requests_total",
            route="responses",
            stream="true",
            model="other",
            outcome="failed",
        ),
    }
    for kind in ("timeout", "upstream_error", "upstream_bad_response", "upstream_disconnected"):
        out[kind] = proxy.metric("proxy_upstream_errors_total", kind=kind)
    for kind in ("idle", "first_token", "first_byte"):
        out["timeout_" + kind] = proxy.metric("proxy_timeouts_total", kind=kind)
    return out


def changes(proxy: Proxy, before: dict[str, float], expected: dict[str, float]) -> dict[str, float]:
    """The counter changes since `before`, once they match `expected` or after 5 s (the proxy
    counts a request just after its last byte)."""

    def delta() -> dict[str, float]:
        now = counts(proxy)
        return {key: now[key] - before[key] for key in now if now[key] != before[key]}

    wait_until(lambda: delta() == expected, 5.0)
    return delta()


def assert_serves_next(double: UpstreamDouble, proxy: Proxy, client: httpx.Client) -> None:
    double.script = script_for(ANSWER)
    answer = client.post(proxy.url + "/v1/responses", json=body("And now?"))
    assert answer.status_code == 200
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"


# -- the timeouts count from the last token ---------------------------------------------------


FOREVER = 200  # steps of 20 ms: 4 s, far past both timeouts
TOKENLESS = {
    "empty": ("frame", [], None, None),
    "usage": ("usage", 1),
}


@pytest.mark.parametrize("filler", list(TOKENLESS))
def test_tokenless_frames_after_a_token_end_in_the_idle_timeout(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client, filler: str
) -> None:
    double, proxy = double_proxy
    double.queue = [
        [("frame", [200005], None, None)] + [("sleep", 0.02), TOKENLESS[filler]] * FOREVER
    ]
    before = counts(proxy)
    started = time.monotonic()
    answer = client.post(proxy.url + "/v1/responses", json=body())
    elapsed = time.monotonic() - started
    assert answer.status_code == 200
    events = sse_events(answer.content)
    assert assert_well_formed(events)["status"] == "failed"
    assert events[-2]["code"] == "upstream_timeout"
    assert events[-2]["message"] == f"upstream sent no next token within {IDLE:g} s"
    assert IDLE <= elapsed < FOREVER * 0.02 / 2, elapsed  # ended by the timeout, not the script
    # The client heard keepalives while upstream sent frames without tokens.
    assert answer.content.count(b": keepalive\n\n") >= 1
    expected = {"failed": 1, "timeout": 1, "timeout_idle": 1}
    assert changes(proxy, before, expected) == expected
    assert_serves_next(double, proxy, client)
    assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]


@pytest.mark.parametrize("filler", list(TOKENLESS))
def test_tokenless_frames_before_a_token_end_in_the_first_token_timeout(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client, filler: str
) -> None:
    double, proxy = double_proxy
    double.queue = [[("sleep", 0.02), TOKENLESS[filler]] * FOREVER]
    before = counts(proxy)
    started = time.monotonic()
    answer = client.post(proxy.url + "/v1/responses", json=body())
    elapsed = time.monotonic() - started
    events = sse_events(answer.content)
    assert assert_well_formed(events)["status"] == "failed"
    assert events[-2]["code"] == "upstream_timeout"
    assert events[-2]["message"] == f"upstream sent no first token within {FIRST_TOKEN:g} s"
    assert FIRST_TOKEN <= elapsed < FOREVER * 0.02 / 2, elapsed
    expected = {"failed": 1, "timeout": 1, "timeout_first_token": 1}
    assert changes(proxy, before, expected) == expected
    assert_serves_next(double, proxy, client)
    assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]


def test_tokens_slower_than_frames_but_within_the_idle_timeout_complete(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client
) -> None:
    """The other side of the rule: a token every 0.3 s (< IDLE), with empty frames between,
    is a healthy slow stream and completes."""
    double, proxy = double_proxy
    steps: list[tuple[object, ...]] = []
    for token in ANSWER[:-1]:
        steps += [("frame", [token], None, None)]
        steps += [("sleep", 0.1), TOKENLESS["empty"]] * 3
    steps += [("frame", [ANSWER[-1]], "stop", None), ("usage", len(ANSWER)), ("done",)]
    double.queue = [steps]
    answer = client.post(proxy.url + "/v1/responses", json=body())
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"


# -- error bodies: read under a deadline and a size cap ---------------------------------------

JSON_HEAD = [(b"content-type", b"application/json")]


@pytest.fixture(scope="module")
def patient_proxy(encoding: HarmonyEncoding) -> Iterator[tuple[UpstreamDouble, Proxy]]:
    """A proxy whose own first-token deadline (10 s) is far past the error-body bound."""
    double = UpstreamDouble()
    with (
        LiveServer(double) as upstream,
        running_proxy(upstream.url, encoding, first_token_timeout=10.0) as running,
    ):
        yield double, running


@pytest.mark.parametrize(
    ("status", "expected", "said"),
    [
        (503, 502, "upstream failed with HTTP 503 and an error body that was not complete within"),
        (400, 400, "upstream rejected the request with HTTP 400 and an error body that was not "),
    ],
)
def test_an_error_body_that_never_ends_is_answered_within_the_bound(
    patient_proxy: tuple[UpstreamDouble, Proxy],
    client: httpx.Client,
    status: int,
    expected: int,
    said: str,
) -> None:
    """An error body that never ends: answered after 7 s (both stream timeouts), quoting a
    lone `{`."""
    double, proxy = patient_proxy
    double.queue = [[("start", status, JSON_HEAD), ("raw", b"{"), ("sleep", 10)]]
    before = counts(proxy)
    started = time.monotonic()
    answer = client.post(proxy.url + "/v1/responses", json=body())
    elapsed = time.monotonic() - started
    assert answer.status_code == expected
    error = answer.json()["error"]
    assert error["message"].startswith(said), error
    assert error["message"].endswith("within 2 s (not quoted)"), error
    assert "{" not in error["message"]
    assert 2.0 <= elapsed < 4.0, elapsed  # ERROR_BODY_SECONDS, not the 10 s deadline
    expected_counts = {"upstream_error": 1} if status >= 500 else {}
    assert changes(proxy, before, expected_counts) == expected_counts
    assert_serves_next(double, proxy, client)
    assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]


def test_an_error_body_is_never_waited_for_past_the_request_deadline(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client
) -> None:
    double, proxy = double_proxy  # first-token deadline: 1 s, under the 2 s error-body bound
    double.queue = [[("start", 503, JSON_HEAD), ("raw", b'{"message": "eng'), ("sleep", 10)]]
    started = time.monotonic()
    answer = client.post(proxy.url + "/v1/responses", json=body())
    elapsed = time.monotonic() - started
    assert answer.status_code == 502
    assert "was not complete within 0." in answer.json()["error"]["message"]
    assert FIRST_TOKEN * 0.9 <= elapsed < 2.0, elapsed


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        ([("raw", b"x" * 70_000), ("sleep", 10)], "an error body that was longer than 64 KiB"),
        ([("raw", b'{"message": "eng'), ("cut",)], "an error body that was cut off by the conn"),
        ([("raw", b"<html>Bad Gateway</html>")], "an error body that is not JSON (24 bytes of t"),
        ([("raw", b'{"message": "engine restarting"}')], "upstream failed with HTTP 503: engine "),
    ],
    ids=["over_the_cap", "cut", "not_json", "json"],
)
def test_error_bodies_over_the_cap_cut_or_junk_are_described(
    patient_proxy: tuple[UpstreamDouble, Proxy],
    client: httpx.Client,
    steps: list[tuple[object, ...]],
    said: str,
) -> None:
    double, proxy = patient_proxy
    content_type = b"application/json" if steps[0][1][:1] == b"{" else b"text/html"  # type: ignore[index]
    double.queue = [[("start", 503, [(b"content-type", content_type)]), *steps]]
    started = time.monotonic()
    answer = client.post(proxy.url + "/v1/responses", json=body())
    assert time.monotonic() - started < 1.5
    assert answer.status_code == 502
    assert said in answer.json()["error"]["message"], answer.json()
    assert "xxxx" not in answer.text
    assert_serves_next(double, proxy, client)


# -- malformed pass-through answers: a 502 before our head, a visible abort after it ----------

EVIL = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 4\r\n\r\nevil"
OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
CHUNKED = OK_HEAD + b"transfer-encoding: chunked\r\n\r\n"
#: Answers that are no valid response as soon as their head is read: 502 JSON,
#: `upstream_bad_response` (each arrives in one piece: the proxy reads it in one go).
BEFORE_HEAD = {
    "te_and_cl": (
        OK_HEAD + b"content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    ),
    "status_600": b"HTTP/1.1 600 Odd\r\ncontent-length: 2\r\n\r\nok",
    "status_999": b"HTTP/1.1 999 Odd\r\ncontent-length: 2\r\n\r\nok",
    "204_with_body": b"HTTP/1.1 204 No Content\r\n\r\n" + EVIL,
    "204_with_length": b"HTTP/1.1 204 No Content\r\ncontent-length: 4\r\n\r\nevil",
    "head_70kb": OK_HEAD + b"x-pad: " + b"a" * 70_000 + b"\r\ncontent-length: 2\r\n\r\nok",
    "bare_lf": OK_HEAD + b"x-evil: a\ncontent-length: 2\r\n\r\nok",
    "not_http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "longer_than_length": OK_HEAD + b"content-length: 2\r\n\r\nokEXTRA",
    "smuggled_after_length": OK_HEAD + b"content-length: 2\r\n\r\nok" + EVIL,
}
#: Answers that break after a valid head (sent 50 ms before the rest): the client's
#: connection closes short of the end.
AFTER_HEAD = {
    "shorter_than_length": ([OK_HEAD + b"content-length: 100\r\n\r\n", b"hello"], "close"),
    "cut_mid_chunk": ([CHUNKED, b"10\r\ndata: 1\n\n"], "close"),
    "bad_chunk_size": ([CHUNKED, b"5\r\nhello\r\nzz\r\n"], "keep"),
    "longer_than_length": ([OK_HEAD + b"content-length: 2\r\n\r\n", b"okEXTRA"], "keep"),
    "smuggled_after_length": ([OK_HEAD + b"content-length: 2\r\n\r\n", b"ok" + EVIL], "keep"),
    "stalled": ([CHUNKED], "hold"),  # nothing of the body within the first-token timeout
}
AFTER_HEAD_KINDS = {
    "shorter_than_length": "upstream_disconnected",
    "cut_mid_chunk": "upstream_disconnected",
    "bad_chunk_size": "upstream_bad_response",
    "longer_than_length": "upstream_bad_response",
    "smuggled_after_length": "upstream_bad_response",
    "stalled": "timeout",
}


@pytest.fixture(scope="module")
def raw_proxy(encoding: HarmonyEncoding) -> Iterator[tuple[RawUpstream, Proxy]]:
    with (
        RawUpstream() as upstream,
        running_proxy(
            upstream.url, encoding, idle_timeout=IDLE, first_token_timeout=FIRST_TOKEN
        ) as running,
    ):
        yield upstream, running


def request_lines(proxy: Proxy, request_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in proxy.logs.records
        if r.getMessage() == "request" and getattr(r, "request_id", None) == request_id
    ]


def assert_one_line_and_next_served(
    proxy: Proxy, client: httpx.Client, request_id: str, error: str
) -> None:
    """One log line for the request, naming the error; nothing logged as a problem (uvicorn's
    "Exception in ASGI application" included); and the next request gets its own answer, not
    what upstream left on the wire."""
    assert wait_until(lambda: len(request_lines(proxy, request_id)) == 1, 5.0)
    (line,) = request_lines(proxy, request_id)
    assert line.error == error  # type: ignore[attr-defined]
    assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]
    for _ in range(2):
        after = client.get(proxy.url + "/v1/models")
        assert after.status_code == 200
        assert after.json()["object"] == "list"
    assert len(request_lines(proxy, request_id)) == 1


@pytest.mark.parametrize("case", list(BEFORE_HEAD))
def test_a_malformed_pass_through_answer_is_a_502_before_our_head(
    raw_proxy: tuple[RawUpstream, Proxy], client: httpx.Client, case: str
) -> None:
    upstream, proxy = raw_proxy
    upstream.answers[b"/case"] = ([BEFORE_HEAD[case]], "keep")
    before = counts(proxy)
    answer = client.get(proxy.url + "/case", headers={"x-request-id": f"before-{case}"})
    assert answer.status_code == 502
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "upstream_bad_response"
    assert "evil" not in answer.text
    assert changes(proxy, before, {"upstream_bad_response": 1}) == {"upstream_bad_response": 1}
    assert_one_line_and_next_served(proxy, client, f"before-{case}", "upstream_bad_response")


@pytest.mark.parametrize("case", list(AFTER_HEAD))
def test_a_pass_through_answer_that_breaks_after_our_head_is_aborted_visibly(
    raw_proxy: tuple[RawUpstream, Proxy], client: httpx.Client, case: str
) -> None:
    upstream, proxy = raw_proxy
    upstream.answers[b"/case"] = AFTER_HEAD[case]
    kind = AFTER_HEAD_KINDS[case]
    before = counts(proxy)
    with client.stream(
        "GET", proxy.url + "/case", headers={"x-request-id": f"after-{case}"}
    ) as answer:
        assert answer.status_code == 200  # upstream's head, passed on
        with pytest.raises(httpx.RemoteProtocolError, match="peer closed connection without"):
            answer.read()  # the client's own parser sees the truncation
    expected = {kind: 1} | ({"timeout_first_token": 1} if kind == "timeout" else {})
    assert changes(proxy, before, expected) == expected
    assert_one_line_and_next_served(proxy, client, f"after-{case}", kind)


def test_a_pass_through_answer_that_never_comes_is_a_504(
    raw_proxy: tuple[RawUpstream, Proxy], client: httpx.Client
) -> None:
    upstream, proxy = raw_proxy
    upstream.answers[b"/case"] = ([], "hold")  # reads the request, answers nothing
    before = counts(proxy)
    answer = client.get(proxy.url + "/case", headers={"x-request-id": "no-head"})
    assert answer.status_code == 504
    assert answer.json()["error"]["code"] == "upstream_timeout"
    expected = {"timeout": 1, "timeout_first_byte": 1}
    assert changes(proxy, before, expected) == expected
    assert_one_line_and_next_served(proxy, client, "no-head", "upstream_timeout")


def test_a_stall_between_body_reads_is_an_idle_timeout(
    raw_proxy: tuple[RawUpstream, Proxy], client: httpx.Client
) -> None:
    upstream, proxy = raw_proxy
    upstream.answers[b"/case"] = ([CHUNKED + b"7\r\ndata: 1\r\n", b"7\r\ndata: 2\r\n"], "hold")
    before = counts(proxy)
    started = time.monotonic()
    with (
        client.stream("GET", proxy.url + "/case", headers={"x-request-id": "idle-stall"}) as got,
        pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"),
    ):
        got.read()
    assert IDLE <= time.monotonic() - started < FIRST_TOKEN + IDLE
    expected = {"timeout": 1, "timeout_idle": 1}
    assert changes(proxy, before, expected) == expected
    assert_one_line_and_next_served(proxy, client, "idle-stall", "timeout")


def test_serve_logs_one_line_per_broken_answer_and_no_error(tmp_path: Path) -> None:
    """The real `serve` process (its runner installs the filter): a 502 and an abort each log
    their request line, and nothing at error level — no "Exception in ASGI application"."""
    with RawUpstream() as upstream:
        upstream.answers[b"/before"] = ([BEFORE_HEAD["te_and_cl"]], "keep")
        upstream.answers[b"/after"] = AFTER_HEAD["cut_mid_chunk"]
        process = start_proxy_process(upstream.url, tmp_path / "proxy.log")
        try:
            with httpx.Client(timeout=10) as http:
                assert (
                    http.get(process.url + "/before", headers={"x-request-id": "b1"}).status_code
                    == 502
                )
                with (
                    http.stream(
                        "GET", process.url + "/after", headers={"x-request-id": "a1"}
                    ) as got,
                    pytest.raises(httpx.RemoteProtocolError),
                ):
                    got.read()
                assert http.get(process.url + "/v1/models").status_code == 200
        finally:
            process.stop()
    lines = [orjson.loads(line) for line in process.log_text().splitlines()]
    assert log_problems(process.log_text()) == [], process.log_text()[-3000:]
    for request_id, error, aborted in (
        ("b1", "upstream_bad_response", False),
        ("a1", "upstream_disconnected", True),
    ):
        (line,) = [r for r in lines if r.get("request_id") == request_id]
        assert (line["msg"], line["error"], line["aborted"]) == ("request", error, aborted)


# -- pass-through request bodies on the lean client ------------------------------------------


def test_pass_through_bodies_stream_up_chunked_or_sized(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client
) -> None:
    _, proxy = double_proxy

    def parts() -> Iterator[bytes]:
        yield b"first "
        time.sleep(0.05)
        yield b"second"

    chunked = client.post(proxy.url + "/v1/echo?status=201", content=parts())
    assert chunked.status_code == 201
    assert chunked.json()["body"] == "first second"
    assert chunked.json()["headers"]["transfer-encoding"] == "chunked"
    sized = client.post(proxy.url + "/v1/echo", content=b"x" * 100_000)
    assert sized.json()["body"] == "x" * 100_000
    assert sized.json()["headers"]["content-length"] == "100000"
    empty = client.get(proxy.url + "/v1/echo")
    assert "content-length" not in empty.json()["headers"]  # a GET says nothing of a body


def test_a_pass_through_body_over_the_limit_is_413_and_upstream_released(
    encoding: HarmonyEncoding, client: httpx.Client
) -> None:
    double = UpstreamDouble()
    with (
        LiveServer(double) as upstream,
        running_proxy(upstream.url, encoding, max_body_bytes=10_000) as proxy,
    ):

        def parts() -> Iterator[bytes]:
            for _ in range(30):
                yield b"y" * 1000

        answer = client.post(proxy.url + "/v1/echo", content=parts())
        assert answer.status_code == 413
        assert answer.json()["error"]["code"] == "request_too_large"
        time.sleep(0.2)  # upstream's side of the closed connection
        # Upstream never got the whole body: the proxy stopped at the limit and closed.
        assert all(len(seen.body) <= 10_000 for seen in double.seen if seen.path == "/v1/echo")
        assert client.get(proxy.url + "/v1/models").status_code == 200
        assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]


def test_upstream_error_kinds_are_exported_at_zero_from_the_start() -> None:
    """`rate()` and alerts see the first failure of each kind."""
    registry = CollectorRegistry()
    Metrics(registry)
    text = generate_latest(registry).decode()
    for kind in UPSTREAM_ERROR_KINDS:
        assert f'proxy_upstream_errors_total{{kind="{kind}"}} 0.0' in text
