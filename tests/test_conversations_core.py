"""The sans-IO half of conversations: ids, request bodies, items as kept and listed,
pages — plain data in, plain data out."""

from __future__ import annotations

from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError
from proxy.harmony.history import chain as history
from proxy.harmony.history import conversation as conv
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request.items import check_items, input_messages
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.response import CountingIds
from tests.harmony import MODEL

ITEMS: list[Any] = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "Sunny."},
    {"role": "assistant", "content": "It is sunny."},
]


def raised(work: Any) -> ClientError:
    with pytest.raises(ClientError) as error:
        work()
    return error.value


# -- ids -----------------------------------------------------------------------------------------


def test_conversation_param_takes_an_id_or_an_object() -> None:
    key = "conv_" + "ab" * 16
    assert conv.conversation_param(key) == key
    assert conv.conversation_param({"id": key}) == key
    for value, param in [
        ("resp_1", "conversation"),
        ("conv_", "conversation"),
        ("conv_a/b", "conversation"),
        (7, "conversation"),
        ({"id": None}, "conversation.id"),
        ({"id": "msg_1"}, "conversation.id"),
        ({"id": key, "name": "x"}, "conversation.name"),
    ]:
        error = raised(lambda value=value: conv.conversation_param(value))
        assert (error.status, error.param) == (400, param)
    assert conv.exclusive().code == "mutually_exclusive_parameters"


def test_record_round_trips_as_the_conversation_object() -> None:
    record = conv.ConversationRecord("conv_1", 1700000000, {"k": "v"})
    assert conv.ConversationRecord.decode(record.encode()) == record
    assert record.resource() == {
        "id": "conv_1",
        "object": "conversation",
        "created_at": 1700000000,
        "metadata": {"k": "v"},
    }
    assert conv.deleted("conv_1") == {
        "id": "conv_1",
        "object": "conversation.deleted",
        "deleted": True,
    }


# -- request bodies ------------------------------------------------------------------------------


def test_bodies_are_checked() -> None:
    assert conv.read_create(None) == ([], {})
    assert conv.read_create({"items": None, "metadata": None}) == ([], {})
    assert conv.read_create({"items": ITEMS[:2], "metadata": {"a": "b"}}) == (ITEMS[:2], {"a": "b"})
    assert conv.read_update({"metadata": {"a": "c"}}) == {"a": "c"}
    assert conv.read_update({"metadata": None}) == {}
    assert conv.read_append({"items": ITEMS}) == ITEMS
    for work, param, code in [
        (lambda: conv.read_create({"items": ITEMS * 4}), "items", "array_above_max_length"),
        (lambda: conv.read_create({"items": "hi"}), "items", "invalid_type"),
        (lambda: conv.read_create({"model": "x"}), "model", "unknown_parameter"),
        (lambda: conv.read_create({"metadata": {"k": 1}}), "metadata.k", "invalid_type"),
        (lambda: conv.read_update({}), "metadata", "missing_required_parameter"),
        (lambda: conv.read_update({"metadata": {}, "x": 1}), "x", "unknown_parameter"),
        (lambda: conv.read_append({}), "items", "missing_required_parameter"),
        (lambda: conv.read_append({"items": []}), "items", "empty_array"),
        (lambda: conv.read_append({"items": ITEMS * 4}), "items", "array_above_max_length"),
        (lambda: conv.read_append([]), "body", "invalid_type"),
    ]:
        error = raised(work)
        assert (error.param, error.code) == (param, code)


def test_new_items_are_checked_as_input_is_but_may_answer_earlier_calls() -> None:
    conv.check_new_items(ITEMS, None)
    # an output whose call is already in the conversation: fine here, checked when rendered
    answer = {"type": "function_call_output", "call_id": "c9", "output": "x"}
    conv.check_new_items([answer], None)
    assert raised(lambda: input_messages([answer])).param == "input[0].call_id"
    duplicate = raised(lambda: conv.check_new_items([{"id": "m", **ITEMS[0]}] * 2, None))
    assert duplicate.param == "items"
    assert duplicate.message.startswith("Duplicate item found with id m.")


