"""Token logprobs end to end: the strict `openai` SDK, the proxy on real uvicorn, the simulator
as upstream (its completions logprobs modelled on trtllm-serve's: decoded strings per id, the
sampled token first among the alternatives).

The simulator replays a known generation, so every entry can be held to what upstream sent
for that id (`completion_frames.token_logprob`, and the most likely ids `ranked` at its
position), at 1, 20 and uneven tokens per frame; the entries' bytes must be the output text's,
byte for byte. The simulator lists each token's alternatives as upstream does (the sampled token
first, not always the most likely one), so the entries must be re-ranked to be right.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import BadRequestError, OpenAI
from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.server.app import create_app
from proxy.simulator.app import create_simulator_app
from proxy.simulator.completion_frames import ranked, safe_decode, sampled_rank, token_logprob
from proxy.simulator.config import SimulatorConfig
from proxy.store.memory import MemoryStore
from tests.harmony import ids_of
from tests.live import LiveServer, wait_for
from tests.simulator_helpers import replay_headers
from tests.wellformed import assert_well_formed

MODEL = "openai/gpt-oss-120b"
INCLUDE = ["message.output_text.logprobs"]
ANSWER = "Sure: 🫠 𝔘𝔫𝔦 ཀྵ “𒀱” — café, 東京."
SCRIPT = (
    "<|channel|>analysis<|message|>The user wants ꙮ.<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"
)
CALL = (
    "<|channel|>analysis<|message|>Call f 𒀱.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}'
    "<|call|>"
)
FRAMINGS = {
    "one token per frame": {"X-Sim-Stream-Interval": "1"},
    "twenty per frame": {"X-Sim-Stream-Interval": "20"},
    "uneven": {"X-Sim-Uneven": "7", "X-Sim-Stream-Interval": "3"},
}


def start(config: SimulatorConfig, encoding: HarmonyEncoding) -> Iterator[tuple[str, Any]]:
    with LiveServer(create_simulator_app(config, encoding)) as simulator:
        app = create_app(Settings(upstream_url=simulator.url), encoding, store=MemoryStore())
        with LiveServer(app) as proxy:
            assert wait_for(lambda: app.state.proxy.capability.token_ids, 10)
            yield proxy.url, app


@pytest.fixture(scope="module")
def proxy(encoding: HarmonyEncoding) -> Iterator[tuple[str, Any]]:
    config = SimulatorConfig(token_seconds=0.0, first_token_seconds=0.0)
    yield from start(config, encoding)


@pytest.fixture(scope="module")
def older(encoding: HarmonyEncoding) -> Iterator[tuple[str, Any]]:
    """An upstream build before early 2026: no completions logprobs."""
    config = SimulatorConfig(token_seconds=0.0, first_token_seconds=0.0, completion_logprobs=False)
    yield from start(config, encoding)


def client(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key="x", _strict_response_validation=True)


def streamed(url: str, headers: dict[str, str], **fields: Any) -> tuple[list[Any], list[Any], Any]:
    """A streamed request with the include through the strict SDK: its events (models and
    plain dicts) and the completed response of the terminal event."""
    with client(url) as sdk:
        events = list(
            sdk.responses.create(
                model=MODEL,
                input="Hi",
                include=INCLUDE,
                stream=True,
                extra_headers=headers,
                **fields,
            )
        )
    assert events[-1].type == "response.completed"
    raw = [event.model_dump(mode="json", exclude_unset=True) for event in events]
    return events, raw, events[-1].response


def answer_ids(encoding: HarmonyEncoding) -> list[int]:
    """The ids of the final answer's text, as the model wrote them."""
    return ids_of(encoding, ANSWER)


def expected(encoding: HarmonyEncoding, top: int) -> list[tuple[float, list[tuple[str, float]]]]:
    """For each id of the answer: its sampled logprob, and the `top` most likely of what
    upstream sent for it, most likely first. Without two ids that decode alike that is the
    `top` most likely tokens at its position (checked below); with them, upstream sent one
    entry for both (the later one's value), and the sampled token may fill the place."""
    out = []
    for token in answer_ids(encoding):
        sent = {safe_decode(encoding, [token]): token_logprob(token)}
        sent.update((safe_decode(encoding, [other]), v) for other, v in ranked(token, top))
        kept = sorted(sent.items(), key=lambda pair: -pair[1])[:top]
        truth = [(safe_decode(encoding, [other]), v) for other, v in ranked(token, top)]
        if len(dict(truth)) == len(truth):
            assert kept == truth
        out.append((token_logprob(token), kept))
    return out


def test_the_answer_samples_tokens_that_are_not_the_most_likely(encoding: HarmonyEncoding) -> None:
    """So that a proxy trusting upstream's order fails the tests below."""
    ranks = {sampled_rank(token) for token in answer_ids(encoding)}
    assert 0 in ranks
    assert 3 in ranks  # outside the 3 best: upstream sends 4 keys, the sampled one first


