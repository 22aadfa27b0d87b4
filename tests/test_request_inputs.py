"""A string `input` is one user message, declared once (proxy/harmony/request/inputs.py): each
reader of `input` — the renderer, the stored items, a merged chain, a WebSocket session's kept
history, the compaction pass and what a compaction keeps — sees that same item, and it renders
exactly as the message a client would send in its place."""

from __future__ import annotations

from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.history import chain, session
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request import compaction
from proxy.harmony.request.inputs import as_items
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.response import CountingIds

MODEL = "openai/gpt-oss-120b"
TEXT = "Weather in Paris? 🌧"
SENT = {"role": "user", "content": TEXT}
KEYS = ReasoningKeys((("k", b"k" * 32),))


def prompt(encoding: HarmonyEncoding, **body: Any) -> list[int]:
    full = {"model": MODEL, **body}
    return prepare_request(full, encoding, reasoning_keys=KEYS).prompt_token_ids


def test_a_string_is_one_user_message_a_list_itself_anything_else_nothing() -> None:
    assert as_items(TEXT) == [SENT]
    given = [SENT, {"type": "function_call_output", "call_id": "c", "output": "x"}]
    listed = as_items(given)
    assert listed == given
    assert listed is not given  # a copy: a caller may extend it
    assert as_items(None) == []
    assert as_items({"role": "user"}) == []


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"instructions": "Be brief."},
        {"reasoning": {"effort": "high", "context": "current_turn"}},
    ],
)
def test_a_string_input_renders_as_the_message_a_client_would_send(
    encoding: HarmonyEncoding, extra: dict[str, Any]
) -> None:
    expected = prompt(encoding, input=[SENT], **extra)
    assert prompt(encoding, input=TEXT, **extra) == expected
    typed = {"type": "message", **SENT}
    assert prompt(encoding, input=[typed], **extra) == expected


def test_every_reader_of_input_sees_the_same_user_message() -> None:
    # stored and listed: the message with an id, a status and its text as a part
    stored = chain.stored_input(TEXT, CountingIds())
    assert [{k: v for k, v in item.items() if k != "id"} for item in stored] == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": TEXT}],
            "status": "completed",
        }
    ]
    history = [{"role": "assistant", "content": "earlier"}]
    assert chain.merged_body({"input": TEXT}, history)["input"] == [*history, SENT]
    kept = session.keep("resp_1", stored=False, made_from={"input": TEXT}, output=[], limit=4096)
    assert kept.items == (SENT,)
    passed = compaction.pass_body({"model": MODEL, "input": TEXT})
    assert passed["input"][0] == SENT
    assert compaction.kept(as_items(TEXT), KEYS, 1000) == [[TEXT]]


def test_the_compaction_pass_over_a_string_renders_as_over_its_message(
    encoding: HarmonyEncoding,
) -> None:
    over_text = compaction.pass_body({"model": MODEL, "input": TEXT})
    over_item = compaction.pass_body({"model": MODEL, "input": [{"type": "message", **SENT}]})
    assert prompt(encoding, **over_text) == prompt(encoding, **over_item)
