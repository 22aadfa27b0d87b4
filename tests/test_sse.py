"""The SSE codec: frames we write, and upstream frames we read at any byte split."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.sse import KEEPALIVE, Message, SSEDecoder, encode, encode_all


def test_encode_is_one_compact_frame_per_event() -> None:
    event = {"type": "response.output_text.delta", "delta": "a\n\nevent: x\ndata: y", "n": 1}
    frame = encode(event)
    assert frame.startswith(b"event: response.output_text.delta\ndata: {")
    assert frame.endswith(b"}\n\n")
    assert frame.count(b"\n\n") == 1, "text with blank lines must not split or inject frames"
    assert orjson.loads(frame.split(b"data: ", 1)[1]) == event
    assert encode_all([event, event]) == frame + frame


def test_decoder_reads_data_event_and_comments() -> None:
    decoder = SSEDecoder()
    body = b': hello\n\ndata: {"a": 1}\n\nevent: x\ndata: one\ndata: two\n\ndata: [DONE]\n\n'
    assert decoder.feed(body) == [
        Message('{"a": 1}'),
        Message("one\ntwo", "x"),
        Message("[DONE]"),
    ]
    assert decoder.flush() == []


def test_decoder_flushes_a_last_frame_without_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: tail") == []
    assert decoder.pending_bytes == len(b"data: tail")
    assert decoder.flush() == [Message("tail")]


def test_decoder_replaces_invalid_utf8() -> None:
    assert SSEDecoder().feed(b"data: \xff\xfe\n\n") == [Message("\ufffd\ufffd")]


FRAMES = [
    b'data: {"i": 1}\n\n',
    b"data: [DONE]\r\n\r\n",
    b": keepalive\r\r",
    b"data: x\rdata: y\r\r",
]


@given(cuts=st.lists(st.integers(0, 200), max_size=12), newline=st.sampled_from([b"\n", b"\r\n"]))
def test_any_byte_split_gives_the_same_messages(cuts: list[int], newline: bytes) -> None:
    body = b"".join(FRAMES).replace(b"\n\n", newline + newline) + KEEPALIVE
    whole = SSEDecoder()
    expected = whole.feed(body) + whole.flush()
    assert expected == [Message('{"i": 1}'), Message("[DONE]"), Message("x\ny")]
    decoder, got, start = SSEDecoder(), [], 0
    for cut in sorted(cuts):
        got += decoder.feed(body[start:cut])
        start = max(start, cut)
    got += decoder.feed(body[start:]) + decoder.flush()
    assert got == expected


def test_flush_of_a_partial_line_that_completes_nothing() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: a\n")
    assert decoder.flush() == [Message("a")]
    decoder.feed(b": comment only")
    assert decoder.flush() == []
    assert decoder.feed(b"id: 7\nretry: 10\ndata: b\n\n") == [Message("b")]
