"""Logprobs at the upstream boundary: what the proxy asks, how frames are read, and the
simulator's model of trtllm-serve's completions logprobs (builds from early 2026)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.request.prepare import prepare_request
from proxy.simulator.completion_frames import CompletionWriter, ranked, token_logprob
from proxy.simulator.completion_request import read_completion_request
from proxy.simulator.engine import EngineOutput
from proxy.upstream.completions import FrameError, parse_frame

INCLUDE = ["message.output_text.logprobs"]


def frame(logprobs: Any, token_ids: list[int] | None = None) -> str:
    choice = {"index": 0, "text": "", "token_ids": token_ids or [5, 6], "logprobs": logprobs}
    return orjson.dumps({"choices": [choice]}).decode()


@pytest.mark.parametrize(
    ("body", "asked"),
    [
        ({}, None),
        ({"top_logprobs": 4}, None),  # without the include: nothing asked of upstream
        ({"include": INCLUDE}, 1),
        ({"include": INCLUDE, "top_logprobs": 0}, 1),
        ({"include": INCLUDE, "top_logprobs": 7}, 7),
    ],
)
def test_upstream_is_asked_only_with_the_include(
    encoding: HarmonyEncoding, body: dict[str, Any], asked: int | None
) -> None:
    prepared = prepare_request({"model": "m", "input": "Hi", **body}, encoding)
    assert prepared.completion_body.get("logprobs") == asked
    assert (prepared.top_logprobs is None) is (asked is None)


def test_a_frame_with_logprobs_is_read_aligned() -> None:
    good = {"token_logprobs": [-0.5, -1], "top_logprobs": [{"a": -0.5}, {"b": -1, "c": -2}]}
    parsed = parse_frame(frame(good), logprobs=True)
    assert parsed.logprobs == (-0.5, -1)
    assert parsed.top_logprobs == ({"a": -0.5}, {"b": -1, "c": -2})
    # Not asked: not read (zero cost), whatever the frame carries.
    assert parse_frame(frame(good)).logprobs is None
    # Frames without ids (the usage frame, an empty output) need none.
    usage = orjson.dumps({"choices": [], "usage": {"completion_tokens": 3}}).decode()
    assert parse_frame(usage, logprobs=True).logprobs is None


@pytest.mark.parametrize(
    "logprobs",
    [
        None,
        {},
        {"token_logprobs": [-0.5]},
        {"token_logprobs": [-0.5, "x"]},
        {"token_logprobs": [-0.5, True]},
        {"token_logprobs": [-0.5, None]},
        {"token_logprobs": [-0.5, -1], "top_logprobs": [{}]},
        {"token_logprobs": [-0.5, -1], "top_logprobs": [{}, {"a": "b"}]},
        {"token_logprobs": [-0.5, -1], "top_logprobs": [{}, []]},
    ],
)
def test_missing_or_malformed_logprobs_are_a_frame_error(logprobs: Any) -> None:
    with pytest.raises(FrameError) as caught:
        parse_frame(frame(logprobs), logprobs=True)
    assert caught.value.code == "malformed_logprobs"
    assert "logprobs" in caught.value.message


def _writer(encoding: HarmonyEncoding, count: int | None, *, given: bool = True) -> Any:
    body: dict[str, Any] = {"model": "m", "prompt": [1], "stream": True, "detokenize": False}
    if count is not None:
        body["logprobs"] = count
    params = read_completion_request(body)
    return CompletionWriter(
        encoding, params, engine_id=0, created=0, prompt_tokens=1, prompt_text=None, logprobs=given
    )


def _choice(data: bytes) -> dict[str, Any]:
    choice: dict[str, Any] = orjson.loads(data[len("data: ") :])["choices"][0]
    return choice


def test_the_simulator_gives_k_alternatives_keyed_by_decoded_string(
    encoding: HarmonyEncoding,
) -> None:
    ids = list(encoding.encode("Hi 🫠"))  # 🫠 is three tokens, each decoded alone to U+FFFD
    choice = _choice(_writer(encoding, 3).chunk(EngineOutput(tuple(ids))))
    logprobs = choice["logprobs"]
    assert choice["token_ids"] == ids
    assert logprobs["token_logprobs"] == [token_logprob(t) for t in ids]
    assert logprobs["tokens"][-1] == "\ufffd"
    for token, top in zip(ids, logprobs["top_logprobs"], strict=True):
        first = encoding.decode([token])
        assert next(iter(top)) == first  # the sampled id first
        assert len(top) <= 4  # then the 3 best: 4 keys when the sampled id is not one of them
        others = [encoding.decode([other]) for other, _ in ranked(token, 3)]
        assert len(top) == len({first, *others})  # equal strings collapse into one key
    # What the proxy reads back from it.
    parsed = parse_frame(
        _writer(encoding, 3).chunk(EngineOutput(tuple(ids)))[6:-2].decode(), logprobs=True
    )
    assert parsed.logprobs == tuple(token_logprob(t) for t in ids)


def test_an_older_build_and_the_fault(encoding: HarmonyEncoding) -> None:
    ids = (1000, 2000, 3000)
    older = _choice(_writer(encoding, 2, given=False).chunk(EngineOutput(ids)))
    assert older["logprobs"] is None
    bad = _writer(encoding, 2).chunk(EngineOutput(ids), bad_logprobs=True)
    assert len(_choice(bad)["logprobs"]["token_logprobs"]) == 2
    with pytest.raises(FrameError, match="align"):
        parse_frame(bad[6:-2].decode(), logprobs=True)
