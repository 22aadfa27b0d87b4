"""`top_logprobs` are the N most likely tokens, most likely first, whatever upstream's layout.

trtllm-serve's completions list, per token, the sampled token first and then its top K (K + 1
keys when the sampled token is not among the K best), keyed by decoded string (ids that decode
alike share a key: the last value wins, the first place stays). A proxy that keeps that order
and cuts at N puts a less likely sampled token first and, when the sampled token is not among
the N best, drops the N-th best for it. These tests build that layout — and shuffled, longer,
tied and collapsed ones — and hold the core's output to the N best; the simulator must send the
same layout so the live tests (test_logprobs_live.py) see it too.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.stream.logprobs import Logprobs, best
from proxy.harmony.stream.parser import TokenTable
from proxy.simulator.completion_frames import (
    CompletionWriter,
    ranked,
    safe_decode,
    sampled_rank,
    token_logprob,
)
from proxy.simulator.completion_request import read_completion_request
from proxy.simulator.engine import EngineOutput
from proxy.upstream.completions import parse_frame

#: Few strings and few values, so that equal strings (collapsed keys) and ties are common.
STRINGS = st.sampled_from(["a", " b", "c", "\ufffd", "é", " the", "!"])
VALUES = st.sampled_from([0.0, -0.25, -0.5, -1.0, -1.0, -2.5, -7.0, -9999.0])


def upstream_dict(distribution: list[tuple[str, float]], sampled: int, k: int) -> dict[str, float]:
    """trtllm-serve's `top_logprobs` dict: the sampled entry, then the k best (module doc)."""
    # A dict built from that list: equal strings share the first place, the last value.
    return dict([distribution[sampled], *distribution[:k]])


@st.composite
def layouts(draw: st.DrawFn) -> tuple[dict[str, float], int, list[tuple[str, float]], int]:
    """(upstream's dict, N asked, the distribution best first, the sampled index)."""
    n = draw(st.integers(0, 20))
    values = sorted(draw(st.lists(VALUES, min_size=1, max_size=30)), reverse=True)
    distribution = [(draw(STRINGS), value) for value in values]
    sampled = draw(st.integers(0, len(distribution) - 1))
    top = upstream_dict(distribution, sampled, max(1, n))  # what the proxy asks: max(1, N)
    return top, n, distribution, sampled


def held_to_the_n_best(top: dict[str, float], n: int, out: list[tuple[str, float]]) -> None:
    values = [value for _, value in out]
    assert values == sorted(values, reverse=True)  # most likely first
    assert len(out) == min(n, len(top))  # N, or all there are
    assert len({string for string, _ in out}) == len(out)
    assert all(top[string] == value for string, value in out)  # upstream's own pairs
    # Exactly the N best: nothing left out is more likely than anything kept.
    left_out = [value for string, value in top.items() if string not in dict(out)]
    assert not left_out or not values or max(left_out) <= min(values)
    assert Counter(values) == Counter(sorted(top.values(), reverse=True)[:n])


@settings(max_examples=400, deadline=None)
@given(layout=layouts(), seed=st.integers(0, 2**32 - 1), extra=st.lists(VALUES, max_size=5))
def test_best_is_the_n_most_likely_for_every_layout(
    layout: tuple[dict[str, float], int, list[tuple[str, float]], int],
    seed: int,
    extra: list[float],
) -> None:
    top, n, distribution, _ = layout
    held_to_the_n_best(top, n, best(top, n))
    # Whatever order upstream sends, however many entries.
    longer = {**top, **{f"x{i}": value for i, value in enumerate(extra)}}
    shuffled = list(longer.items())
    random.Random(seed).shuffle(shuffled)
    held_to_the_n_best(dict(shuffled), n, best(dict(shuffled), n))
    # Without equal strings the N kept are the distribution's N best, best first (ties aside).
    strings = [string for string, _ in distribution[: max(1, n)]]
    if len(set(strings)) == len(strings):
        kept = [value for _, value in best(top, n)]
        assert kept == [value for _, value in distribution[:n]]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(layout=layouts())
