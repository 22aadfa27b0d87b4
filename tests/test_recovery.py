"""The recovery accounting read from the core's own parse against the full model of the
unpatched upstream run beside it (a second parser per token, the reference): the same
`RepairRecord`, on every recorded scenario at every chunking and on random token streams,
malformed ones included."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from proxy.harmony.response import CountingIds
from proxy.harmony.stream.record import RepairRecord
from proxy.harmony.stream.repair import ResponseStream
from proxy.harmony.tokens import START
from tests.conftest import FIXTURES
from tests.harmony import chunks_of, context, engine_outputs, ids_of
from tests.test_core_properties import NAMESPACES, conversation

MANIFEST = json.loads((FIXTURES / "trtllm-oracle" / "manifest.json").read_text())
SCENARIOS = sorted(MANIFEST["scenarios"])
#: Every recorded stream (scenario × upstream's chunking × stop token kept or cut) …
RECORDED = [t for t in MANIFEST["transcripts"] if t["stream"]]
#: … and chunkings nobody recorded: uneven ones, empty outputs, the whole answer in one output.
SIZES = [[1], [4], [20], [1, 3, 1, 8, 2, 5, 13], [0, 2, 0, 7], [10_000]]


def _records(
    encoding: HarmonyEncoding,
    chunks: Sequence[Sequence[int]],
    finish: str,
    *,
    eager: Sequence[bool] = (True,),
) -> tuple[RepairRecord, RepairRecord, ResponseStream]:
    """(derived, full model) records for the same frames; `eager[i % len]`: account after
    frame i (as the proxy does) or leave it for `record()`."""
    records, streams = [], []
    for derive in (True, False):
        stream = ResponseStream(
            encoding, context(namespaces=NAMESPACES), CountingIds(), derive_unpatched=derive
        )
        stream.start()
        for number, chunk in enumerate(chunks):
            stream.feed(chunk)
            if eager[number % len(eager)]:
                stream.account()
        stream.finish(finish, None)
        records.append(stream.record())
        streams.append(stream)
    return records[0], records[1], streams[0]


def _scenario_ids(scenario: str, stop_mode: str) -> list[int]:
    ids = list(MANIFEST["scenarios"][scenario]["token_ids"])
    return ids[:-1] if stop_mode == "stripped" else ids


def _recorded_chunks(transcript: dict[str, Any]) -> list[list[int]]:
    """The engine outputs upstream was recorded with (as tests/test_unpatched.py feeds them)."""
    ids = MANIFEST["scenarios"][transcript["scenario"]]["token_ids"]
    chunks, position = [], 0
    for size in transcript["chunk_sizes"]:
        chunks.append(ids[position : position + size])
        position += size
    if transcript["stop_mode"] == "stripped":
        chunks[-1] = chunks[-1][:-1]
    return chunks


def _assert_same(encoding: HarmonyEncoding, chunks: list[list[int]]) -> None:
    for finish in ("stop", "length"):
        derived, full, stream = _records(encoding, chunks, finish)
        assert derived == full
        assert derived.compared
        recovery = stream.recovery
        assert recovery is not None
        assert not recovery.full_model_used  # well-formed output: one parser


@pytest.mark.parametrize("transcript", RECORDED, ids=lambda t: t["file"])
def test_every_recorded_stream(encoding: HarmonyEncoding, transcript: dict[str, Any]) -> None:
    _assert_same(encoding, _recorded_chunks(transcript))


@pytest.mark.parametrize("stop_mode", ["kept", "stripped"])
@pytest.mark.parametrize("sizes", SIZES, ids=str)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_at_other_chunkings(
    encoding: HarmonyEncoding, scenario: str, sizes: list[int], stop_mode: str
) -> None:
    _assert_same(encoding, chunks_of(_scenario_ids(scenario, stop_mode), sizes))


def test_the_recorded_bug_report_figures(encoding: HarmonyEncoding) -> None:
    # Not vacuous: at stream_interval 20 the unpatched stream lost nearly everything.
    (transcript,) = [t for t in RECORDED if t["file"] == "s1_reasoning_final/kept/N20.jsonl"]
    chunks = _recorded_chunks(transcript)
    derived, full, _ = _records(encoding, chunks, "stop")
    assert derived == full
    assert derived.items_unannounced == 1
    assert derived.unpatched_text_differs
    assert derived.recovered_chars["final"] == 69 - len(" by")


MALFORMED = {
    # what the core does not feed upstream's parser: the full model takes over from there
    "token outside a message": "<|channel|>final<|message|>Hi<|end|>stray<|start|>assistant"
    "<|channel|>final<|message|>Again<|return|>",
    "start inside content": "<|channel|>analysis<|message|>Think<|start|>assistant"
    "<|channel|>final<|message|>Answer<|return|>",
    "rejected header": "<|channel|>analysis<|message|>A<|end|><|start|>foo<|message|>x<|end|>"
    "<|start|>assistant<|channel|>final<|message|>B<|return|>",
}
#: Well-formed for the parser, but upstream's builder raises or leaves things out.
BUILDER = {
    "browser call": '<|channel|>commentary to=browser.search<|message|>{"query": "q"}<|call|>',
    "bad browser call": "<|channel|>commentary to=browser.open<|message|>[1]<|call|>",
    "unknown channel": "<|channel|>other<|message|>x<|end|><|start|>assistant<|channel|>final"
    "<|message|>Hi<|return|>",
    "unknown recipient": "<|channel|>commentary to=container.exec<|message|>ls<|call|>",
    "another author": "<|channel|>final<|message|>Hi<|end|><|start|>user<|channel|>final"
    "<|message|>Me<|end|><|start|>assistant<|channel|>final<|message|>Bye<|return|>",
    "cut inside a header": "<|channel|>final<|message|>Hi<|end|><|start|>assistant<|channel|>fi",
    # openai-harmony's parser takes over from the core's at the user header; the ids it took
    # count when upstream's builder parses them again at the end
    "another author, then a browser call": "<|channel|>final<|message|>Hi<|end|><|start|>user"
    "<|message|>Me<|end|><|start|>assistant<|channel|>commentary to=browser.search<|message|>"
    '{"query": "q"}<|call|>',
    "nothing at all": "",
}


@pytest.mark.parametrize("sizes", [[1], [3], [20]], ids=str)
@pytest.mark.parametrize("name", sorted(MALFORMED) + sorted(BUILDER))
def test_malformed_and_unusual_output(
    encoding: HarmonyEncoding, name: str, sizes: list[int]
) -> None:
    text = MALFORMED.get(name, BUILDER.get(name, ""))
    chunks = chunks_of(ids_of(encoding, text), sizes) or [[]]
    for finish in ("stop", "length"):
        derived, full, stream = _records(encoding, chunks, finish)
        assert derived == full
        recovery = stream.recovery
        assert recovery is not None
        assert recovery.full_model_used == (name in MALFORMED)


def test_an_id_outside_u32(encoding: HarmonyEncoding) -> None:
    chunks = [ids_of(encoding, "<|channel|>final<|message|>Hi"), [2**40], [START]]
    derived, full, _ = _records(encoding, chunks, "stop")
    assert derived == full
    assert derived.malformed["invalid_token_id"] == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    finish=st.sampled_from(["stop", "length", "cancelled"]),
    eager=st.lists(st.booleans(), min_size=1, max_size=4),
)
def test_random_token_streams(
    encoding: HarmonyEncoding, data: st.DataObject, finish: str, eager: list[bool]
) -> None:
    """Any ids, special tokens anywhere, any chunking, accounted after any frames."""
    outputs = data.draw(engine_outputs(encoding))
    derived, full, _ = _records(encoding, outputs, finish, eager=eager)
    assert derived == full, outputs


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conv=conversation(),
    sizes=st.lists(st.integers(0, 25), min_size=1, max_size=8).filter(any),
    cut=st.integers(0, 400) | st.none(),
)
def test_well_formed_conversations_need_one_parser(
    encoding: HarmonyEncoding, conv: tuple[str, list[Any]], sizes: list[int], cut: int | None
) -> None:
    ids = ids_of(encoding, conv[0])[:cut]
    derived, full, stream = _records(encoding, chunks_of(ids, sizes), "length" if cut else "stop")
    assert derived == full
    recovery = stream.recovery
    assert recovery is not None
    assert not recovery.full_model_used