@pytest.mark.parametrize(
    "item",
    [
        {"role": "robot", "content": "x"},
        {"role": "user"},
        {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
        {"type": "image_generation_call", "id": "ig_1"},
        {"type": "function_call", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1"},
        {"type": "reasoning", "summary": [{"text": 3}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "not ours"},
        {"type": "message", "role": "user", "content": "x", "seed": 1},
        "text",
    ],
)
def test_a_bad_item_is_the_same_400_as_in_input(item: Any) -> None:
    keys = ReasoningKeys.generate()
    calls = [ITEMS[3]] if isinstance(item, dict) and item.get("call_id") else []
    in_input = raised(lambda: input_messages([*calls, item], keys))
    kept = raised(lambda: check_items([*calls, item], "items", keys))
    assert kept.message == in_input.message.replace("input[", "items[")
    assert kept.param == (in_input.param or "").replace("input[", "items[")


# -- items as kept and listed ----------------------------------------------------------------------


def test_kept_items_render_as_the_items_sent(encoding: HarmonyEncoding) -> None:
    kept = history.stored_input(ITEMS, CountingIds())
    entries = conv.encode_items(kept)
    assert len(entries) == len(ITEMS)
    back = [item for _, item in conv.decode_items(enumerate(entries))]
    assert back == kept
    as_sent = prepare_request({"model": MODEL, "input": ITEMS}, encoding)
    as_kept = prepare_request({"model": MODEL, "input": back}, encoding)
    assert as_kept.prompt_token_ids == as_sent.prompt_token_ids


def test_merged_body_leaves_the_conversation_out() -> None:
    body = {"model": MODEL, "input": "next", "conversation": "conv_1", "store": True}
    merged = history.merged_body(body, [ITEMS[0]])
    assert "conversation" not in merged
    assert merged["input"] == [ITEMS[0], {"role": "user", "content": "next"}]


def test_errors_in_the_conversation_name_it() -> None:
    error = ClientError("'input[1].role' is 'robot': no", param="input[1].role")
    told = history.local_error(error, 3, "conversation")
    assert told.param == "conversation"
    assert "stored conversation of 'conversation'" in told.message
    assert history.local_error(error, 1, "conversation").param == "input[0].role"


def test_pages() -> None:
    items = [{"id": f"i{n}"} for n in range(5)]
    page = conv.page(items, after=None, limit=2, order="desc")
    assert page == {
        "object": "list",
        "data": [{"id": "i4"}, {"id": "i3"}],
        "first_id": "i4",
        "last_id": "i3",
        "has_more": True,
    }
    assert [i["id"] for i in conv.page(items, after="i1", limit=10, order="asc")["data"]] == [
        "i2",
        "i3",
        "i4",
    ]
    last = conv.page(items, after="i1", limit=10, order="desc")
    assert (last["data"], last["has_more"]) == ([{"id": "i0"}], False)
    assert conv.page([], after=None, limit=20, order="asc") == conv.item_list([])
    assert conv.item_list([])["first_id"] is None
    assert raised(lambda: conv.page(items, after="nope", limit=2, order="asc")).param == "after"


def test_include_seals_reasoning_text() -> None:
    keys = ReasoningKeys.generate()
    reasoning = {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "secret"}],
    }
    include = conv.read_includes(["reasoning.encrypted_content"])
    sealed = conv.included(reasoning, include, keys.seal)
    assert keys.open(sealed["encrypted_content"]) == ["secret"]
    assert conv.included(reasoning, frozenset(), keys.seal) is reasoning
    assert conv.included(sealed, include, keys.seal) is sealed  # already sealed: as it is
    message = {"id": "m", "type": "message"}
    assert conv.included(message, include, keys.seal) is message
    assert raised(lambda: conv.read_includes(["x"])).param == "include[0]"


def test_first_duplicate() -> None:
    assert conv.first_duplicate(["a", None, "", "b", None, ""]) is None
    assert conv.first_duplicate(["a", "b", "b", "a"]) == "b"


def test_input_ids_already_in_the_conversation_are_duplicates() -> None:
    held = [{"id": "msg_1"}, {"id": "fc_1"}]
    conv.check_input_ids(held, "a string input")
    conv.check_input_ids(held, [{"id": "msg_2"}, {"role": "user"}, {"role": "user"}, "x"])
    assert raised(lambda: conv.check_input_ids(held, [{"id": "fc_1"}])).param == "input"
    twice = raised(lambda: conv.check_input_ids(held, [{"id": "m"}, {"id": "m"}]))
    assert twice.message.startswith("Duplicate item found with id m.")
