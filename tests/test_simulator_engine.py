"""The simulated engine: stop rules and finish reasons, output grouping, pacing, splitting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.harmony.tokens import CALL, END, RETURN
from proxy.simulator.engine import (
    EngineOutput,
    Generation,
    Grouping,
    Pacing,
    Sampling,
    generate,
    group,
    split_at,
)

TEXT = [10, 11, 12, 13, 14]
STOPS = frozenset({RETURN, CALL})


def _gen(
    ids: list[int], sampling: Sampling, *, keep_return: bool = True, limit: int = 1000
) -> Generation:
    return generate(iter(ids), sampling, limit=limit, return_in_ids=keep_return)


def test_end_id_stops_with_null_stop_reason_kept_or_not() -> None:
    ids = [*TEXT, RETURN, 99]
    kept = _gen(ids, Sampling(stop_token_ids=STOPS), keep_return=True)
    assert (kept.finish_reason, kept.stop_reason, kept.token_ids) == ("stop", None, (*TEXT, RETURN))
    stripped = _gen(ids, Sampling(stop_token_ids=STOPS), keep_return=False)
    assert (stripped.finish_reason, stripped.stop_reason) == ("stop", None)
    assert stripped.token_ids == tuple(TEXT)
    assert stripped.raw_ids == (*TEXT, RETURN)  # generated, then left out


def test_stop_token_ids_set_stop_reason_and_are_cut_unless_included() -> None:
    ids = [*TEXT, CALL, 99]
    cut = _gen(ids, Sampling(stop_token_ids=STOPS))
    assert (cut.finish_reason, cut.stop_reason, cut.token_ids) == ("stop", CALL, tuple(TEXT))
    kept = _gen(ids, Sampling(stop_token_ids=STOPS, include_stop_str_in_output=True))
    assert kept.token_ids == (*TEXT, CALL)


def test_without_the_call_stop_token_generation_goes_on() -> None:
    ids = [*TEXT, CALL, 20, 21, RETURN]
    result = _gen(ids, Sampling(stop_token_ids=frozenset({RETURN})))
    assert result.token_ids == tuple(ids)
    assert (result.finish_reason, result.stop_reason) == ("stop", None)


def test_ignore_eos_and_length() -> None:
    ids = [*TEXT, RETURN, 20, 21, 22]
    result = _gen(ids, Sampling(max_tokens=7, ignore_eos=True))
    assert (result.finish_reason, result.token_ids) == ("length", (*TEXT, RETURN, 20))
    result = _gen(ids, Sampling(max_tokens=3))
    assert (result.finish_reason, result.stop_reason, result.token_ids) == (
        "length",
        None,
        (10, 11, 12),
    )
    # A stop token that is also the last allowed token is a stop.
    result = _gen(ids, Sampling(max_tokens=6))
    assert result.finish_reason == "stop"
    # Without max_tokens, max_seq_len minus the prompt is the limit.
    assert _gen(ids, Sampling(), limit=2).finish_reason == "length"


def test_replay_running_out_ends_like_a_stripped_end_id() -> None:
    result = _gen(TEXT, Sampling(stop_token_ids=STOPS))
    assert (result.finish_reason, result.stop_reason, result.token_ids) == (
        "stop",
        None,
        tuple(TEXT),
    )


def _sizes(outputs: list[EngineOutput]) -> list[int]:
    return [len(output.token_ids) for output in outputs]


def test_first_output_one_token_then_stream_interval_then_the_rest() -> None:
    generation = _gen(list(range(43)), Sampling())
    outputs = group(generation, Grouping(stream_interval=20), Pacing())
    assert _sizes(outputs) == [1, 20, 20, 2]
    assert [o.finish_reason for o in outputs] == [None, None, None, "stop"]
    assert [t for o in outputs for t in o.token_ids] == list(range(43))


def test_cut_stop_token_leaves_the_last_output_shorter_or_empty() -> None:
    generation = _gen([*TEXT, END, CALL], Sampling(stop_token_ids=STOPS))
    outputs = group(generation, Grouping(stream_interval=3), Pacing())
    assert [o.token_ids for o in outputs] == [(10,), (11, 12, 13), (14, END)]
    assert (outputs[-1].finish_reason, outputs[-1].stop_reason) == ("stop", CALL)
    one_each = group(generation, Grouping(stream_interval=1), Pacing())
    assert one_each[-1].token_ids == ()
    assert len(one_each) == 7


def test_explicit_sizes_with_empty_outputs_then_the_usual_grouping() -> None:
    generation = _gen([*TEXT, RETURN], Sampling(stop_token_ids=STOPS))
    outputs = group(generation, Grouping(stream_interval=2, sizes=(2, 0, 1)), Pacing())
    assert _sizes(outputs) == [2, 0, 1, 2, 1]
    trailing = group(generation, Grouping(sizes=(3, 3, 0, 0, 5)), Pacing())
    assert _sizes(trailing) == [3, 3, 0, 0]  # zeros right after the last id, then nothing
    assert trailing[-1].finish_reason == "stop"
    short = group(generation, Grouping(sizes=(10,)), Pacing())
    assert _sizes(short) == [6]


def test_empty_generation_is_one_empty_output_with_the_finish() -> None:
    generation = _gen([RETURN], Sampling(), keep_return=False)
    (output,) = group(generation, Grouping(), Pacing())
    assert (output.token_ids, output.finish_reason) == ((), "stop")
    (output,) = group(_gen([], Sampling(max_tokens=0)), Grouping(), Pacing())
    assert (output.token_ids, output.finish_reason) == ((), "length")


def test_uneven_outputs_are_speculative_like_and_seeded() -> None:
    generation = _gen(list(range(500)), Sampling())
    grouping = Grouping(stream_interval=2, uneven=True, draft_tokens=3, seed=7)
    sizes = _sizes(group(generation, grouping, Pacing()))
    assert sizes[0] == 1
    assert all(2 <= size <= 8 for size in sizes[1:-1])
    assert len(set(sizes[1:-1])) > 3
    assert sizes == _sizes(group(generation, grouping, Pacing()))
    other = Grouping(stream_interval=2, uneven=True, draft_tokens=3, seed=8)
    assert sizes != _sizes(group(generation, other, Pacing()))


def test_pacing() -> None:
    generation = _gen(list(range(10)), Sampling())
    outputs = group(generation, Grouping(stream_interval=4, sizes=(1, 0)), Pacing(0.5, 0.01))
    assert [round(o.delay, 6) for o in outputs] == [0.5, 0.01, 0.04, 0.04, 0.01]


def test_split_at_keeps_ids_finish_and_time() -> None:
    generation = _gen(list(range(43)), Sampling())
    outputs = group(generation, Grouping(stream_interval=20), Pacing(0.1, 0.01))
    split = split_at(outputs, [0, 5, 21, 40, 99])
    assert _sizes(split) == [1, 4, 16, 19, 1, 2]
    assert [t for o in split for t in o.token_ids] == list(range(43))
    assert [o.finish_reason for o in split][-1] == "stop"
    assert all(o.finish_reason is None for o in split[:-1])
    assert sum(o.delay for o in split) == pytest.approx(sum(o.delay for o in outputs))


@given(
    ids=st.lists(st.integers(0, 1000), max_size=60),
    stop=st.sampled_from([RETURN, CALL, None]),
    sizes=st.lists(st.integers(0, 5), max_size=8),
    interval=st.integers(1, 7),
    uneven=st.booleans(),
    keep=st.booleans(),
    cuts=st.lists(st.integers(0, 70), max_size=4),
)
def test_outputs_always_deliver_exactly_the_generation(
    ids: list[int],
    stop: int | None,
    sizes: list[int],
    interval: int,
    uneven: bool,
    keep: bool,
    cuts: list[int],
) -> None:
    source = ids if stop is None else [*ids, stop, 7]
    generation = _gen(
        source, Sampling(stop_token_ids=STOPS, include_stop_str_in_output=keep), keep_return=keep
    )
    grouping = Grouping(stream_interval=interval, uneven=uneven, sizes=tuple(sizes))
    outputs = split_at(group(generation, grouping, Pacing(0.1, 0.01)), cuts)
    assert [t for o in outputs for t in o.token_ids] == list(generation.token_ids)
    assert outputs[-1].finish_reason == generation.finish_reason
    assert all(o.finish_reason is None for o in outputs[:-1])
    delivered = 0
    boundaries = {0}
    for output in outputs:
        delivered += len(output.token_ids)
        boundaries.add(delivered)
    assert {c for c in cuts if c <= len(generation.raw_ids) - generation.cut_last} <= boundaries
