"""The sans-IO half of the stateful API: histories as bodies, stored records, replay,
the core's cancel — plain data in, plain data out."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError
from proxy.harmony.history import chain as history
from proxy.harmony.history.stored import (
    StoredResponse,
    as_it_stands,
    decode_events,
    encode_events,
    encode_record,
    ended_events,
)
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.response import CountingIds
from tests.harmony import MODEL, chunks_of, context, ids_of, run
from tests.sdk import validate_events
from tests.wellformed import assert_well_formed

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ANSWER = (
    "<|channel|>analysis<|message|>Thinking it over.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The answer.<|return|>"
)


def prompt(encoding: HarmonyEncoding, **body: Any) -> list[int]:
    return prepare_request({"model": MODEL, **body}, encoding).prompt_token_ids


# -- stored input renders as the input as sent -----------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "Hi there",
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Dev."}],
        [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "input_text", "text": "A"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}]},
        ],
    ],
)
def test_stored_input_renders_like_the_input_as_sent(encoding: HarmonyEncoding, value: Any) -> None:
    stored = history.stored_input(value, CountingIds())
    assert all(item["id"] and item["type"] for item in stored)
    assert prompt(encoding, input=stored, tools=TOOLS) == prompt(encoding, input=value, tools=TOOLS)


def test_stored_input_has_the_shapes_the_sdk_lists() -> None:
    from openai._models import validate_type
    from openai.types.responses import ResponseItem

    stored = history.stored_input(
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "x"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]},
        ],
        CountingIds(),
    )
    kinds = [type(validate_type(type_=ResponseItem, value=item)).__name__ for item in stored]  # type: ignore[arg-type]
    assert kinds == [
        "ResponseInputMessageItem",
        "ResponseOutputMessage",
        "ResponseFunctionToolCallItem",
        "ResponseFunctionToolCallOutputItem",
        "ResponseReasoningItem",
    ]
    assert stored[0]["id"].startswith("msg_")
    assert stored[2]["id"].startswith("fc_")


def test_merged_body_puts_history_first_and_keeps_the_new_request_fields() -> None:
    body = {
        "model": MODEL,
        "input": "Next?",
        "previous_response_id": "resp_1",
        "instructions": "New rules.",
        "tools": TOOLS,
    }
    past = [{"id": "msg_1", "type": "message", "role": "user", "content": []}]
    merged = history.merged_body(body, past)
    assert "previous_response_id" not in merged
    assert merged["input"] == [*past, {"role": "user", "content": "Next?"}]
    assert (merged["instructions"], merged["tools"]) == ("New rules.", TOOLS)
    assert body["input"] == "Next?"  # the request is not changed


def test_history_of_a_chain_is_inputs_then_outputs_oldest_first() -> None:
    chain = [(["in1"], ["out1a", "out1b"]), (["in2"], []), (["in3a", "in3b"], ["out3"])]
    assert history.history_items(chain) == [
        *("in1", "out1a", "out1b", "in2", "in3a", "in3b", "out3")
    ]


def test_errors_of_the_merged_input_name_the_request_item() -> None:
    error = ClientError("'input[7].content' is 5: expected a list", param="input[7].content")
    local = history.local_error(error, 5)
    assert local.param == "input[2].content"
    assert local.message == "'input[2].content' is 5: expected a list"
    stored = history.local_error(ClientError("bad", param="input[1].type"), 5)
    assert stored.param == "previous_response_id"
    assert "stored conversation" in stored.message
    untouched = ClientError("x", param="tools[0]")
    assert history.local_error(untouched, 5) is untouched


def test_references_are_found_and_replaced_in_place() -> None:
    body = {
        "input": [
            {"role": "user", "content": "a"},
            {"type": "item_reference", "id": "fc_9"},
            {"type": "item_reference", "id": 3},
        ]
    }
    assert history.references(body["input"]) == [(1, "fc_9")]
    assert history.references("text") == []
    replaced = history.with_references(body, {1: {"type": "function_call", "id": "fc_9"}})
    assert replaced["input"][1] == {"type": "function_call", "id": "fc_9"}
    assert replaced["input"][0] == body["input"][0]


def test_tool_loop_through_a_chain_renders_like_the_full_history(encoding: HarmonyEncoding) -> None:
    # The stored function_call output, then a new function_call_output input: the call is
    # found in the history (no "no earlier function_call" 400).
    call = {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
        "status": "completed",
    }
    first = history.stored_input("Weather in Paris?", CountingIds())
    output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    body = {"model": MODEL, "input": [output], "tools": TOOLS, "previous_response_id": "resp_1"}
    merged = history.merged_body(body, history.history_items([(first, [call])]))
    full = {"model": MODEL, "input": [*first, call, output], "tools": TOOLS}
    assert prepare_request(merged, encoding).prompt_token_ids == (
        prepare_request(full, encoding).prompt_token_ids
    )


# -- records and replay ---------------------------------------------------------------------


def test_stored_response_round_trips() -> None:
    record = StoredResponse({"id": "resp_1", "status": "completed"}, [{"id": "m"}], ("a",), True)
    assert StoredResponse.decode(record.encode()) == record
    assert record.status == "completed"


@pytest.mark.parametrize("chain", [(), ("resp_a", "resp_b")])
def test_a_record_encoded_from_its_rest_is_the_same_record(chain: tuple[str, ...]) -> None:
    """The recorder keeps a running response's input as bytes and encodes its end from them."""
    start = StoredResponse({"status": "in_progress"}, [{"id": "m", "x": "é\n"}], chain, False)
    ended = {"id": "resp_1", "status": "completed", "output": [{"id": "o", "text": '"}'}]}
    encoded = encode_record(ended, start.rest())
    assert StoredResponse.decode(encoded) == StoredResponse(ended, start.input, chain, False)
    assert encoded == StoredResponse(ended, start.input, chain, False).encode()


