"""Compaction in the sans-IO core (proxy/harmony/request/compaction.py, the seal's kind byte,
request/items.py): the sealed payload, where a compaction item renders, what is dropped before
it, what a compaction keeps, `context_management` and the trigger item's checks, and the
scripted model's checkpoint summary."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError
from proxy.harmony.reasoning_seal import COMPACTION, REASONING, ReasoningKeys, SealError
from proxy.harmony.request import compaction
from proxy.harmony.request.prepare import prepare_request
from proxy.simulator.model import ScriptedModel
from proxy.simulator.prompt import read_prompt

K1 = ("2026-01", b"1" * 32)
K2 = ("2026-02", b"2" * 32)
OLD, ROTATED = ReasoningKeys((K1,)), ReasoningKeys((K2, K1))
MODEL = "openai/gpt-oss-120b"


def _item(keys: ReasoningKeys, summary: str, users: list[list[str]]) -> dict[str, Any]:
    return compaction.compaction_item("cmp_1", compaction.seal(keys, summary, users))


def _prompt(encoding: HarmonyEncoding, items: Any, keys: ReasoningKeys = ROTATED) -> list[int]:
    body = {"model": MODEL, "input": items}
    return prepare_request(body, encoding, reasoning_keys=keys).prompt_token_ids


# -- the seal's kind byte --------------------------------------------------------------------


def test_a_blob_opens_only_as_its_own_kind() -> None:
    reasoning = ROTATED.seal(["thinking"])
    sealed = ROTATED.seal_json(COMPACTION, {"summary": "s", "users": []})
    assert ROTATED.open(reasoning) == ["thinking"]
    assert ROTATED.open_json(COMPACTION, sealed) == {"summary": "s", "users": []}
    with pytest.raises(SealError, match="another kind"):
        ROTATED.open_json(COMPACTION, reasoning)
    with pytest.raises(SealError, match="another kind"):
        ROTATED.open(sealed)


def test_the_kind_byte_is_authenticated() -> None:
    raw = bytearray(base64.urlsafe_b64decode(ROTATED.seal(["thinking"])))
    assert raw[:2] == bytes([2, REASONING])
    raw[1] = COMPACTION  # relabelled: the tag no longer verifies
    with pytest.raises(SealError, match="does not verify"):
        ROTATED.open_json(COMPACTION, base64.urlsafe_b64encode(bytes(raw)).decode())


def test_rotation_opens_compactions_sealed_under_an_older_key() -> None:
    blob = compaction.seal(OLD, "summary", [["hi"]])
    opened = compaction.open_sealed(ROTATED, blob, "input[0].encrypted_content")
    assert opened == compaction.Sealed("summary", (("hi",),))
    with pytest.raises(ClientError) as caught:
        compaction.open_sealed(ReasoningKeys((K2,)), blob, "input[0].encrypted_content")
    assert caught.value.code == "invalid_encrypted_content"


def test_version_1_reasoning_blobs_still_open_as_reasoning_only() -> None:
    """Blobs sealed before the kind byte existed (0x01 | len | id | nonce | sealed)."""
    key_id, key = K1
    header = bytes([1, len(key_id)]) + key_id.encode()
    nonce = os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, b'["old thinking"]', header)
    blob = base64.urlsafe_b64encode(header + nonce + sealed).decode()
    assert ROTATED.open(blob) == ["old thinking"]
    with pytest.raises(SealError):
        ROTATED.open_json(COMPACTION, blob)


# -- rendering -------------------------------------------------------------------------------


def test_a_compaction_renders_as_its_kept_users_then_the_summary(
    encoding: HarmonyEncoding,
) -> None:
    item = _item(ROTATED, "We planned the launch.", [["Plan it."], ["Go on."]])
    ids = _prompt(encoding, [item, {"role": "user", "content": "Next?"}])
    expected = [
        {"role": "user", "content": "Plan it."},
        {"role": "user", "content": "Go on."},
        {"role": "developer", "content": compaction.SUMMARY_HEADING + "We planned the launch."},
        {"role": "user", "content": "Next?"},
    ]
    assert ids == _prompt(encoding, expected)


def test_items_before_the_latest_compaction_are_checked_then_dropped(
    encoding: HarmonyEncoding,
) -> None:
    older = _item(ROTATED, "old summary", [])
    latest = _item(ROTATED, "new summary", [["Plan it."]])
    tail = {"role": "user", "content": "Next?"}
    history = [
        {"role": "user", "content": "a long forgotten request"},
        older,
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "r"},
    ]
    assert _prompt(encoding, [*history, latest, tail]) == _prompt(encoding, [latest, tail])
    # Dropped, yet checked: a broken item before the compaction is still a 400.
    bad = {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}
    with pytest.raises(ClientError) as caught:
        _prompt(encoding, [bad, latest, tail])
    assert caught.value.param == "input[0].content[0].type"
    tampered = {**older, "encrypted_content": older["encrypted_content"][:-4] + "AAAA"}
    with pytest.raises(ClientError) as opened:
        _prompt(encoding, [tampered, latest, tail])
    assert opened.value.param == "input[0].encrypted_content"


def test_a_trigger_renders_nothing_and_must_be_last(encoding: HarmonyEncoding) -> None:
    user = {"role": "user", "content": "hi"}
    trigger = {"type": "compaction_trigger"}
    assert _prompt(encoding, [user, trigger]) == _prompt(encoding, [user])
    with pytest.raises(ClientError) as caught:
        _prompt(encoding, [trigger, user])
    assert caught.value.param == "input[0]"
    # One in stored history, before the compaction it asked for, is history: dropped.
    item = _item(ROTATED, "s", [["hi"]])
    assert _prompt(encoding, [user, trigger, item, user]) == _prompt(encoding, [item, user])


# -- what a compaction keeps, and its pass ---------------------------------------------------


def test_a_compaction_keeps_the_user_messages_of_its_window() -> None:
    earlier = _item(ROTATED, "s", [["first"]])
    items = [
        {"role": "user", "content": "before everything"},
        earlier,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "second"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"role": "developer", "content": "not kept"},
    ]
    assert compaction.kept(items, ROTATED, 1000) == [["first"], ["second"]]
    kept = compaction.kept_item(["second"], "msg_1")
    assert kept["role"] == "user"
    assert kept["content"] == [{"type": "input_text", "text": "second"}]


def test_a_compaction_keeps_the_newest_user_messages_within_its_budget() -> None:
    earlier = _item(ROTATED, "s", [["a" * 40], ["b" * 30]])
    items = [earlier, {"role": "user", "content": [{"type": "input_text", "text": "c" * 20}]}]
    assert compaction.kept(items, ROTATED, 50) == [["b" * 30], ["c" * 20]]
    assert compaction.kept(items, ROTATED, 49) == [["c" * 20]]
    items.append({"role": "user", "content": "d" * 45})
    assert compaction.kept(items, ROTATED, 70) == [["c" * 20], ["d" * 45]]
    # Bytes, not characters: "é" is two.
    accented = [*items, {"role": "user", "content": "é" * 3}]
    assert compaction.kept(accented, ROTATED, 51) == [["d" * 45], ["é" * 3]]
    assert compaction.kept(accented, ROTATED, 50) == [["é" * 3]]
    # A contiguous run of the newest: a short older message is not kept past a long one.
    assert compaction.kept([*items, {"role": "user", "content": "e"}], ROTATED, 30) == [["e"]]
    # The newest always, whatever its size: the turn being answered stays verbatim.
    assert compaction.kept(items, ROTATED, 10) == [["d" * 45]]
    assert compaction.kept([], ROTATED, 10) == []


def test_the_kept_budget_is_the_threshold_or_a_quarter_of_the_context() -> None:
    assert compaction.kept_budget(60_000, 131_072) == 60_000
    assert compaction.kept_budget(None, 131_072) == 32_768


def test_the_pass_body_asks_for_the_summary_without_tools() -> None:
    body = compaction.read_compact_body({"model": MODEL, "input": "hi", "instructions": "be kind"})
    passed = compaction.pass_body(body)
    assert passed["input"][-1] == {
        "type": "message",
        "role": "developer",
        "content": (compaction.INSTRUCTION),
    }
    assert passed["input"][0] == {"role": "user", "content": "hi"}  # as a client sends it
    assert passed["tool_choice"] == "none"
    assert passed["store"] is False
    assert passed["instructions"] == "be kind"
    assert "tools" not in passed


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "input": "x", "stream": True}, "stream"),
        ({"input": "x"}, "model"),
        ({"model": MODEL}, "input"),
    ],
)
def test_compact_bodies_are_checked(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ClientError) as caught:
        compaction.read_compact_body(body)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ([{"type": "compaction"}], None),
        ([{"type": "compaction", "compact_threshold": None}], None),
        ([{"type": "compaction", "compact_threshold": 5000}], 5000),
        (
            [
                {"type": "compaction", "compact_threshold": 9000},
                {"type": "compaction", "compact_threshold": 2000},
            ],
            2000,
        ),
    ],
)
def test_context_management_thresholds(value: Any, expected: int | None) -> None:
    assert compaction.read_context_management(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        [{"type": "compaction", "compact_threshold": 999}],
        [{"type": "compaction", "compact_threshold": True}],
        [{"type": "compaction", "compact_threshold": "5000"}],
        [{"type": "truncate"}],
        ["compaction"],
        {"type": "compaction"},
    ],
)
def test_bad_context_management_is_a_400(value: Any) -> None:
    with pytest.raises(ClientError):
        compaction.read_context_management(value)


def test_the_summary_of_a_pass() -> None:
    message = {"type": "message", "content": [{"type": "output_text", "text": " Done. "}]}
    assert compaction.summary_of({"status": "completed", "output": [message]}) == "Done."
    assert compaction.summary_of({"status": "failed", "output": [message]}) is None
    assert compaction.summary_of({"status": "completed", "output": []}) is None


# -- the scripted model ----------------------------------------------------------------------


def test_the_scripted_model_writes_a_checkpoint_summary(encoding: HarmonyEncoding) -> None:
    earlier = _item(ROTATED, "the launch was planned", [["Plan the launch."]])
    body = compaction.pass_body(
        {
            "model": MODEL,
            "input": [
                earlier,
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "rain 🌧"},
            ],
        }
    )
    prompt_ids = prepare_request(body, encoding, reasoning_keys=ROTATED).prompt_token_ids
    prompt = read_prompt(encoding, prompt_ids)
    assert prompt.checkpoint is not None
    completion = ScriptedModel(encoding).complete(prompt_ids)
    channel, recipient, text = completion.messages[-1]
    assert (channel, recipient) == ("final", None)
    for fact in ("the launch was planned", "Plan the launch.", "Weather in Paris?", "rain 🌧"):
        assert fact in text
    # An ordinary turn after it is answered as before, with the declared tools kept.
    assert read_prompt(encoding, _prompt(encoding, "hi")).checkpoint is None
