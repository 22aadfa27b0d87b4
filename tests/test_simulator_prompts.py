"""The simulator's `/v1/responses` against upstream's recorded request handling
(`tests/fixtures/trtllm-prompts/`): the same status for every case, and for accepted ones the
same prompt ids and the same response body apart from the generated output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from tests.conftest import FIXTURES
from tests.simulator_helpers import FAST, SimThread
from tests.spec_departures import normalised

PROMPTS = FIXTURES / "trtllm-prompts"
CASES = [
    json.loads(path.read_text())
    for path in sorted(PROMPTS.glob("d*.json"))
    if not path.name.endswith(".expected_fixed.json")
]
SINGLE = [case for case in CASES if "steps" not in case]
GENERATED = ("id", "output", "created_at")


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST, clock=lambda: 1767225600.0) as running:
        yield running


@pytest.mark.parametrize("case", SINGLE, ids=lambda case: case["name"])
def test_status_prompt_and_echo_are_upstreams(sim: SimThread, case: dict[str, Any]) -> None:
    body = (
        {**case["request_body"], "stream": False}
        if isinstance(case["request_body"], dict)
        else case["request_body"]
    )
    answer = sim.http.post("/v1/responses", json=body)
    assert answer.status_code == case["http_status"], answer.text
    if case["http_status"] != 200:
        expected = case["response_body"]
        if isinstance(expected, dict) and "message" in expected:  # upstream's ErrorResponse
            assert answer.json() == expected
        return
    assert list(sim.last.prompt_ids) == case["prompt_token_ids"]
    # Equal but for the fields where the response follows OpenAI's spec instead of upstream
    # (tests/spec_departures.py).
    ours, theirs = normalised(answer.json()), normalised(case["response_body"])
    assert list(ours) == list(theirs)
    assert {k: v for k, v in ours.items() if k not in GENERATED} == {
        k: v for k, v in theirs.items() if k not in GENERATED
    }