@pytest.mark.parametrize("framing", list(FRAMINGS))
def test_sdk_reads_logprobs_from_the_stream_and_the_snapshot(
    proxy: tuple[str, Any], encoding: HarmonyEncoding, framing: str
) -> None:
    headers = {**replay_headers(ids_of(encoding, SCRIPT)), **FRAMINGS[framing]}
    events, raw, final = streamed(proxy[0], headers, top_logprobs=3)
    assert_well_formed(raw, logprobs=True)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    from_deltas = [entry for delta in deltas for entry in delta.logprobs]
    assert all(delta.logprobs for delta in deltas)
    message = final.output[-1]
    assert message.type == "message"
    part = message.content[0]
    assert part.type == "output_text"
    assert part.logprobs is not None
    # The snapshot's entries are the stream's, and their bytes are the text's.
    assert [(e.token, e.logprob) for e in part.logprobs] == [
        (e.token, e.logprob) for e in from_deltas
    ]
    assert b"".join(bytes(entry.bytes) for entry in part.logprobs) == ANSWER.encode()
    assert final.output_text == ANSWER
    # Values and alternatives are upstream's for exactly those ids.
    got = [(e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in part.logprobs]
    assert got == expected(encoding, 3)
    # Reasoning carries none.
    assert not [e for e in raw if "reasoning" in e["type"] and e.get("logprobs")]
    assert final.output[0].type == "reasoning"


def test_non_streamed_and_stored_responses_keep_their_logprobs(
    proxy: tuple[str, Any], encoding: HarmonyEncoding
) -> None:
    headers = replay_headers(ids_of(encoding, SCRIPT))
    with client(proxy[0]) as sdk:
        response = sdk.responses.create(
            model=MODEL, input="Hi", include=INCLUDE, top_logprobs=0, extra_headers=headers
        )
        stored = sdk.responses.retrieve(response.id)
    part = response.output[-1].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text"
    assert part.logprobs is not None
    assert [e.logprob for e in part.logprobs] == [v for v, _ in expected(encoding, 0)]
    assert all(e.top_logprobs == [] for e in part.logprobs)
    assert b"".join(bytes(e.bytes) for e in part.logprobs) == ANSWER.encode()
    assert stored.output[-1].model_dump() == response.output[-1].model_dump()


def test_tool_calls_carry_none(proxy: tuple[str, Any], encoding: HarmonyEncoding) -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    _, raw, final = streamed(proxy[0], replay_headers(ids_of(encoding, CALL)), tools=tools)
    assert_well_formed(raw, logprobs=True)
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    assert all("logprobs" not in e for e in raw if "function_call" in e["type"])


def test_without_the_include_nothing_changes(
    proxy: tuple[str, Any], encoding: HarmonyEncoding
) -> None:
    headers = replay_headers(ids_of(encoding, SCRIPT))
    with client(proxy[0]) as sdk:
        response = sdk.responses.create(
            model=MODEL, input="Hi", top_logprobs=5, extra_headers=headers
        )
    assert response.output_text == ANSWER
    assert response.output[-1].content[0].logprobs == []  # type: ignore[union-attr]


def test_malformed_logprobs_mid_stream_fail_the_response(
    proxy: tuple[str, Any], encoding: HarmonyEncoding
) -> None:
    headers = {**replay_headers(ids_of(encoding, SCRIPT)), "X-Sim-Fault": "bad-logprobs@12"}
    body = {"model": MODEL, "input": "Hi", "include": INCLUDE, "stream": True}
    events = []
    with httpx.stream("POST", proxy[0] + "/v1/responses", json=body, headers=headers) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(httpx.Response(200, content=line[6:]).json())
    response = assert_well_formed(events, logprobs=True)
    assert response["status"] == "failed"
    error = events[-2]
    assert error["code"] == "malformed_logprobs"
    assert "logprobs" in error["message"]


def test_an_upstream_without_logprobs_gets_a_clear_400(
    older: tuple[str, Any], encoding: HarmonyEncoding
) -> None:
    url, app = older
    ready = httpx.get(url + "/readyz").json()
    assert ready["token_ids"] is True
    assert ready["logprobs"] is False
    assert app.state.proxy.capability.logprobs is False
    with client(url) as sdk:
        with pytest.raises(BadRequestError) as caught:
            sdk.responses.create(model=MODEL, input="Hi", include=INCLUDE)
        assert sdk.responses.create(model=MODEL, input="Hi").status == "completed"
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "logprobs_unavailable"
    assert error["param"] == "include"
    assert "logprobs" in error["message"]


def test_readyz_says_logprobs_are_available(proxy: tuple[str, Any]) -> None:
    url, app = proxy
    ready = httpx.get(url + "/readyz").json()
    assert ready["logprobs"] is True
    assert "token logprobs available" in app.state.proxy.capability.detail
