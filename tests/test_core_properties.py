"""Hypothesis over generated Harmony conversations and over chunk boundaries.

Whatever the model says and however upstream chunks it, the repaired stream is well-formed,
says exactly what the Harmony text says, and differs between chunkings only by delta coalescing.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from proxy.harmony import tokens as tk
from tests.harmony import chunks_of, coalesced, context, ids_of, run, semantic
from tests.sdk import validate_events
from tests.wellformed import assert_well_formed

# Text the model may write: anything but the start of a special token (`<|…|>` would be
# encoded as one) and U+FFFD (the well-formedness check treats it as a broken character).
TEXT = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="<\ufffd"),
    max_size=30,
) | st.sampled_from(["世界", "🫠🫠", "e\u0301", "👩\u200d👧", "𝔘𝔫", " ", "\n\n"])
NAME = st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True)
NAMESPACES = frozenset({"crm", "files"})


@st.composite
def harmony_message(draw: st.DrawFn) -> tuple[str, str, tuple[Any, ...]]:
    """(header, body, expected semantic item); the header lacks the leading <|start|>."""
    kind = draw(st.sampled_from(["reasoning", "final", "preamble", "call", "ns_call"]))
    text = draw(TEXT)
    if kind == "reasoning":
        return "assistant<|channel|>analysis", text, ("reasoning", text)
    if kind in ("final", "preamble"):
        channel = "final" if kind == "final" else "commentary"
        return f"assistant<|channel|>{channel}", text, ("message", "assistant", text)
    name = draw(NAME)
    namespace = draw(st.sampled_from(sorted(NAMESPACES))) if kind == "ns_call" else None
    recipient = f"{namespace or 'functions'}.{name}"
    style = draw(st.integers(0, 2))
    header = [
        f"assistant<|channel|>commentary to={recipient} <|constrain|>json",
        f"assistant<|channel|>commentary to={recipient}",
        f"assistant to={recipient}<|channel|>commentary json",
    ][style]
    return header, text, ("function_call", name, namespace, text)


@st.composite
def conversation(draw: st.DrawFn) -> tuple[str, list[tuple[Any, ...]]]:
    messages = draw(st.lists(harmony_message(), min_size=1, max_size=5))
    parts: list[str] = []
    for number, (header, body, expected) in enumerate(messages):
        last = number == len(messages) - 1
        if number == 0:
            header = header.removeprefix("assistant")  # the prompt ends in <|start|>assistant
        else:
            header = "<|start|>" + header
        if expected[0] == "function_call":
            end = "<|call|>"
        else:
            end = "<|return|>" if last else "<|end|>"
        parts.append(f"{header}<|message|>{body}{end}")
    return "".join(parts), [expected for _, _, expected in messages]


SIZES = st.lists(st.integers(0, 25), min_size=1, max_size=8).filter(any)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversation(), sizes=SIZES, strip_stop=st.booleans(), coalesce=st.booleans())
def test_any_conversation_at_any_chunking(
    encoding: HarmonyEncoding,
    conv: tuple[str, list[tuple[Any, ...]]],
    sizes: list[int],
    strip_stop: bool,
    coalesce: bool,
) -> None:
    text, expected = conv
    ids = ids_of(encoding, text)
    if strip_stop:
        assert ids[-1] in (tk.RETURN, tk.CALL)
        ids = ids[:-1]  # upstream cut the stop word: it must not matter
    ctx = context(namespaces=NAMESPACES, coalesce_deltas=coalesce)
    events, stream = run(encoding, chunks_of(ids, sizes), ctx=ctx)
    response = assert_well_formed(events)
    assert semantic(response["output"]) == expected
    assert stream.record().malformed == {}
    reference, _ = run(encoding, [[t] for t in ids], ctx=ctx)
    assert coalesced(events) == coalesced(reference)
    validate_events(events)


@settings(max_examples=100, deadline=None)
@given(
    ids=st.lists(st.integers(0, 200_020), max_size=60),
    sizes=SIZES,
    finish=st.sampled_from(["stop", "length", "cancelled"]),
)
def test_random_tokens_never_break_the_stream(
    encoding: HarmonyEncoding, ids: list[int], sizes: list[int], finish: str
) -> None:
    """Garbage in (any ids, special tokens anywhere): no exception, one terminal event."""
    events, _ = run(encoding, chunks_of(ids, sizes), finish)
    assert_well_formed(events, invalid_utf8=True)  # e.g. a lone continuation byte
    validate_events(events)


@settings(max_examples=60, deadline=None)
@given(conv=conversation(), cut=st.integers(0, 400), sizes=SIZES)
def test_length_cut_anywhere(
    encoding: HarmonyEncoding, conv: tuple[str, list[tuple[Any, ...]]], cut: int, sizes: list[int]
) -> None:
    """`max_output_tokens` may cut anywhere, mid-header or mid-character: still well-formed."""
    ids = ids_of(encoding, conv[0])[:cut]
    events, _ = run(encoding, chunks_of(ids, sizes), "length")
    response = assert_well_formed(events)
    assert response["status"] == "incomplete"