def test_what_a_recorder_keeps_holds_no_more_memory_than_its_bytes() -> None:
    """A running stored response waits with its record's rest and its pending log entry as
    bytes: each in an allocation of its own size, not in the encoder's larger buffer."""
    record = StoredResponse({"status": "in_progress"}, [{"id": "m", "text": "x"}], (), False)
    events = [{"type": "response.output_text.delta", "delta": "é" * 50, "sequence_number": 3}]
    kept = [record.encode(), record.rest(), encode_events(events)[1]]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        copies = [record.encode(), record.rest(), encode_events(events)[1]]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert copies == kept
    # a bytes object is its length plus a header of ~33 bytes; the list of three, ~80
    assert held <= sum(len(data) + 64 for data in copies) + 128, held


def test_as_it_stands_replays_the_output_so_far(encoding: HarmonyEncoding) -> None:
    events, _ = run(encoding, chunks_of(ids_of(encoding, ANSWER), [3]))
    terminal = events[-1]["response"]
    created = events[0]["response"]
    # every prefix of the events gives a valid in-progress picture; the full list the terminal
    for cut in range(2, len(events)):
        standing = as_it_stands(created, events[:cut])
        assert standing["status"] == "in_progress"
        texts = [
            "".join(part["text"] for part in item.get("content") or [])
            for item in standing["output"]
        ]
        final_texts = [
            "".join(part["text"] for part in item.get("content") or [])
            for item in terminal["output"]
        ]
        for text, final in zip(texts, final_texts, strict=False):
            assert final.startswith(text)
    assert as_it_stands(created, events) == terminal
    # batches round-trip through the log format, filtered by sequence number
    entries = [encode_events(events[:5]), encode_events(events[5:])]
    assert decode_events(entries) == events
    assert decode_events(entries, after=6) == events[7:]


def test_ended_events_end_an_abandoned_response_well_formed(encoding: HarmonyEncoding) -> None:
    events, _stream = run(encoding, chunks_of(ids_of(encoding, ANSWER), [4]))
    cut = next(i for i, e in enumerate(events) if e["type"] == "response.reasoning_text.delta")
    so_far = events[: cut + 1]
    standing = as_it_stands(events[0]["response"], so_far)
    ending = ended_events(standing, so_far[-1]["sequence_number"] + 1, "runner_gone", "gone")
    response = assert_well_formed([*so_far, *ending])
    assert response["status"] == "failed"
    assert response["output"][0]["status"] == "incomplete"
    validate_events([*so_far, *ending])


# -- the core's cancel -------------------------------------------------------------------------


def test_core_cancel_ends_with_a_cancelled_failed_event(encoding: HarmonyEncoding) -> None:
    from proxy.harmony.stream.repair import ResponseStream

    core = ResponseStream(encoding, context(), CountingIds())
    events = core.start()
    events += core.feed(ids_of(encoding, "<|channel|>final<|message|>Half an"))
    events += core.cancel()
    response = assert_well_formed(events)
    assert response["status"] == "cancelled"
    assert response["output"][0]["status"] == "incomplete"
    assert response["usage"]["output_tokens"] > 0
    assert core.ended
    assert core.record().status == "cancelled"
    validate_events(events)
