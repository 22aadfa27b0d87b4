"""The independent self-check catches streams whose deltas do not add up to what was closed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.server.selfcheck import SelfCheck
from tests.harmony import chunks_of, ids_of, run

TEXT = (
    "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>'
)


@pytest.fixture
def events(encoding: HarmonyEncoding) -> list[dict[str, Any]]:
    return run(encoding, chunks_of(ids_of(encoding, TEXT), [2]))[0]


def wire(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events as a client receives them: no shared objects between events."""
    return [orjson.loads(orjson.dumps(event)) for event in events]


def check(events: list[dict[str, Any]]) -> str | None:
    selfcheck = SelfCheck()
    for event in events:
        selfcheck.observe([event])
    return selfcheck.problem


def test_a_correct_stream_passes(events: list[dict[str, Any]]) -> None:
    assert check(events) is None


def test_a_lost_delta_is_caught(events: list[dict[str, Any]]) -> None:
    index = next(i for i, e in enumerate(events) if e["type"].endswith(".delta"))
    assert check(events[:index] + events[index + 1 :]) == (
        "response.reasoning_text.done text differs from its deltas"
    )


def test_changed_done_item_and_snapshot_are_caught(events: list[dict[str, Any]]) -> None:
    tampered = wire(events)
    done = next(e for e in tampered if e["type"] == "response.output_item.done")
    done["item"]["content"][0]["text"] = "other"
    assert check(tampered) == "output_item.done text differs from its deltas"
    tampered = wire(events)
    tampered[-1]["response"]["output"][1]["arguments"] = "{}"
    assert check(tampered) == "terminal snapshot text differs from the done item"
    tampered = wire(events)
    tampered[-1]["response"]["output"].pop()
    assert check(tampered) == "terminal snapshot items differ from the done items"
