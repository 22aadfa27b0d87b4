"""The capability probe's reading of upstream's answers (proxy/upstream/probe.py), through the
httpx transport `Upstream` takes as a seam: each answer to the guided probe — the constant,
free text, a refusal, a broken connection, garbage — and what the proxy concludes from it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from proxy.server.capability import decoder
from proxy.upstream.client import Upstream
from proxy.upstream.probe import GUIDED, GUIDED_PROBE_TEXT, Capability

MODEL = "openai/gpt-oss-120b"


def _probe(encoding: HarmonyEncoding, guided: Callable[[httpx.Request], httpx.Response]) -> Any:
    """Probe an upstream that answers the probe's first two requests as a capable server and
    the guided one (the request with `response_format`) with `guided`."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": MODEL}]})
        body = request.read()
        if b"response_format" in body:
            return guided(request)
        choice: dict[str, Any] = {"token_ids": [200005], "finish_reason": "length"}
        if b'"logprobs"' in body:
            choice["logprobs"] = {"token_logprobs": [-0.5], "tokens": ["x"], "top_logprobs": None}
        return httpx.Response(200, json={"choices": [choice]})

    async def run() -> Capability:
        upstream = Upstream(
            "http://upstream", connect_timeout=1.0, transport=httpx.MockTransport(handle)
        )
        try:
            return await upstream.probe(decode=decoder(encoding))
        finally:
            await upstream.aclose()

    return asyncio.run(run())


def _ids(encoding: HarmonyEncoding, text: str) -> httpx.Response:
    ids = encoding.encode(text, allowed_special="all")
    return httpx.Response(200, json={"choices": [{"token_ids": ids, "finish_reason": "stop"}]})


def _cut(encoding: HarmonyEncoding) -> httpx.Response:
    raise httpx.ReadError("connection reset")


@pytest.mark.parametrize(
    ("answer", "guided", "takes", "said"),
    [
        (lambda e: _ids(e, GUIDED_PROBE_TEXT), True, True, GUIDED),
        (lambda e: _ids(e, GUIDED_PROBE_TEXT + "<|return|>"), True, True, GUIDED),
        (lambda e: _ids(e, "<|channel|>analysis<|message|>Hi"), False, True, "ignored"),
        (lambda e: _ids(e, "zebra"), False, True, "ignored"),  # cut short of the constant
        (
            lambda e: httpx.Response(400, json={"message": "response_format not supported"}),
            False,
            False,
            "refused: response_format not supported",
        ),
        (lambda e: httpx.Response(500, text="boom"), False, False, "refused: HTTP 500"),
        (_cut, None, True, "unknown: the probe failed (ReadError)"),
        (lambda e: httpx.Response(200, text="not json"), False, True, "ignored"),
        (lambda e: httpx.Response(200, json={"choices": []}), False, True, "ignored"),
        (
            lambda e: httpx.Response(200, json={"choices": [{"token_ids": [2**40]}]}),
            False,
            True,
            "ignored",
        ),
        (
            lambda e: httpx.Response(200, json={"choices": [{"token_ids": "zebra"}]}),
            False,
            True,
            "ignored",
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
    models: Callable[[], httpx.Response],
    plain: Callable[[], httpx.Response],
    logprobs: Callable[[], httpx.Response],
) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return models()
        body = request.read()
        if b"response_format" in body:
            return httpx.Response(500)
        return logprobs() if b'"logprobs"' in body else plain()

    return httpx.MockTransport(handle)


def _ok(**choice: Any) -> Callable[[], httpx.Response]:
    return lambda: httpx.Response(200, json={"choices": [{"token_ids": [200005], **choice}]})


def _models() -> httpx.Response:
    return httpx.Response(200, json={"data": [{"id": MODEL}]})


def _raise() -> httpx.Response:
    raise httpx.ConnectError("refused")


@pytest.mark.parametrize(
    ("models", "plain", "logprobs", "expected"),
    [
        (_raise, _ok(), _ok(), (False, False, False, "not reachable: ConnectError")),
        (_models, _raise, _ok(), (False, False, False, "not reachable: ConnectError")),
        (
            _models,
            lambda: httpx.Response(404, json={"message": "no such route"}),
            _ok(),
            (True, False, False, "answered 404: no such route"),
        ),
        (
            _models,
            lambda: httpx.Response(200, json={}),
            _ok(),
            (True, False, False, "answered no choices"),
        ),
        (
            _models,
            lambda: httpx.Response(200, json={"choices": [{"text": "x"}]}),
            _ok(),
            (True, False, False, "too old to repair"),
        ),
        (_models, _ok(), _raise, (True, True, False, "token logprobs unknown")),
        (
            _models,
            _ok(),
            lambda: httpx.Response(400, json={"message": "logprobs off"}),
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
    models: Callable[[], httpx.Response],
    plain: Callable[[], httpx.Response],
    logprobs: Callable[[], httpx.Response],
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