def test_entries_carry_the_n_best_and_the_sampled_value(
    encoding: HarmonyEncoding,
    layout: tuple[dict[str, float], int, list[tuple[str, float]], int],
) -> None:
    top, n, distribution, sampled = layout
    logprobs = Logprobs(TokenTable(encoding), n)
    entry = logprobs.entry(15339, distribution[sampled][1], top)
    assert entry["logprob"] == distribution[sampled][1]  # the sampled token's own value
    out = [(alt["token"], alt["logprob"]) for alt in entry["top_logprobs"]]
    held_to_the_n_best(top, n, out)
    assert all(bytes(alt["bytes"]) == alt["token"].encode() for alt in entry["top_logprobs"])


def test_a_sampled_token_outside_the_n_best_gives_way_to_the_n_th_best() -> None:
    # Upstream asked for 2: the sampled " b" (4th best) first, then the two best: 3 keys.
    top = {" b": -3.0, "a": -0.1, "c": -0.9}
    assert best(top, 2) == [("a", -0.1), ("c", -0.9)]
    # Sampled second best: listed first, and once only.
    assert best({"c": -0.9, "a": -0.1}, 2) == [("a", -0.1), ("c", -0.9)]
    assert best({"c": -0.9, "a": -0.1}, 0) == []
    # Equal logprobs keep upstream's order.
    assert best({"z": -1.0, "y": -1.0, "x": -0.5}, 2) == [("x", -0.5), ("z", -1.0)]


# -- the simulator sends upstream's layout -------------------------------------------------------


def _frame(encoding: HarmonyEncoding, ids: list[int], k: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "prompt": [1], "stream": True, "detokenize": False}
    body["logprobs"] = k
    writer = CompletionWriter(
        encoding,
        read_completion_request(body),
        engine_id=0,
        created=0,
        prompt_tokens=1,
        prompt_text=None,
    )
    data: dict[str, Any] = orjson.loads(writer.chunk(EngineOutput(tuple(ids)))[6:-2])
    return data


def test_the_simulator_lists_the_sampled_token_first_then_the_k_best(
    encoding: HarmonyEncoding,
) -> None:
    ids = list(encoding.encode("The quick brown fox jumps over the lazy dog, café 🫠 東京."))
    k = 2
    logprobs = _frame(encoding, ids, k)["choices"][0]["logprobs"]
    outside = inside_not_first = 0
    for token, value, top in zip(
        ids, logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        sampled = safe_decode(encoding, [token])
        assert value == token_logprob(token)
        assert next(iter(top)) == sampled  # the sampled token's string is the first key
        best_ids = ranked(token, k)
        strings = [safe_decode(encoding, [other]) for other, _ in best_ids]
        expected = {sampled: value}
        expected.update(zip(strings, (v for _, v in best_ids), strict=True))
        assert top == expected
        assert list(top) == list(expected)
        if len(set(strings) | {sampled}) == k + 1:
            assert len(top) == k + 1  # the sampled token outside the k best: an extra key
            outside += 1
        elif sampled_rank(token) > 0 and len(set(strings)) == k:
            assert len(top) == k
            inside_not_first += 1
    # The text samples both cases, so a proxy trusting the order fails on it.
    assert outside
    assert inside_not_first


def test_what_the_proxy_asks_of_upstream_carries_the_n_best(encoding: HarmonyEncoding) -> None:
    """`logprobs: N` is enough: the N best are there even when the sampled token is not one
    of them; the proxy asks N (1 for `top_logprobs: 0`, for the token's own value)."""
    include = ["message.output_text.logprobs"]
    for n, asked in ((0, 1), (1, 1), (3, 3), (20, 20)):
        body = {"model": "m", "input": "Hi", "include": include, "top_logprobs": n}
        assert prepare_request(body, encoding).completion_body["logprobs"] == asked
    ids = list(encoding.encode("Paris is the capital of France."))
    for n in (1, 3, 20):
        payload = orjson.dumps(_frame(encoding, ids, n)).decode()
        frame = parse_frame(payload, logprobs=True)
        assert frame.top_logprobs is not None
        for token, top in zip(ids, frame.top_logprobs, strict=True):
            assert top is not None
            truth = [(safe_decode(encoding, [other]), v) for other, v in ranked(token, n)]
            if len({string for string, _ in truth}) == n:  # no two of the best decode alike
                assert best(top, n) == truth
