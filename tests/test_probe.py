"""The capability probe's reading of upstream's answers (proxy/upstream/probe.py), through the
transport seam of the lean client `Upstream` reaches upstream with (tests/upstream_memory.py):
each answer to the guided probe — the constant, free text, a refusal, a broken connection,
garbage — and what the proxy concludes from it; `/health` on the same client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from proxy.errors import UpstreamError
from proxy.server.capability import decoder
from proxy.upstream.client import Upstream
from proxy.upstream.probe import ANSWER_LIMIT, GUIDED, GUIDED_PROBE_TEXT, Capability
from tests.upstream_memory import MemoryTransport, Request, reply

MODEL = "openai/gpt-oss-120b"


def _probe(encoding: HarmonyEncoding, guided: Callable[[Request], bytes]) -> Any:
    """Probe an upstream that answers the probe's first two requests as a capable server and
    the guided one (the request with `response_format`) with `guided`."""

    def handle(request: Request) -> bytes:
        if request.path == "/v1/models":
            return reply(200, json={"data": [{"id": MODEL}]})
        if b"response_format" in request.body:
            return guided(request)
        choice: dict[str, Any] = {"token_ids": [200005], "finish_reason": "length"}
        if b'"logprobs"' in request.body:
            choice["logprobs"] = {"token_logprobs": [-0.5], "tokens": ["x"], "top_logprobs": None}
        return reply(200, json={"choices": [choice]})

    async def run() -> Capability:
        transport = MemoryTransport(handle)
        upstream = Upstream("http://upstream", connect_timeout=1.0, transport=transport)
        try:
            return await upstream.probe(decode=decoder(encoding))
        finally:
            await upstream.aclose()

    return asyncio.run(run())


def _ids(encoding: HarmonyEncoding, text: str) -> bytes:
    ids = encoding.encode(text, allowed_special="all")
    return reply(200, json={"choices": [{"token_ids": ids, "finish_reason": "stop"}]})


def _cut(encoding: HarmonyEncoding) -> bytes:
    raise ConnectionResetError(104, "Connection reset by peer")


@pytest.mark.parametrize(
    ("answer", "guided", "takes", "said"),
    [
        (lambda e: _ids(e, GUIDED_PROBE_TEXT), True, True, GUIDED),
        (lambda e: _ids(e, GUIDED_PROBE_TEXT + "<|return|>"), True, True, GUIDED),
        (lambda e: _ids(e, "<|channel|>analysis<|message|>Hi"), False, True, "ignored"),
        (lambda e: _ids(e, "zebra"), False, True, "ignored"),  # cut short of the constant
        (
            lambda e: reply(400, json={"message": "response_format not supported"}),
            False,
            False,
            "refused: response_format not supported",
        ),
        (lambda e: reply(500, text="boom"), False, False, "refused: HTTP 500"),
        (_cut, None, True, "unknown: the probe failed (ReadError)"),
        (lambda e: reply(200, text="not json"), False, True, "ignored"),
        (lambda e: reply(200, json={"choices": []}), False, True, "ignored"),
        (
            lambda e: reply(200, json={"choices": [{"token_ids": [2**40]}]}),
            False,
            True,
            "ignored",
        ),
        (
            lambda e: reply(200, json={"choices": [{"token_ids": "zebra"}]}),
            False,
            True,
            "ignored",
        ),
        (
            lambda e: reply(200, text="x" * (ANSWER_LIMIT + 1)),
            None,
            True,
            "unknown: the probe failed (RemoteProtocolError)",
        ),
    ],
    ids=[
        "constant",
        "constant_then_stop",
        "free_text",
        "short",
        "400",
        "500",
        "cut",
        "not_json",
        "no_choice",
        "bad_id",
        "ids_not_a_list",
        "too_long",
    ],
)
def test_the_guided_probe_reads_every_answer(
    encoding: HarmonyEncoding, answer: Any, guided: bool | None, takes: bool, said: str
) -> None:
    found = _probe(encoding, lambda request: answer(encoding))
    assert found.token_ids  # the rest of the probe is unaffected
    assert found.logprobs
    assert found.guided is guided
    assert found.takes_response_format is takes
    assert said in found.guided_detail
    assert found.detail.endswith(found.guided_detail)
    assert (
        found.guided_decoding == {True: "enforced", False: "not_enforced", None: "unknown"}[guided]
    )


def _upstream_answering(
    models: Callable[[], bytes], plain: Callable[[], bytes], logprobs: Callable[[], bytes]
) -> MemoryTransport:
    def handle(request: Request) -> bytes:
        if request.path == "/v1/models":
            return models()
        if b"response_format" in request.body:
            return reply(500)
        return logprobs() if b'"logprobs"' in request.body else plain()

    return MemoryTransport(handle, down=models is _refused)


def _ok(**choice: Any) -> Callable[[], bytes]:
    return lambda: reply(200, json={"choices": [{"token_ids": [200005], **choice}]})


def _models() -> bytes:
    return reply(200, json={"data": [{"id": MODEL}]})


def _refused() -> bytes:
    raise AssertionError("a transport that is down is never asked")


def _reset() -> bytes:
    raise ConnectionResetError(104, "Connection reset by peer")


@pytest.mark.parametrize(
    ("models", "plain", "logprobs", "expected"),
    [
        (_refused, _ok(), _ok(), (False, False, False, "not reachable: ConnectError")),
        (_models, _reset, _ok(), (False, False, False, "not reachable: ReadError")),
        (
            _models,
            lambda: reply(404, json={"message": "no such route"}),
            _ok(),
            (True, False, False, "answered 404: no such route"),
        ),
        (
            _models,
            lambda: reply(200, json={}),
            _ok(),
            (True, False, False, "answered no choices"),
        ),
        (
            _models,
            lambda: reply(200, json={"choices": [{"text": "x"}]}),
            _ok(),
            (True, False, False, "too old to repair"),
        ),
        (_models, _ok(), _reset, (True, True, False, "token logprobs unknown")),
        (
            _models,
            _ok(),
            lambda: reply(400, json={"message": "logprobs off"}),
            (True, True, False, "with logprobs: logprobs off"),
        ),
        (_models, _ok(), _ok(), (True, True, False, "gives none")),
        (
            _models,
            _ok(),
            _ok(logprobs={"token_logprobs": [], "tokens": [], "top_logprobs": None}),
            (True, True, False, "no usable token logprobs"),
        ),
    ],
    ids=[
        "models_down",
        "completions_down",
        "404",
        "no_choices",
        "no_token_ids",
        "logprobs_cut",
        "logprobs_refused",
        "logprobs_absent",
        "logprobs_misaligned",
    ],
)
def test_the_probe_reads_every_earlier_answer(
    encoding: HarmonyEncoding,
    models: Callable[[], bytes],
    plain: Callable[[], bytes],
    logprobs: Callable[[], bytes],
    expected: tuple[bool, bool, bool, str],
) -> None:
    async def run() -> Capability:
        transport = _upstream_answering(models, plain, logprobs)
        upstream = Upstream("http://upstream", connect_timeout=1.0, transport=transport)
        try:
            return await upstream.probe(decode=decoder(encoding))
        finally:
            await upstream.aclose()

    found = asyncio.run(run())
    reachable, token_ids, with_logprobs, said = expected
    assert (found.reachable, found.token_ids, found.logprobs) == (
        reachable,
        token_ids,
        with_logprobs,
    )
    assert said in found.detail
    # the guided step runs only once token ids are known; here it is answered 500
    assert found.guided is (False if token_ids else None)


def test_the_probe_and_health_share_the_one_client_and_its_pool(encoding: HarmonyEncoding) -> None:
    def handle(request: Request) -> bytes:
        if request.path == "/base/health":
            return reply(200)
        if request.path == "/base/v1/models":
            return reply(200, json={"data": [{"id": MODEL}]})
        return reply(200, json={"choices": [{"token_ids": [200005], "finish_reason": "length"}]})

    async def run() -> tuple[int, Capability]:
        upstream = Upstream("http://upstream:8000/base", connect_timeout=1.0, transport=transport)
        try:
            return await upstream.get_health(), await upstream.probe(decode=decoder(encoding))
        finally:
            await upstream.aclose()

    transport = MemoryTransport(handle)
    health, found = asyncio.run(run())
    assert health == 200
    assert found.token_ids
    assert transport.connections == 1  # every request on one kept-alive connection
    health_request, models, plain, with_logprobs, guided = transport.requests
    assert (health_request.method, health_request.path) == ("GET", "/base/health")
    assert health_request.body == b""
    assert (models.method, models.path) == ("GET", "/base/v1/models")
    for request in (plain, with_logprobs, guided):
        assert (request.method, request.path) == ("POST", "/base/v1/completions")
        assert request.headers["content-type"] == "application/json"
        assert request.headers["accept-encoding"] == "identity"  # a coding we cannot undo
        assert request.headers["host"] == "upstream:8000"
    assert plain.json() == {
        "model": MODEL,
        "prompt": [200006, 1428, 200008, 13225, 200007, 200006, 173781],
        "max_tokens": 1,
        "detokenize": False,
        "stream": False,
    }
    assert with_logprobs.json() == {**plain.json(), "logprobs": 1}
    assert guided.json()["response_format"]["type"] == "structural_tag"


@pytest.mark.parametrize(
    ("handle", "down", "said"),
    [
        (lambda request: reply(503), False, None),
        (lambda request: _reset(), False, "cannot reach upstream http://upstream: ReadError"),
        (lambda request: reply(200), True, "cannot reach upstream http://upstream: ConnectError"),
        (lambda request: b"HTTP/1.1 200 OK\r\n", False, "upstream did not answer within 0.2 s"),
    ],
    ids=["503", "reset", "refused", "silent"],
)
def test_health_answers_a_status_or_an_upstream_error(
    monkeypatch: pytest.MonkeyPatch, handle: Any, down: bool, said: str | None
) -> None:
    monkeypatch.setattr("proxy.upstream.client.HEALTH_SECONDS", 0.2)

    async def run() -> int:
        transport = MemoryTransport(handle, down=down)
        upstream = Upstream("http://upstream", connect_timeout=1.0, transport=transport)
        try:
            return await upstream.get_health()
        finally:
            await upstream.aclose()

    if said is None:
        assert asyncio.run(run()) == 503
        return
    with pytest.raises(UpstreamError) as caught:
        asyncio.run(run())
    assert said in caught.value.message
    assert caught.value.status == (504 if "within" in said else 502)
