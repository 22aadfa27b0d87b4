"""Headers, logs and error bodies under hostile input, on real sockets: forwarding headers set
from the connection only, a sane X-Request-Id, client strings capped and escaped in logs.

What upstream receives is checked at a real upstream (the scripted double, a uvicorn server on
loopback) for both routes: the pass-through and the repaired route's `/v1/completions`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from openai_harmony import HarmonyEncoding
from starlette.types import Receive, Scope, Send

from proxy.config.settings import Settings
from proxy.logs import FIELD_CHARS, JsonFormatter, TextFormatter
from proxy.server.http.forwarding import ForwardingMiddleware
from proxy.server.http.guard import Guard, Limits
from tests.live import LiveServer
from tests.rawhttp import exchange, port_of, request
from tests.reliability import Proxy, body, running_proxy, wait_until
from tests.upstream_double import Seen, UpstreamDouble

_RECORD = frozenset([*vars(logging.makeLogRecord({})), "message", "asctime"])
SPOOFED = [
    ("X-Forwarded-For", "6.6.6.6"),
    ("X-Forwarded-For", "7.7.7.7, 8.8.8.8"),
    ("X-Forwarded-Host", "evil.example"),
    ("X-Forwarded-Proto", "https"),
    ("X-Forwarded-Port", "1"),
    ("Forwarded", "for=6.6.6.6;proto=https"),
    ("X-Real-IP", "6.6.6.6"),
    # Rewrites of the request target that IIS, Symfony and Zend apps honour.
    ("X-Original-URL", "/evil-admin"),
    ("X-Rewrite-URL", "/evil-admin"),
    # Any other X-Forwarded-*, and the client addresses CDNs and load balancers set.
    ("X-Forwarded-Prefix", "/evil-prefix"),
    ("X-Forwarded-Server", "evil.example"),
    ("X-Forwarded-Scheme", "https"),
    ("X-Forwarded-Ssl", "on"),
    ("X-Forwarded-Uri", "/evil-admin"),
    ("X-Original-Forwarded-For", "6.6.6.6"),
    ("X-Original-Host", "evil.example"),
    ("True-Client-IP", "6.6.6.6"),
    ("X-Client-IP", "6.6.6.6"),
    ("X-Cluster-Client-IP", "6.6.6.6"),
    ("CF-Connecting-IP", "6.6.6.6"),
    ("Fastly-Client-IP", "6.6.6.6"),
]
#: What upstream may receive about the client: ours, set from the connection.
OURS = {"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"}


@pytest.fixture(scope="module")
def double() -> Iterator[tuple[UpstreamDouble, str]]:
    upstream = UpstreamDouble()
    with LiveServer(upstream) as server:
        yield upstream, server.url


@pytest.fixture(scope="module")
def proxy(double: tuple[UpstreamDouble, str], encoding: HarmonyEncoding) -> Iterator[Proxy]:
    with running_proxy(double[1], encoding) as running:
        yield running


def upstream_views(
    proxy: Proxy, upstream: UpstreamDouble, headers: list[tuple[str, str]]
) -> tuple[Seen, Seen]:
    """What upstream saw of one pass-through request and one repaired request's completion."""
    port = port_of(proxy.url)
    (echo,) = exchange(port, request("GET", "/fwd-echo", headers=headers)).answers
    assert echo.status == 200
    before = len(upstream.completions())
    payload = orjson.dumps(body())
    (streamed,) = exchange(
        port, request("POST", "/v1/responses", payload, headers), ["POST"]
    ).answers
    assert streamed.status == 200
    passed = next(seen for seen in reversed(upstream.seen) if seen.path == "/fwd-echo")
    assert wait_until(lambda: len(upstream.completions()) > before, 5)
    return passed, upstream.completions()[-1]


def assert_only_ours(seen: Seen) -> None:
    """No forwarding header but the three we set reached upstream."""
    spoofed = {name.lower() for name, _ in SPOOFED}
    assert not (spoofed - OURS) & set(seen.headers), (seen.path, seen.headers)
    assert "/evil" not in str(seen.headers)


def test_client_forwarding_headers_never_reach_upstream(
    proxy: Proxy, double: tuple[UpstreamDouble, str]
) -> None:
    for seen in upstream_views(proxy, double[0], SPOOFED):
        headers = seen.headers
        assert headers["x-forwarded-for"] == "127.0.0.1", seen.path  # the peer, and only it
        assert headers["x-forwarded-proto"] == "http"
        assert headers["x-forwarded-host"] == "proxy.test"  # the request's Host
        assert_only_ours(seen)
        assert "6.6.6.6" not in str(headers)
        assert "evil" not in str(headers)
        # What upstream's uvicorn (trusting 127.0.0.1, as trtllm-serve's does) made of it.
        assert (seen.client, seen.scheme) == ("127.0.0.1", "http")


def test_a_trusted_proxys_chain_is_appended_to(
    double: tuple[UpstreamDouble, str], encoding: HarmonyEncoding
) -> None:
    with running_proxy(double[1], encoding, trusted_proxies=("127.0.0.0/8",)) as trusting:
        for seen in upstream_views(trusting, double[0], SPOOFED):
            headers = seen.headers
            assert headers["x-forwarded-for"] == "6.6.6.6, 7.7.7.7, 8.8.8.8, 127.0.0.1"
            assert headers["x-forwarded-proto"] == "https"
            assert headers["x-forwarded-host"] == "evil.example"
            assert_only_ours(seen)
            # Upstream trusts only us: its client is the address our trusted proxy reported.
            assert (seen.client, seen.scheme) == ("8.8.8.8", "https")


