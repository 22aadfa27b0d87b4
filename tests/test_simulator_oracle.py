"""The simulator against the recordings of the real upstream (`tests/fixtures/trtllm-oracle/`).

For each scenario's request it renders upstream's prompt; replaying the scenario's token ids at
each recording's chunking, its `/v1/responses` stream is upstream's, frame for frame and byte for
byte (with the recordings' ids and clock injected), its `/v1/completions` frames carry the same
token groups, and its non-streaming answer is upstream's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.tokens import CALL
from tests.simulator_helpers import (
    FAST,
    MANIFEST,
    ORACLE,
    FixtureIds,
    SimThread,
    delivered_groups,
    recorded_frames,
    replay_headers,
    scenario,
    transcripts,
)
from tests.spec_departures import normalised

STREAMS = list(transcripts(stream=True))
NONSTREAMS = list(transcripts(stream=False))
FIXED_CLOCK = 1767225600.0
# The fields the brief names; byte identity is checked separately.
EVENT_FIELDS = (
    "type",
    "sequence_number",
    "output_index",
    "item_id",
    "content_index",
    "delta",
    "text",
)


IDS = FixtureIds()


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST, ids=IDS, clock=lambda: FIXED_CLOCK) as running:
        yield running


def _headers(transcript: dict[str, Any]) -> dict[str, str]:
    return replay_headers(
        scenario(transcript)["token_ids"],
        transcript["chunk_sizes"],
        stop_mode=transcript["stop_mode"],
    )


@pytest.mark.parametrize("name", sorted(MANIFEST["scenarios"]))
def test_renders_upstreams_prompt(sim: SimThread, name: str) -> None:
    case = MANIFEST["scenarios"][name]
    answer = sim.http.post("/v1/responses", json={**case["request_body"], "stream": False})
    assert answer.status_code == 200
    assert list(sim.last.prompt_ids) == case["prompt_token_ids"]


def _item_view(item: dict[str, Any]) -> tuple[Any, ...]:
    return (item.get("type"), item.get("status"), item.get("content"), item.get("arguments"))


@pytest.mark.parametrize("transcript", STREAMS, ids=lambda t: t["file"])
def test_responses_stream_is_upstreams(sim: SimThread, transcript: dict[str, Any]) -> None:
    expected = recorded_frames(transcript)
    body = {**scenario(transcript)["request_body"], "stream": True}
    IDS.reset()
    streamed = sim.stream("/v1/responses", body, _headers(transcript))
    record = sim.last
    assert (streamed.status, streamed.broken) == (200, None)
    assert streamed.headers["content-type"] == transcript["content_type"]
    got = [json.loads(data) for data in streamed.data]
    want = [json.loads(data) for data in expected]
    assert [m[0] for m in streamed.messages] == [event["type"] for event in want]
    for ours, theirs in zip(got, want, strict=True):
        assert {k: ours.get(k) for k in EVENT_FIELDS} == {k: theirs.get(k) for k in EVENT_FIELDS}
        for key in ("item", "part"):
            if key in theirs:
                assert _item_view(ours[key]) == _item_view(theirs[key])
    # Byte for byte, ids and clock being the recordings', but for the fields where the response
    # object follows OpenAI's spec instead of upstream (tests/spec_departures.py).
    assert [_compact(normalised(json.loads(d))) for d in streamed.data] == [
        _compact(normalised(json.loads(d))) for d in expected
    ]
    assert [_compact(json.loads(data)) for data in streamed.data] == streamed.data  # upstream's
    # serialisation (compact, UTF-8 as is), as the recordings have it
    assert [_compact(json.loads(data)) for data in expected] == expected
    assert record.completed
    assert not record.disconnected
    assert record.token_ids == [t for group in delivered_groups(transcript) for t in group]


@pytest.mark.parametrize("transcript", STREAMS, ids=lambda t: t["file"])
def test_completions_frames_carry_the_same_token_groups(
    sim: SimThread, transcript: dict[str, Any]
) -> None:
    case = scenario(transcript)
    kept = transcript["stop_mode"] == "kept"
    body = {
        "model": case["request_body"]["model"],
        "prompt": case["prompt_token_ids"],
        "stream": True,
        "detokenize": False,
        "stop_token_ids": [200002, 200012],
        "include_stop_str_in_output": kept,
        "stream_options": {"include_usage": True},
    }
    headers = replay_headers(case["token_ids"], transcript["chunk_sizes"])
    if not kept:
        headers["X-Sim-Stop-Mode"] = "stripped"  # <|return|> left out of the ids too

    streamed = sim.stream("/v1/completions", body, headers)
    frames = streamed.json()
    assert streamed.data[-1] == "[DONE]"
    content, usage = frames[:-1], frames[-1]
    assert [f["choices"][0]["token_ids"] for f in content] == delivered_groups(transcript)
    assert all(f["choices"][0]["finish_reason"] is None for f in content[:-1])
    last = content[-1]["choices"][0]
    stop_reason = CALL if case["token_ids"][-1] == CALL else None
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", stop_reason)
    assert len({f["id"] for f in frames}) == 1
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == sum(map(len, delivered_groups(transcript)))
    assert usage["usage"]["prompt_tokens"] == len(case["prompt_token_ids"])


@pytest.mark.parametrize("transcript", NONSTREAMS, ids=lambda t: t["file"])
def test_nonstream_answer_is_upstreams(sim: SimThread, transcript: dict[str, Any]) -> None:
    case = scenario(transcript)
    recorded = json.loads((ORACLE / transcript["file"]).read_text())
    headers = replay_headers(case["token_ids"], stop_mode=transcript["stop_mode"])
    body = {**case["request_body"], "stream": False}

    IDS.reset()
    answer = sim.http.post("/v1/responses", json=body, headers=headers)
    assert answer.status_code == recorded["http_status"]
    assert answer.headers["content-type"] == recorded["headers"]["content-type"]
    assert answer.json()["output"] == recorded["body"]["output"]
    # Equal but for the fields where the response follows OpenAI's spec instead of upstream
    # (tests/spec_departures.py), and serialised as upstream does.
    assert normalised(answer.json()) == normalised(recorded["body"])
    assert list(normalised(answer.json())) == list(normalised(recorded["body"]))
    assert _compact(recorded["body"]).encode() == recorded["body_raw"].encode()
    assert _compact(answer.json()).encode() == answer.content


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
