"""What the repair recovered, measured against the model of the unpatched upstream."""

from __future__ import annotations

import json

import pytest
from openai_harmony import HarmonyEncoding

from tests.conftest import FIXTURES
from tests.harmony import chunks_of, run

MANIFEST = json.loads((FIXTURES / "trtllm-oracle" / "manifest.json").read_text())


def ids(scenario: str) -> list[int]:
    return list(MANIFEST["scenarios"][scenario]["token_ids"])


def n20_chunks(scenario: str) -> list[list[int]]:
    (transcript,) = [
        t for t in MANIFEST["transcripts"] if t["file"] == f"{scenario}/kept/N20.jsonl"
    ]
    tokens, chunks = ids(scenario), []
    for size in transcript["chunk_sizes"]:
        chunks.append(tokens[:size])
        tokens = tokens[size:]
    return chunks


def test_bug_report_at_n20_everything_but_two_deltas_recovered(encoding: HarmonyEncoding) -> None:
    # The published report: at stream_interval 20 the client saw reasoning "." and text " by".
    check = MANIFEST["published_bug_report_check"]["20"]
    _, stream = run(encoding, n20_chunks("s1_reasoning_final"))
    record = stream.record()
    assert record.compared
    assert record.chars == {"reasoning": 73, "final": 69}
    assert record.recovered_chars["reasoning"] == 73 - len(check["reasoning"])
    assert record.recovered_chars["final"] == 69 - len(check["text"])
    assert record.recovered_tokens["reasoning"] == record.content_tokens["reasoning"] - 1
    assert record.unpatched_text_differs
    assert record.items_unannounced == 1  # the answer was never announced
    assert record.repaired
    assert record.recovered_events["response.output_text.delta"] == 16 - 1


def test_one_token_per_frame_loses_no_text_but_still_events(encoding: HarmonyEncoding) -> None:
    _, stream = run(encoding, chunks_of(ids("s1_reasoning_final"), [1]))
    record = stream.record()
    assert record.recovered_chars == {"reasoning": 0, "final": 0, "commentary": 0, "tool_call": 0}
    assert not record.unpatched_text_differs
    assert record.items_unannounced == 0
    # upstream never closes the reasoning part
    assert record.recovered_events["response.content_part.done"] == 1
    assert record.repaired


def test_stop_token_cut_leaves_the_unpatched_answer_unclosed(encoding: HarmonyEncoding) -> None:
    # upstream never calls process_eos: without <|return|> its answer gets no done events
    tokens = ids("s1_reasoning_final")[:-1]
    _, stream = run(encoding, chunks_of(tokens, [1]))
    record = stream.record()
    assert record.items_unclosed == 1
    assert record.items_unannounced == 0


def test_function_call_and_preamble_are_recovered(encoding: HarmonyEncoding) -> None:
    _, stream = run(encoding, chunks_of(ids("s2_reasoning_function_call"), [1]))
    record = stream.record()
    arguments = '{"location":"Paris"}'
    assert record.recovered_chars["tool_call"] == len(arguments)
    assert (
        record.recovered_events["response.function_call_arguments.delta"]
        == (record.content_tokens["tool_call"])
    )
    assert record.recovered_events["response.function_call_arguments.done"] == 1
    _, stream = run(encoding, chunks_of(ids("s5_reasoning_preamble_final"), [1]))
    record = stream.record()
    assert record.recovered_chars["commentary"] == len("Let me check the tracking system for you.")


@pytest.mark.parametrize("sizes", [[1], [3], [20], [1, 3, 1, 8, 2, 5, 13]])
def test_recovery_never_negative_and_consistent(
    encoding: HarmonyEncoding, sizes: list[int]
) -> None:
    for scenario in MANIFEST["scenarios"]:
        _, stream = run(encoding, chunks_of(ids(scenario), sizes))
        record = stream.record()
        assert all(v >= 0 for v in record.recovered_events.values())
        for channel, chars in record.recovered_chars.items():
            assert 0 <= chars <= record.chars.get(channel, 0)
        assert record.output_tokens == len(ids(scenario))
        assert sum(record.tokens.values()) == len(ids(scenario))


def test_comparison_can_be_switched_off(encoding: HarmonyEncoding) -> None:
    _, stream = run(encoding, [ids("s1_reasoning_final")], compare_unpatched=False)
    record = stream.record()
    assert not record.compared
    assert record.recovered_events == {}
    assert not record.repaired


def test_accounting_after_every_frame_or_only_at_the_end_agrees(encoding: HarmonyEncoding) -> None:
    from proxy.harmony.response import CountingIds
    from proxy.harmony.stream.repair import ResponseStream
    from tests.harmony import context

    chunks = chunks_of(ids("s5_reasoning_preamble_final"), [3])
    records = []
    for eager in (True, False):
        stream = ResponseStream(encoding, context(), CountingIds())
        stream.start()
        for chunk in chunks:
            stream.feed(chunk)
            if eager:
                stream.account()
        stream.finish("stop")
        records.append(stream.record())
    assert records[0] == records[1]
    assert records[0].recovered_chars["commentary"] > 0
