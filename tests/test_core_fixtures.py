"""The repaired stream against upstream's recorded ground truth, every scenario, N and stop mode.

Its final output says what upstream's correct non-streaming response says for the same tokens
(ids, statuses and upstream's Python-named keys aside), plus the preambles upstream drops.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from tests.conftest import FIXTURES
from tests.harmony import context, run, semantic
from tests.sdk import accumulate
from tests.wellformed import assert_well_formed

ORACLE = FIXTURES / "trtllm-oracle"
MANIFEST = json.loads((ORACLE / "manifest.json").read_text())
STREAMS = [t for t in MANIFEST["transcripts"] if t.get("stream") and "chunk_sizes" in t]


def _chunks(transcript: dict[str, Any]) -> list[list[int]]:
    scenario = MANIFEST["scenarios"][transcript["scenario"]]
    ids = list(scenario["token_ids"])
    chunks, position = [], 0
    for size in transcript["chunk_sizes"]:
        chunks.append(ids[position : position + size])
        position += size
    assert position == len(ids), transcript["file"]
    if transcript["stop_mode"] == "stripped":
        chunks[-1] = chunks[-1][:-1]  # upstream cut the stop token from the last output
    return chunks


@pytest.mark.parametrize("transcript", STREAMS, ids=lambda t: t["file"])
def test_repaired_output_matches_upstream_nonstream(
    encoding: HarmonyEncoding, transcript: dict[str, Any]
) -> None:
    scenario = MANIFEST["scenarios"][transcript["scenario"]]
    ctx = context(input_tokens=len(scenario["prompt_token_ids"]))
    events, stream = run(encoding, _chunks(transcript), ctx=ctx)
    response = assert_well_formed(events)
    nonstream = json.loads(
        (ORACLE / transcript["scenario"] / transcript["stop_mode"] / "nonstream.json").read_text()
    )["body"]
    ours = semantic(response["output"])
    preambles = [
        item
        for item in response["output"]
        if item["type"] == "message" and item["phase"] == "commentary"
    ]
    without_preambles = semantic([i for i in response["output"] if i not in preambles])
    assert without_preambles == semantic(nonstream["output"])
    if transcript["scenario"] == "s5_reasoning_preamble_final":
        # kept, unlike upstream (which drops preambles): a message of its own, in order
        assert ours[1] == ("message", "assistant", "Let me check the tracking system for you.")
    usage = response["usage"]
    assert usage["input_tokens"] == len(scenario["prompt_token_ids"])
    stripped = transcript["stop_mode"] == "stripped"
    assert usage["output_tokens"] == sum(transcript["chunk_sizes"]) - stripped
    assert stream.record().malformed == {}
    accumulated = accumulate(events)
    assert accumulated is not None
    assert [item.type for item in accumulated.output] == [
        item["type"] for item in response["output"]
    ]
