"""What a WebSocket session keeps of its last response (proxy/harmony/history/session.py), as
data: a stored response as its id, an unstored history up to the bound, a clear 400 past it."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import ClientError
from proxy.harmony.history import session

OUTPUT = [{"type": "message", "role": "assistant", "content": [{"type": "output_text"}]}]


def test_a_stored_response_is_kept_as_its_id_and_continued_through_the_store() -> None:
    kept = session.keep(
        "resp_1", stored=True, made_from={"input": "x" * 100}, output=OUTPUT, limit=50
    )
    assert (kept.items, kept.held) == (None, 0)
    body = {"model": "m", "input": "next", "previous_response_id": "resp_1"}
    assert session.continuing(kept, body) == (body, None)


def test_an_unstored_history_within_the_bound_is_merged_into_the_next_turn() -> None:
    kept = session.keep(
        "resp_1", stored=False, made_from={"input": "hi"}, output=OUTPUT, limit=4096
    )
    items = [{"role": "user", "content": "hi"}, *OUTPUT]
    assert kept.size == len(orjson.dumps(items))
    assert kept.held == kept.size
    body = {"model": "m", "input": "next", "previous_response_id": "resp_1", "store": False}
    merged, continued = session.continuing(kept, body)
    assert continued == "resp_1"
    assert merged["input"] == [*items, {"role": "user", "content": "next"}]
    assert "previous_response_id" not in merged
    # another id, or one with a conversation, is left to the store (and its checks)
    other = {**body, "previous_response_id": "resp_0"}
    assert session.continuing(kept, other) == (other, None)
    with_conversation = {**body, "conversation": "conv_1"}
    assert session.continuing(kept, with_conversation) == (with_conversation, None)


def test_an_unstored_history_over_the_bound_is_not_kept_and_naming_it_is_a_400() -> None:
    kept = session.keep(
        "resp_1", stored=False, made_from={"input": "x" * 500}, output=OUTPUT, limit=400
    )
    assert kept.items is None
    assert kept.held == 0
    assert kept.size > 400
    with pytest.raises(ClientError) as refused:
        session.continuing(kept, {"input": "next", "previous_response_id": "resp_1"})
    error = refused.value
    assert (error.status, error.param, error.code) == (
        400,
        "previous_response_id",
        "previous_response_not_found",
    )
    assert "400 bytes" in error.message
    assert "store: true" in error.message
    assert "compact" in error.message
