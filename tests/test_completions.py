"""Parsing upstream /v1/completions frames (`detokenize: false`: token ids, finish, usage)."""

from __future__ import annotations

import pytest

from proxy.upstream.completions import (
    DONE_FRAME,
    Frame,
    FrameError,
    describe_error_body,
    error_message,
    parse_frame,
)


def test_token_frame() -> None:
    frame = parse_frame(
        '{"id":"cmpl-1","choices":[{"index":0,"text":"","token_ids":[1,2,3],'
        '"finish_reason":null,"stop_reason":null}]}'
    )
    assert frame == Frame((1, 2, 3))


def test_final_frame_with_stop_reason_and_usage_frame() -> None:
    frame = parse_frame(
        '{"choices":[{"text":"","token_ids":[200012],"finish_reason":"stop","stop_reason":200012}]}'
    )
    assert (frame.finish_reason, frame.stop_reason) == ("stop", 200012)
    usage = parse_frame('{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}')
    assert usage == Frame(completion_tokens=9)
    assert parse_frame("[DONE]") is DONE_FRAME


def test_empty_token_frame_is_fine() -> None:
    assert parse_frame('{"choices":[{"token_ids":[],"finish_reason":null}]}') == Frame()


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ("{not json", "malformed_frame"),
        ("[1, 2]", "malformed_frame"),
        ('{"error": {"message": "engine died", "code": 500}}', "upstream_error"),
        ('{"id": "x"}', "malformed_frame"),
        ('{"choices": [{"text": "hi", "finish_reason": null}]}', "missing_token_ids"),
        ('{"choices": [{"token_ids": [1, -2]}]}', "malformed_frame"),
        ('{"choices": [{"token_ids": [1, "2"]}]}', "malformed_frame"),
        ('{"choices": [{"token_ids": [true]}]}', "malformed_frame"),
        ('{"choices": [{"token_ids": [], "finish_reason": 5}]}', "malformed_frame"),
        ('{"choices": ["x"]}', "malformed_frame"),
    ],
)
def test_bad_frames_raise_a_coded_error(data: str, code: str) -> None:
    with pytest.raises(FrameError) as info:
        parse_frame(data)
    assert info.value.code == code
    if code == "upstream_error":
        assert "engine died" in info.value.message


def test_error_message_of_upstream_bodies() -> None:
    assert error_message(b'{"object":"error","message":"bad prompt","code":400}') == "bad prompt"
    assert error_message(b'{"error":{"message":"slow down"}}') == "slow down"
    assert error_message(b'{"error":"boom"}') == "boom"
    assert error_message(b"<html>502</html>") is None
    assert error_message(b"") is None
    assert error_message(b"{") is None


def test_error_bodies_without_a_message_are_described_not_quoted() -> None:
    """A 400 once quoted a lone `{`; junk is described, never echoed."""
    assert describe_error_body(b"", "") == "an empty body"
    assert describe_error_body(b"<html>502</html>", "text/html; charset=utf-8") == (
        "an error body that is not JSON (16 bytes of text/html; not quoted)"
    )
    assert describe_error_body(b"{", "application/json") == (
        "an error body that is not JSON (1 bytes of application/json; not quoted)"
    )
    assert describe_error_body(b"[1, 2]", "") == (
        "a JSON error body without a message (6 bytes; not quoted)"
    )
    assert describe_error_body(b'{"message": "ok so far', "", "not complete within 2 s") == (
        "an error body that was not complete within 2 s (not quoted)"
    )


def test_error_frame_with_a_plain_error_string() -> None:
    with pytest.raises(FrameError, match="overloaded"):
        parse_frame('{"error": "overloaded"}')


def test_error_body_that_is_json_but_not_an_error_object() -> None:
    assert error_message(b"[1, 2]") is None
    assert error_message(b'{"detail": "x"}') is None
