"""Bad input on the wire: whatever a client sends to `/v1/responses`, the proxy answers a clear
4xx JSON error (or serves it, when it is a valid request), never a 5xx, never crashes, and serves
the next request. Fuzzed bodies go over a real socket to the proxy in front of the
simulator; the number of examples grows with `PROXY_RELIABILITY_SCALE`.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from tests.reliability import FAST_SIM, MODEL, Proxy, body, running_proxy, scaled, sse_events
from tests.simulator_helpers import SimThread
from tests.test_request_fuzz import POOL, _mutate, json_values
from tests.wellformed import assert_well_formed

LIMIT = 256 * 1024  # the proxy's max_body_bytes here
EXAMPLES = scaled(60, 1500)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TRIED = {"bodies": 0}  # inputs sent, for the figures in BENCHMARKS.md


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST_SIM) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: SimThread, encoding: HarmonyEncoding) -> Iterator[Proxy]:
    assert sim.server is not None
    with running_proxy(sim.server.url, encoding, max_body_bytes=LIMIT) as running:
        yield running
    print(f"\nbad-input requests sent through the proxy: {TRIED['bodies']}")


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as http:
        yield http


def send(
    proxy: Proxy, client: httpx.Client, content: bytes, content_type: str | None = "json"
) -> httpx.Response:
    headers = {}
    if content_type == "json":
        headers["content-type"] = "application/json"
    elif content_type is not None:
        headers["content-type"] = content_type
    TRIED["bodies"] += 1
    return client.post(proxy.url + "/v1/responses", content=content, headers=headers)


def assert_answered(answer: httpx.Response) -> None:
    """A 4xx with an OpenAI-style JSON error, or a served request; never a 5xx."""
    assert answer.status_code < 500, (answer.status_code, answer.text[:500])
    if answer.status_code >= 400:
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert isinstance(error["message"], str)
        assert error["message"]
    elif answer.headers["content-type"].startswith("text/event-stream"):
        assert_well_formed(sse_events(answer.content))
    else:
        assert answer.json()["object"] == "response"


def assert_serves_next(proxy: Proxy, client: httpx.Client) -> None:
    answer = client.post(proxy.url + "/v1/responses", json=body("Still fine?"))
    assert answer.headers.get("connection") != "close"  # a whole body keeps the connection
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"
    assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]


@FUZZ
@given(value=json_values)
def test_any_json_value(proxy: Proxy, client: httpx.Client, value: Any) -> None:
    # The stdlib writes lone surrogates as escapes and NaN as a bare word: bad input too.
    assert_answered(send(proxy, client, json.dumps(value).encode()))


@FUZZ
@given(data=st.data())
def test_near_valid_bodies(proxy: Proxy, client: httpx.Client, data: st.DataObject) -> None:
    request = copy.deepcopy(data.draw(st.sampled_from(POOL)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        request = _mutate(data, request)
    if isinstance(request, dict):
        request["max_output_tokens"] = 300  # keep valid mutants short
    assert_answered(send(proxy, client, json.dumps(request).encode()))


@FUZZ
@given(raw=st.binary(max_size=256))
def test_any_bytes(proxy: Proxy, client: httpx.Client, raw: bytes) -> None:
    answer = send(proxy, client, raw)
    assert_answered(answer)
    assert answer.status_code == 400


def test_fuzzing_leaves_the_proxy_serving(proxy: Proxy, client: httpx.Client) -> None:
    assert_serves_next(proxy, client)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"null",
        b"[]",
        b'"just a string"',
        b"{",
        b'{"model": "openai/gpt-oss-120b", "input": "caf\xe9"}',  # Latin-1, not UTF-8
        b'{"model": "openai/gpt-oss-120b", "input": "\xff\xfe\xfd"}',
        b'{"model": "openai/gpt-oss-120b", "input": "\\ud800"}',  # a lone surrogate escape
        b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
        b'{"model": "openai/gpt-oss-120b", "input": "x"}\x00',
        b'{"model": "openai/gpt-oss-120b", "input": "x", "input": 3}',  # a duplicate key
        b'{"model": "openai/gpt-oss-120b", "input": 1e999}',
        b'{"model": "openai/gpt-oss-120b", "input": "x", "max_output_tokens": 1e400}',
    ],
    ids=lambda raw: repr(raw[:24]),
)
def test_malformed_bodies_are_400(proxy: Proxy, client: httpx.Client, content: bytes) -> None:
    answer = send(proxy, client, content)
    assert_answered(answer)
    assert answer.status_code == 400
    assert_serves_next(proxy, client)


@pytest.mark.parametrize("where", ["input", "metadata", "tool_schema", "text_format"])
@pytest.mark.parametrize("depth", [101, 1000, 100_000])
def test_deeply_nested_json(proxy: Proxy, client: httpx.Client, where: str, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    templates = {
        "input": '{"model": "%s", "input": %s}',
        "metadata": '{"model": "%s", "input": "x", "metadata": {"k": %s}}',
        "tool_schema": '{"model": "%s", "input": "x", "tools": [{"type": "function", '
        '"name": "f", "parameters": {"type": "object", "properties": {"a": %s}}}]}',
        "text_format": '{"model": "%s", "input": "x", "text": {"format": {"type": '
        '"json_schema", "name": "s", "schema": %s}}}',
    }
    content = (templates[where] % (MODEL, nested)).encode()
    answer = send(proxy, client, content)
    assert_answered(answer)
    assert answer.status_code == 400
    assert_serves_next(proxy, client)


def test_deep_but_legal_schema_is_served(proxy: Proxy, client: httpx.Client) -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(40):  # 40 object levels: 80 JSON levels, under the limit of 100
        schema = {"type": "object", "properties": {"a": schema}}
    request = body(tools=[{"type": "function", "name": "deep", "parameters": schema}])
    answer = send(proxy, client, orjson.dumps(request))
    assert answer.status_code == 200
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"


@pytest.mark.parametrize(
    "tools",
    [
        # one function with thousands of parameters
        [
            {
                "type": "function",
                "name": "wide",
                "parameters": {
                    "type": "object",
                    "properties": {f"p{n}": {"type": "string"} for n in range(3000)},
                },
            }
        ],
        # a thousand functions
        [{"type": "function", "name": f"f{n}", "description": "d" * 50} for n in range(1000)],
        # a description of 200 KB
        [{"type": "function", "name": "long", "description": "word " * 40_000}],
        # enums, unions and references in bulk
        [
            {
                "type": "function",
                "name": "enums",
                "parameters": {
                    "type": "object",
                    "properties": {
                        f"e{n}": {"enum": [f"v{m}" for m in range(50)]} for n in range(100)
                    },
                    "$defs": {"x": {"$ref": "#/$defs/x"}},
                },
            }
        ],
    ],
    ids=["3000_parameters", "1000_functions", "200KB_description", "enums_and_refs"],
)
def test_huge_tool_schemas(proxy: Proxy, client: httpx.Client, tools: list[dict[str, Any]]) -> None:
    answer = send(proxy, client, orjson.dumps(body(tools=tools, max_output_tokens=200)))
    assert_answered(answer)
    assert_serves_next(proxy, client)


def test_bodies_over_the_limit_are_413(proxy: Proxy, client: httpx.Client) -> None:
    big = orjson.dumps(body("x" * (LIMIT + 1)))
    answer = send(proxy, client, big)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    # The rest of the body is dropped and the connection closed: the client must not reuse it.
    assert answer.headers["connection"] == "close"

    def chunks() -> Iterator[bytes]:  # chunked: no Content-Length to check up front
        yield b'{"model": "openai/gpt-oss-120b", "input": "'
        for _ in range(LIMIT // 1000 + 2):
            yield b"x" * 1000
        yield b'"}'

    TRIED["bodies"] += 1
    answer = client.post(
        proxy.url + "/v1/responses", content=chunks(), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 413
    # Kept alive only if the whole body was in when the answer started: the next request, on
    # the same pooled connection then, must be served.
    assert_serves_next(proxy, client)


def test_a_lying_content_length_is_413_without_reading_it_all(proxy: Proxy) -> None:
    """Content-Length: 10 GB, then a stream of bytes: rejected once past the limit."""
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 10000000000\r\n\r\n"
        )
        sent = 0
        try:
            while sent < 8 * LIMIT:
                sock.sendall(b"x" * 65536)
                sent += 65536
        except OSError:
            pass  # the proxy answered and closed while we were still sending
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    TRIED["bodies"] += 1


@pytest.mark.parametrize(
    ("content_type", "content"),
    [
        ("text/plain", orjson.dumps(body())),
        ("application/x-www-form-urlencoded", b"model=openai%2Fgpt-oss-120b&input=hi"),
        ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="m"'),
        ("application/xml", b"<request><model>m</model></request>"),
        ("application/json; charset=utf-16", "{}".encode("utf-16")),
        ("image/png", b"\x89PNG\r\n\x1a\n"),
    ],
)
def test_wrong_content_types_are_a_clear_4xx(
    proxy: Proxy, client: httpx.Client, content_type: str, content: bytes
) -> None:
    answer = send(proxy, client, content, content_type)
    assert_answered(answer)
    assert 400 <= answer.status_code < 500
    assert "content" in answer.json()["error"]["message"].lower()
    assert_serves_next(proxy, client)


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json", "application/json; charset=utf-8", "APPLICATION/JSON"],
)
def test_json_content_types_are_served(
    proxy: Proxy, client: httpx.Client, content_type: str | None
) -> None:
    answer = send(proxy, client, orjson.dumps(body()), content_type)
    assert answer.status_code == 200
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"


@pytest.mark.parametrize(
    "header",
    [
        (b"x-request-id", b"\xff\xfe not latin-1 text \x00"),
        (b"x-request-id", b"a" * 5000),
        (b"x-sim-tokens", b"\xc3\x28"),
        (b"authorization", b"Bearer \xff"),
    ],
)
@pytest.mark.parametrize("path", [b"/v1/responses", b"/v1/completions"])  # repaired, passed on
def test_odd_header_bytes(
    proxy: Proxy, client: httpx.Client, header: tuple[bytes, bytes], path: bytes
) -> None:
    port = int(proxy.url.rsplit(":", 1)[1])
    payload = orjson.dumps(body(stream=False))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST "
            + path
            + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + header[0]
            + b": "
            + header[1]
            + b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(payload)
            + payload
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    assert status < 500, answer[:300]
    TRIED["bodies"] += 1
    assert_serves_next(proxy, client)
