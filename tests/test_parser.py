"""`HarmonyParser` against openai-harmony's `StreamableParser`: token by token, the same
acceptance and the same answers, on well-formed conversations and on any ids at all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding, Role, StreamableParser

from proxy.harmony.stream.parser import HarmonyParser, TokenTable
from proxy.harmony.tokens import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START
from tests.harmony import engine_outputs, ids_of
from tests.test_core_properties import conversation


@pytest.fixture(scope="module")
def table(encoding: HarmonyEncoding) -> TokenTable:
    return TokenTable(encoding)


def _outcome(call: Callable[[], object]) -> str | None:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__
    return None


def _answers(parser: Any) -> tuple[Any, ...]:
    return (
        parser.last_content_delta,
        parser.current_role,
        parser.current_channel,
        parser.current_recipient,
    )


def compare(
    encoding: HarmonyEncoding, table: TokenTable, ids: Sequence[int], *, runs: bool
) -> HarmonyParser:
    """Feed `ids` to both, one by one (`runs`: content runs through `text()`, as the core
    does); assert the same outcome and answers after every step. Returns ours."""
    ours = HarmonyParser(encoding, table)
    reference = StreamableParser(encoding, Role.ASSISTANT)
    position = 0
    while position < len(ids):
        if runs:
            deltas: list[str] = []
            stop = ours.text(ids, position, deltas)
            expected = []
            for token in ids[position:stop]:
                reference.process(token)
                if reference.last_content_delta:
                    expected.append(reference.last_content_delta)
            assert deltas == expected, (ids, position, stop)
            assert _answers(ours) == _answers(reference), (ids, stop)
            position = stop
            if position == len(ids):
                break
        token = ids[position]
        theirs = _outcome(lambda: reference.process(token))  # noqa: B023 - called at once
        assert _outcome(lambda: ours.process(token)) == theirs, (ids, position)  # noqa: B023
        assert _answers(ours) == _answers(reference), (ids, position)
        position += 1
    return ours


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversation(), cut=st.integers(0, 400) | st.none(), runs=st.booleans())
def test_well_formed_conversations_stay_on_the_fast_path(
    encoding: HarmonyEncoding,
    table: TokenTable,
    conv: tuple[str, list[Any]],
    cut: int | None,
    runs: bool,
) -> None:
    ours = compare(encoding, table, ids_of(encoding, conv[0])[:cut], runs=runs)
    assert not ours.delegated


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), runs=st.booleans())
def test_malformed_output(
    encoding: HarmonyEncoding, table: TokenTable, data: st.DataObject, runs: bool
) -> None:
    outputs = data.draw(engine_outputs(encoding))
    compare(encoding, table, [token for output in outputs for token in output], runs=runs)


# Tokens of any kind: single bytes (no UTF-8 on their own), specials, ids outside the
# vocabulary or outside u32, and a header's pieces.
ANY_ID = st.one_of(
    st.integers(0, 255),
    st.sampled_from([START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN, 200013, 201100]),
    st.integers(0, 201_100),
    st.integers(-(2**40), 2**40),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ids=st.lists(ANY_ID, max_size=40), opened=st.booleans(), runs=st.booleans())
def test_any_ids(
    encoding: HarmonyEncoding, table: TokenTable, ids: list[int], opened: bool, runs: bool
) -> None:
    prefix = ids_of(encoding, "<|channel|>final<|message|>") if opened else []
    compare(encoding, table, prefix + ids, runs=runs)


HEADER_PIECES = [
    "assistant",
    "user",
    "tool",
    "system",
    "foo",
    "<|channel|>analysis",
    "<|channel|>final",
    "<|channel|>commentary",
    "<|channel|>",
    " to=functions.get_weather",
    "to=browser.search",
    " <|constrain|>json",
    "<|constrain|>json",
    " json",
    "  ",
    " x y",
    "functions.f",
    "é",
    "\t",
    "<|start|>",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=st.lists(st.sampled_from(HEADER_PIECES), max_size=5),
    second=st.lists(st.sampled_from(HEADER_PIECES), max_size=5),
)
def test_headers(
    encoding: HarmonyEncoding, table: TokenTable, first: list[str], second: list[str]
) -> None:
    """The first header (the role is given) and a later one (it must be written)."""
    text = "".join(first) + "<|message|>Hi<|end|><|start|>" + "".join(second) + "<|message|>Yo"
    compare(encoding, table, ids_of(encoding, text), runs=True)


def test_a_split_character_is_held_back_until_complete(
    encoding: HarmonyEncoding, table: TokenTable
) -> None:
    emoji = list("🫠".encode())
    single = {
        byte: token
        for token in range(256)
        if (data := table.get(token)) and len(data) == 1
        for byte in data
    }
    ids = ids_of(encoding, "<|channel|>final<|message|>") + [single[b] for b in emoji]
    ours = compare(encoding, table, ids, runs=True)
    assert ours.last_content_delta == "🫠"
    assert not ours.delegated


def test_the_fast_path_hands_over_where_it_must(
    encoding: HarmonyEncoding, table: TokenTable
) -> None:
    well_formed = ids_of(encoding, "<|channel|>final<|message|>Hi")
    assert not compare(encoding, table, well_formed, runs=True).delegated
    for extra in ([201_100], [2**40], ids_of(encoding, "<|end|>x")):
        assert compare(encoding, table, well_formed + extra, runs=True).delegated


def test_a_shared_log_keeps_every_id_after_the_takeover(
    encoding: HarmonyEncoding, table: TokenTable
) -> None:
    """The recovery accounting reads the frames' ids from the log (`share_log`): it must hold
    every id taken, also those openai-harmony's parser took; unshared it goes at the takeover."""
    head = ids_of(encoding, "<|channel|>final<|message|>Hi<|end|><|start|>")
    ids = head + ids_of(encoding, "user<|message|>Me<|end|>")  # another author: it takes over
    for shared in (False, True):
        ours = HarmonyParser(encoding, table)
        ours.share_log(shared)
        for token in ids:
            ours.process(token)
        assert ours.delegated
        assert list(ours.log) == (ids if shared else [])
    ours.share_log(False)
    assert list(ours.log) == []
    before = HarmonyParser(encoding, table)
    before.share_log(True)
    for token in head:
        before.process(token)
    before.share_log(False)  # not taken over: its replay still needs them
    assert list(before.log) == head
