"""Token logprobs in the repair core: entries per token, held with split characters.

Every case runs through `assert_well_formed(..., logprobs=True)`, which checks that a message's
delta entries add up to its done event's, part's and item's, and that their `bytes` are its
text's UTF-8, byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from proxy.harmony.response import CountingIds, ResponseContext
from proxy.harmony.stream.repair import ResponseStream
from tests.harmony import chunks_of, context, engine_outputs, ids_of
from tests.sdk import accumulate
from tests.wellformed import assert_well_formed

#: Characters o200k splits across tokens (each token a part of one), and whole ones.
SPLIT = ["🫠", "𝔘𝔫𝔦", "ཀྵ", "𒀱", "ꙮ", "👩‍👧"]
WHOLE = [" Hello", " world", ",", " é", " 中文", " “quoted”", " 😀", "\n"]

REASONING = "<|channel|>analysis<|message|>Think 🫠 about ཀྵ.<|end|>"
CALL = (
    '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": "𒀱"}'
    "<|call|>"
)


def final(text: str, *, first: bool = False) -> str:
    """A final answer; `first`: the response's first message (the prompt ends in
    `<|start|>assistant`)."""
    start = "" if first else "<|start|>assistant"
    return f"{start}<|channel|>final<|message|>{text}<|return|>"


def value_of(position: int) -> float:
    """Upstream's (stand-in) logprob of the id at `position` of the whole generation."""
    return -(position + 1) / 1024


def top_of(position: int) -> dict[str, float]:
    return {"A": value_of(position), "B": value_of(position) - 1, "C": value_of(position) - 2}


def run(
    encoding: HarmonyEncoding,
    ids: Sequence[int],
    sizes: Sequence[int],
    *,
    top: int = 2,
    finish: str = "stop",
    coalesce: bool = True,
    top_logprobs: bool = True,
) -> list[dict[str, Any]]:
    ctx = context(top_logprobs=top, coalesce_deltas=coalesce)
    stream = ResponseStream(encoding, ctx, CountingIds())
    events = stream.start()
    position = 0
    for chunk in chunks_of(ids, sizes) if ids else [[]]:
        values = [value_of(position + i) for i in range(len(chunk))]
        alternatives: list[Mapping[str, float] | None] | None = None
        if top_logprobs:
            alternatives = [top_of(position + i) for i in range(len(chunk))]
        events += stream.feed(chunk, values, alternatives)
        position += len(chunk)
    return events + stream.finish(finish, None)


def content_positions(encoding: HarmonyEncoding, ids: Sequence[int]) -> list[int]:
    """Positions of the ids inside final messages (the answer: preambles carry none)."""
    positions, inside, header = [], False, []
    for position, token in enumerate(ids):
        if token in (200007, 200002, 200012) or token == 200006:  # <|end|> <|return|> <|call|>
            inside, header = False, []
        elif token == 200008:  # <|message|>
            text = encoding.decode(header)
            inside = "final" in text and "to=" not in text
        elif inside:
            positions.append(position)
        else:
            header.append(token)
    return positions