def test_the_client_address_is_not_spoofable() -> None:
    """`scope["client"]` as the app sees it behind the guard's uvicorn options: uvicorn's own
    forwarding middleware (which trusts 127.0.0.1 by default) is off, ours trusts only the
    configured proxies."""

    async def client_of(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        payload = orjson.dumps({"client": scope["client"][0], "scheme": scope["scheme"]})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": payload})

    spoof = {"x-forwarded-for": "6.6.6.6", "x-forwarded-proto": "https"}
    for trusted, expected in (((), "127.0.0.1"), (("127.0.0.1",), "6.6.6.6")):
        app = ForwardingMiddleware(client_of, trusted)
        options = Guard(Limits.of(Settings())).uvicorn_options()
        with LiveServer(app, **options) as server:
            seen = httpx.get(server.url, headers=spoof, timeout=5).json()
        assert seen["client"] == expected
        assert seen["scheme"] == ("https" if trusted else "http")


# -- X-Request-Id ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("req-1:a.b_C", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("has space", False),
        ("tab\there", False),
        ("<script>", False),
        ("café", False),
        ("a/b+c=d@e", False),
        ("", False),
    ],
)
def test_x_request_id_is_kept_only_when_sane(
    proxy: Proxy, double: tuple[UpstreamDouble, str], sent: str, kept: bool
) -> None:
    upstream = double[0]
    headers = [("X-Request-Id", sent)]
    (echo,) = exchange(port_of(proxy.url), request("GET", "/rid-echo", headers=headers)).answers
    returned = echo.headers["x-request-id"]
    seen = next(s for s in reversed(upstream.seen) if s.path == "/rid-echo")
    assert seen.headers["x-request-id"] == returned  # one id, the same both ways
    if kept:
        assert returned == sent
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", returned), returned


# -- logs ----------------------------------------------------------------------------------------


def _request_lines(proxy: Proxy, key: str, start: str) -> list[logging.LogRecord]:
    return [
        r
        for r in proxy.logs.records
        if r.getMessage() == "request" and str(getattr(r, key, "")).startswith(start)
    ]


@pytest.mark.parametrize(
    "model",
    [
        "gpt\r\n2026-01-01 00:00:00,000 INFO    request status=200 forged=1",
        "gpt\u2028forged\x85line\x1b[31m",
        "m" * 1_000_000,
    ],
    ids=["crlf", "unicode-breaks", "1-MB"],
)
def test_client_strings_are_capped_and_escaped_in_both_log_formats(
    proxy: Proxy, model: str
) -> None:
    payload = orjson.dumps({"model": model, "input": "hi", "stream": True})
    with httpx.Client(timeout=30) as client:
        client.post(proxy.url + "/v1/responses", content=payload)
        client.get(proxy.url + "/path-" + "p" * 10_000 + "%0D forged=1%E2%80%A8%1B")

    def records() -> list[logging.LogRecord]:
        return _request_lines(proxy, "model", model[:50]) + _request_lines(proxy, "path", "/path-")

    assert wait_until(lambda: len(records()) >= 2, 5), [vars(r) for r in proxy.logs.records][-3:]
    for record in records():
        text = TextFormatter().format(record)
        line = JsonFormatter().format(record)
        for rendered in (text, line):
            assert len(rendered.splitlines()) == 1, rendered[:300]
            assert len(rendered) < 3 * FIELD_CHARS + 1000
        fields: dict[str, Any] = orjson.loads(line)
        for key in ("model", "path"):
            if key in fields:
                assert len(fields[key]) <= FIELD_CHARS + 20
        # the text format: read as key=value pairs, exactly the record's fields come out
        keys = [key for key, _ in re.findall(r' (\w+)=("(?:[^"\\]|\\.)*"|\S*)', text)]
        assert keys == [key for key in vars(record) if key not in _RECORD], text[:500]


# -- error bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_body",
    [
        {"model": "m", "input": "hi", "k" * 2_000_000: 1},
        {"model": "m", "input": "hi", "metadata": {"k" * 2_000_000: 5}},
        {"model": "m", "input": [{"type": "message", "role": "user", "k" * 500_000: "x"}]},
        {"model": "m", "input": "hi", "tool_choice": "z" * 1_000_000},
        {"model": "m", "input": "hi", "temperature": "t" * 1_000_000},
        {"model": "m", "input": "hi", "seed": "s" * 1_000_000},
    ],
    ids=["top-level key", "nested key", "item key", "choice value", "typed value", "chat field"],
)
def test_error_bodies_quote_at_most_200_chars_of_client_input(
    proxy: Proxy, request_body: dict[str, Any]
) -> None:
    answer = httpx.post(proxy.url + "/v1/responses", content=orjson.dumps(request_body), timeout=30)
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert len(answer.content) < 1000, answer.text[:500]
    assert re.search(r"(.)\1{200}", error["message"]) is None, error["message"][:300]
    assert error["param"] is None or len(error["param"]) <= 201
