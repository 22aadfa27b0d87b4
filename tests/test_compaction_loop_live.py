"""Compaction over a long run of turns, on a real server: with long user messages and a low
`compact_threshold`, what a compaction keeps verbatim is bounded, so a summarisation pass runs
only once the turns since the last compaction pass the threshold — not on every request — and
the rendered prompt stays bounded however long the run."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.request import compaction
from tests.stateful_support import MODEL, Stack, stack

KEY = ("k1", b"7" * 32)
THRESHOLD = 1000
TURNS = 12


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding) -> Iterator[Stack]:
    with stack(encoding, None, reasoning_keys=(KEY,)) as running:
        yield running


def _ask(turn: int) -> str:
    """A long user message (~1,600 bytes, ~400 tokens): three pass the threshold."""
    return " ".join(f"turn {turn} requirement {n}: keep the café log in UTC." for n in range(40))


def _turn(live: Stack, history: list[Any]) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "input": history,
        "store": False,
        "context_management": [{"type": "compaction", "compact_threshold": THRESHOLD}],
    }
    answer = httpx.post(live.base_url + "/responses", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()
    return response


def _passes(live: Stack) -> float:
    return live.metric("proxy_compactions_total", trigger="threshold", outcome="ok")


def test_a_long_run_compacts_now_and_then_and_its_prompt_stays_bounded(live: Stack) -> None:
    assert len(_ask(0).encode()) > 1500
    history: list[Any] = []
    compacted: list[bool] = []
    prompts: list[int] = []
    for turn in range(TURNS):
        history.append({"role": "user", "content": _ask(turn)})
        before = _passes(live)
        response = _turn(live, history)
        kinds = [item["type"] for item in response["output"]]
        compacted.append(kinds[0] == "compaction")
        assert _passes(live) == before + compacted[-1]
        prompts.append(response["usage"]["input_tokens"])
        # The client keeps what it would send back (reasoning is not sent back unstored).
        history += [item for item in response["output"] if item["type"] != "reasoning"]
    # Not on every request: each compaction is followed by turns answered from it.
    assert 2 <= sum(compacted) <= TURNS // 2, compacted
    assert not any(a and b for a, b in itertools.pairwise(compacted)), compacted
    # Bounded: the newest user message (kept), the summary, and under a threshold of new turns.
    assert max(prompts) < 2 * THRESHOLD, prompts
    assert max(prompts[TURNS // 2 :]) <= max(prompts[: TURNS // 2]) + 200, prompts
    # What the last compaction keeps: the newest user message alone (the budget is 1,000 bytes).
    last = next(item for item in reversed(history) if item["type"] == "compaction")
    keys = live.app.state.services.deps.reasoning_keys
    opened = compaction.open_sealed(keys, last["encrypted_content"], "input")
    assert len(opened.users) == 1