def entries(events: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [entry for event in events if event["type"] == kind for entry in event["logprobs"]]


@st.composite
def answers(draw: st.DrawFn) -> str:
    return "".join(draw(st.lists(st.sampled_from(SPLIT + WHOLE), min_size=1, max_size=12)))


SIZES = st.one_of(
    st.just([1]), st.just([20]), st.lists(st.integers(0, 7), min_size=1, max_size=6).filter(any)
)  # uneven sizes, empty frames among them (all-empty would never end)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(answer=answers(), sizes=SIZES, coalesce=st.booleans(), preamble=st.booleans())
def test_token_bytes_are_the_text_at_any_chunking(
    encoding: HarmonyEncoding, answer: str, sizes: list[int], coalesce: bool, preamble: bool
) -> None:
    script = REASONING
    if preamble:
        script += "<|start|>assistant<|channel|>commentary<|message|>One 𒀱 moment.<|end|>"
    ids = ids_of(encoding, script + final(answer))
    events = run(encoding, ids, sizes, coalesce=coalesce)
    response = assert_well_formed(events, logprobs=True)
    # Values are upstream's for exactly the content ids of the messages, in order.
    got = entries(events, "response.output_text.done")
    assert [e["logprob"] for e in got] == [value_of(p) for p in content_positions(encoding, ids)]
    texts = [
        part["text"]
        for item in response["output"]
        if item["type"] == "message" and item["phase"] != "commentary"
        for part in item["content"]
    ]
    # Preambles carry none, as on OpenAI, in their events and in their item.
    preambles = {i["id"] for i in response["output"] if i.get("phase") == "commentary"}
    assert all(
        e["logprobs"] == [] for e in events if e.get("item_id") in preambles and "logprobs" in e
    )
    assert all(
        i["content"][0]["logprobs"] == [] for i in response["output"] if i["id"] in preambles
    )
    assert b"".join(bytes(e["bytes"]) for e in got) == "".join(texts).encode()
    # Reasoning carries none: its events have no logprobs at all.
    assert all(not e.get("logprobs") for e in events if "reasoning" in e["type"])
    parsed = accumulate(events)  # the SDK's strict models and its stream accumulator
    assert parsed is not None
    assert parsed.output_text.endswith(answer)


@pytest.mark.parametrize("sizes", [[1], [20], [3, 1, 4, 1, 5]])
def test_a_split_character_takes_its_tokens_entries_with_it(
    encoding: HarmonyEncoding, sizes: list[int]
) -> None:
    ids = ids_of(encoding, final("a🫠b", first=True))  # 🫠 is three tokens: f0 9f | ab | a0
    events = run(encoding, ids, sizes)
    assert_well_formed(events, logprobs=True)
    for delta in (e for e in events if e["type"] == "response.output_text.delta"):
        joined = b"".join(bytes(entry["bytes"]) for entry in delta["logprobs"])
        # An entry goes with the first delta that shows any of its token's bytes.
        assert joined.decode("utf-8", "replace").startswith(delta["delta"][:1]), delta
    tokens = [e["token"] for e in entries(events, "response.output_text.done")]
    # OpenAI's convention: bytes that are part of a character are written as \xNN escapes.
    assert tokens == ["a", "\\xf0\\x9f", "\\xab", "\\xa0", "b"]


def test_per_token_mode_one_delta_per_character(encoding: HarmonyEncoding) -> None:
    ids = ids_of(encoding, final("x🫠y", first=True))
    events = run(encoding, ids, [20], coalesce=False)
    assert_well_formed(events, logprobs=True)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["x", "🫠", "y"]
    assert [len(d["logprobs"]) for d in deltas] == [1, 3, 1]


def test_top_logprobs_are_upstreams_alternatives_cut_to_the_request(
    encoding: HarmonyEncoding,
) -> None:
    ids = ids_of(encoding, final("Hi", first=True))
    got = entries(run(encoding, ids, [20], top=2), "response.output_text.done")
    assert got[0]["top_logprobs"] == [
        {"token": "A", "logprob": got[0]["logprob"], "bytes": [65]},
        {"token": "B", "logprob": got[0]["logprob"] - 1, "bytes": [66]},
    ]
    none = entries(run(encoding, ids, [20], top=0), "response.output_text.done")
    assert none[0]["top_logprobs"] == []
    absent = entries(run(encoding, ids, [20], top_logprobs=False), "response.output_text.done")
    assert absent[0]["top_logprobs"] == []


def test_a_character_cut_by_the_length_limit_takes_its_unshown_tokens_away(
    encoding: HarmonyEncoding,
) -> None:
    # "ok", " \\xf0\\x9f", "\\xab" kept of "ok 🫠!": the rest and <|return|> cut by the limit.
    ids = ids_of(encoding, final("ok 🫠!", first=True))
    events = run(encoding, ids[:-3], [1], finish="length")
    response = assert_well_formed(events, logprobs=True)
    assert response["status"] == "incomplete"
    assert response["output"][0]["content"][0]["text"] == "ok "
    # The token that showed " " stays; one whose bytes never became text goes.
    tokens = ["ok", " \\xf0\\x9f"]
    assert [e["token"] for e in entries(events, "response.output_text.done")] == tokens


def test_tool_calls_and_reasoning_carry_none(encoding: HarmonyEncoding) -> None:
    ids = ids_of(encoding, REASONING + CALL)
    events = run(encoding, ids, [2])
    assert_well_formed(events, logprobs=True)
    assert not [e for e in events if e["type"].startswith("response.output_text")]
    assert all("logprobs" not in e for e in events if "function_call" in e["type"])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_malformed_output_keeps_entries_and_text_in_step(
    encoding: HarmonyEncoding, data: st.DataObject
) -> None:
    chunks = data.draw(engine_outputs(encoding))
    ids = [token for chunk in chunks for token in chunk]
    events = run(encoding, ids, [len(c) for c in chunks] or [1])
    # Random ids write bytes that are no UTF-8: their text is U+FFFD, so only the structure
    # and the agreement of deltas, done, part and item are checked.
    assert_well_formed(events, invalid_utf8=True, logprobs=True)


def test_without_the_include_nothing_is_asked_per_token(encoding: HarmonyEncoding) -> None:
    ids = ids_of(encoding, final("a🫠b", first=True))
    stream = ResponseStream(encoding, context(), CountingIds())
    events = stream.start() + stream.feed(ids) + stream.finish("stop", None)
    assert_well_formed(events)  # every logprobs list empty


def test_logprobs_missing_from_a_frame_is_the_shells_bug(encoding: HarmonyEncoding) -> None:
    stream = ResponseStream(encoding, context(top_logprobs=0), CountingIds())
    stream.start()
    with pytest.raises(ValueError, match="one logprob per token"):
        stream.feed([1, 2], None)
    with pytest.raises(ValueError, match="one logprob per token"):
        stream.feed([1, 2], [-0.1])
    with pytest.raises(ValueError, match="aligned"):
        stream.feed([1, 2], [-0.1, -0.2], [{}])


def test_context_default_is_off() -> None:
    assert ResponseContext("resp_x", 0.0, "m").top_logprobs is None
