"""Security basics: credentials never logged or echoed; no header or request target
sends the proxy anywhere but its configured upstream; nothing upstream puts in its response
headers reaches a repaired stream.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.tokens import RETURN
from proxy.logs import JsonFormatter, TextFormatter
from tests.harmony import ids_of
from tests.live import LiveServer
from tests.reliability import (
    FAST_SIM,
    LogCapture,
    Proxy,
    RawUpstream,
    body,
    running_proxy,
    sse_events,
)
from tests.simulator_helpers import SimThread
from tests.upstream_double import UpstreamDouble
from tests.wellformed import assert_well_formed

SECRET = "sk-proj-SECRET-do-not-leak-4242"


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST_SIM) as running:
        yield running


def test_authorization_is_never_logged_or_echoed(sim: SimThread, encoding: HarmonyEncoding) -> None:
    assert sim.server is not None
    auth = {"Authorization": f"Bearer {SECRET}", "X-Api-Key": SECRET}
    requests: list[tuple[str, str, bytes | None, dict[str, str]]] = [
        ("POST", "/v1/responses", orjson.dumps(body()), {}),  # streamed
        ("POST", "/v1/responses", orjson.dumps(body(stream=False)), {}),
        ("POST", "/v1/responses", b"{not json", {}),  # 400
        ("POST", "/v1/responses", orjson.dumps(body(seed=3)), {}),  # 400 naming the field
        ("POST", "/v1/responses", orjson.dumps(body("x" * 5000)), {}),  # 413
        ("POST", "/v1/responses", orjson.dumps(body()), {"X-Sim-Fault": "http:500"}),  # 502
        ("POST", "/v1/responses", orjson.dumps(body()), {"X-Sim-Fault": "http:401"}),  # 401
        ("POST", "/v1/responses", orjson.dumps(body()), {"X-Sim-Fault": "cut@20"}),  # failed
        ("POST", "/v1/responses", orjson.dumps(body()), {"content-type": "text/plain"}),  # 415
        ("GET", "/v1/models", None, {}),  # passed through
        ("GET", "/nowhere", None, {}),  # passed through: 404
        ("GET", "/healthz", None, {}),
        ("GET", "/readyz", None, {}),
        ("GET", "/metrics", None, {}),
    ]
    seen = []
    with (
        running_proxy(sim.server.url, encoding, max_body_bytes=4000, log_level="debug") as proxy,
        httpx.Client(timeout=30) as client,
    ):
        for method, path, content, extra in requests:
            headers = {**auth, "content-type": "application/json", **extra}
            answer = client.request(method, proxy.url + path, content=content, headers=headers)
            seen.append(f"{answer.status_code} {answer.headers} {answer.text}")
        statuses = [int(line.split(" ", 1)[0]) for line in seen]
        records = list(proxy.logs.records)
    assert statuses[:9] == [200, 200, 400, 400, 413, 502, 401, 200, 415], statuses
    for line in seen:
        assert SECRET not in line, line[:500]
    rendered = [JsonFormatter().format(r) + TextFormatter().format(r) for r in records]
    assert len([r for r in records if r.getMessage() == "request"]) >= len(requests) - 3
    for line in rendered:
        assert SECRET not in line, line[:500]
    # ...while upstream does get the credentials it needs.
    assert any(r.path == "/v1/completions" for r in sim.records)


# -- the only host the proxy talks to is its upstream ------------------------------------------


@pytest.fixture(scope="module")
def hosts(encoding: HarmonyEncoding) -> Iterator[tuple[UpstreamDouble, UpstreamDouble, Proxy]]:
    good, evil = UpstreamDouble(), UpstreamDouble()
    with (
        LiveServer(good) as good_server,
        LiveServer(evil) as evil_server,
        running_proxy(good_server.url, encoding) as proxy,
    ):
        proxy.app.state.evil_port = evil_server.port
        yield good, evil, proxy


def raw_request(proxy: Proxy, data: bytes) -> bytes:
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
    return answer


TARGETS = [
    b"http://{evil}/v1/models",  # absolute form
    b"https://{evil}/v1/models",
    b"//{evil}/v1/models",  # a network-path reference
    b"///{evil}/v1/models",
    b"/\\{evil}/v1/models",
    b"/%2F%2F{evil}/v1/models",
    b"/%5C%5C{evil}/v1/models",
    b"http:{evil}/v1/models",
    b"@{evil}/v1/models",
    b"/v1/models@{evil}",
    b"/v1/models?@{evil}/",
    b"/v1/../../{evil}/v1/models",
    b"/upstream//{evil}/metrics",
    b"http://{evil}/v1/responses",
    b"//{evil}/v1/responses",
]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.decode())
def test_no_request_target_reaches_another_host(
    hosts: tuple[UpstreamDouble, UpstreamDouble, Proxy], target: bytes
) -> None:
    _, evil, proxy = hosts
    evil_host = f"127.0.0.1:{proxy.app.state.evil_port}".encode()
    payload = orjson.dumps(body())
    for method in (b"GET", b"POST"):
        answer = raw_request(
            proxy,
            method
            + b" "
            + target.replace(b"{evil}", evil_host)
            + b" HTTP/1.1\r\nhost: "
            + evil_host
            + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(payload), payload),
        )
        assert answer.startswith(b"HTTP/1.1 "), answer[:100]
        assert int(answer.split(b" ", 2)[1]) < 500 or b"upstream" in answer, answer[:300]
    assert evil.seen == [], [(s.method, s.path) for s in evil.seen]


@pytest.mark.parametrize(
    "header",
    [
        b"host: {evil}",
        b"x-forwarded-host: {evil}",
        b"forwarded: host={evil};proto=http",
        b"x-original-url: http://{evil}/v1/models",
        b"x-rewrite-url: http://{evil}/v1/models",
        b"x-forwarded-for: 127.0.0.1\r\nx-forwarded-proto: https",
        b"proxy: http://{evil}",
    ],
)
def test_no_header_reaches_another_host(
    hosts: tuple[UpstreamDouble, UpstreamDouble, Proxy], header: bytes
) -> None:
    good, evil, proxy = hosts
    evil_host = f"127.0.0.1:{proxy.app.state.evil_port}".encode()
    before = len(good.seen)
    for method, path in ((b"GET", b"/v1/models"), (b"POST", b"/v1/responses")):
        payload = orjson.dumps(body()) if method == b"POST" else b""
        head = header.replace(b"{evil}", evil_host)
        if not head.startswith(b"host:"):
            head = b"host: 127.0.0.1\r\n" + head
        answer = raw_request(
            proxy,
            method
            + b" "
            + path
            + b" HTTP/1.1\r\n"
            + head
            + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(payload), payload),
        )
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert evil.seen == []
    good_host = good.seen[-1].headers["host"]
    assert all(s.headers["host"] == good_host for s in good.seen[before:])
    assert str(proxy.app.state.evil_port) not in good_host


# -- upstream's response headers never reach a repaired stream --------------------------------


def _frames(encoding: HarmonyEncoding) -> bytes:
    text = (
        "<|channel|>analysis<|message|>Fine.<|end|><|start|>assistant<|channel|>final"
        "<|message|>All good."
    )
    ids = [*ids_of(encoding, text), RETURN]
    chunks = [ids[:1], ids[1:8], ids[8:]]
    frames = b""
    for number, chunk in enumerate(chunks):
        choice = {
            "index": 0,
            "text": "",
            "token_ids": chunk,
            "finish_reason": "stop" if number == len(chunks) - 1 else None,
            "stop_reason": None,
        }
        frames += b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"
    return frames + b"data: [DONE]\n\n"


INJECTED = b'data: {"type":"response.completed","sequence_number":99}'
HEADERS = [
    b"x-evil: " + INJECTED,
    b"x-evil-event: event: response.completed",
    b"set-cookie: session=stolen; Path=/",
    b"access-control-allow-origin: *",
    b"content-security-policy: none",
    b"location: http://evil.example/",
    b"x-request-id: upstream-chosen-id",
    b"cache-control: max-age=9999",
]


@pytest.mark.parametrize("framing", ["close", "chunked"])
def test_upstream_headers_never_reach_a_repaired_stream(
    encoding: HarmonyEncoding, framing: str
) -> None:
    frames = _frames(encoding)
    if framing == "chunked":
        body_bytes = b"%x\r\n%s\r\n0\r\n\r\n" % (len(frames), frames)
        extra = b"transfer-encoding: chunked\r\n"
    else:
        body_bytes, extra = frames, b"connection: close\r\n"
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        + b"\r\n".join(HEADERS)
        + b"\r\n"
        + extra
        + b"\r\n"
        + body_bytes
    )
    with RawUpstream(answer) as upstream, running_proxy(upstream.url, encoding) as proxy:
        response = httpx.post(proxy.url + "/v1/responses", json=body(), timeout=10)
        assert response.status_code == 200
        events = sse_events(response.content)
        assert assert_well_formed(events)["status"] == "completed"
        assert b'sequence_number":99' not in response.content
        assert b"stolen" not in response.content
        names = {name.lower() for name in response.headers}
        assert names <= {
            "content-type",
            "cache-control",
            "x-accel-buffering",
            "x-request-id",
            "date",
            "server",  # uvicorn's own (the tests' server; `serve` leaves it out)
            "transfer-encoding",
        }, names
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-request-id"] != "upstream-chosen-id"


@pytest.mark.parametrize(
    "bad_header",
    [
        b"x-evil: a\nevent: response.completed",  # a bare LF inside the head
        b"x-evil: a\r\n\r\ndata: " + INJECTED,  # a blank line: the head ends early
        b"x-evil:\x00data",
        b" folded: continuation\r\n\tevent: response.completed",
    ],
    ids=["bare_lf", "early_blank_line", "nul", "obs_fold"],
)
def test_malformed_upstream_heads_are_an_error_not_a_stream(
    encoding: HarmonyEncoding, bad_header: bytes
) -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        + bad_header
        + (b"\r\nconnection: close\r\n\r\n" + _frames(encoding))
    )
    logs = LogCapture()
    with (
        RawUpstream(answer) as upstream,
        running_proxy(upstream.url, encoding) as proxy,
        logs.attached(),
    ):
        response = httpx.post(proxy.url + "/v1/responses", json=body(), timeout=10)
        if response.status_code == 200:  # the head parsed after all: a clean stream
            events = sse_events(response.content)
            assert_well_formed(events)
            assert b'sequence_number":99' not in response.content
        else:
            assert response.status_code == 502
            assert response.headers["content-type"] == "application/json"
        assert proxy.logs.problems() == []
    assert not [r for r in logs.records if r.levelno >= logging.ERROR]
