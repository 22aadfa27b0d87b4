"""The core's surface: call order, failures, delta modes, usage, echo and injected ids."""

from __future__ import annotations

import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.response import CountingIds
from proxy.harmony.stream.repair import ResponseStream, StreamStateError
from tests.harmony import chunks_of, context, ids_of, run
from tests.sdk import accumulate, validate_events
from tests.wellformed import assert_well_formed

TEXT = (
    "<|channel|>analysis<|message|>Let me think about the order status.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>"
    "It shipped on Monday, arriving Thursday.<|return|>"
)


def test_calls_out_of_order_raise_naming_the_phase(encoding: HarmonyEncoding) -> None:
    stream = ResponseStream(encoding, context(), CountingIds())
    with pytest.raises(StreamStateError, match="feed\\(\\) called in phase 'new'"):
        stream.feed([1])
    stream.start()
    with pytest.raises(StreamStateError, match="start\\(\\) called in phase 'streaming'"):
        stream.start()
    stream.finish("stop")
    assert stream.ended
    with pytest.raises(StreamStateError, match="finish\\(\\) called in phase 'ended'"):
        stream.finish("stop")
    with pytest.raises(StreamStateError, match="fail\\(\\) called in phase 'ended'"):
        stream.fail("x", "y")


def test_fail_mid_item_closes_it_incomplete(encoding: HarmonyEncoding) -> None:
    ids = ids_of(encoding, TEXT)
    stream = ResponseStream(encoding, context(), CountingIds())
    events = stream.start() + stream.feed(ids[:-3])
    events += stream.fail("upstream_disconnected", "upstream closed the connection mid-stream")
    response = assert_well_formed(events)
    assert [e["type"] for e in events[-5:]] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "error",
        "response.failed",
    ]
    assert events[-2]["code"] == "upstream_disconnected"
    assert response["error"] == {
        "code": "server_error",
        "message": "upstream closed the connection mid-stream",
    }
    assert [item["status"] for item in response["output"]] == ["completed", "incomplete"]
    assert response["usage"]["output_tokens"] == len(ids) - 3
    assert stream.record().status == "failed"
    validate_events(events)


def test_fail_before_any_token(encoding: HarmonyEncoding) -> None:
    stream = ResponseStream(encoding, context(), CountingIds())
    events = stream.start() + stream.fail("rate_limit_exceeded", "upstream answered 429")
    response = assert_well_formed(events)
    assert response["output"] == []
    assert response["error"]["code"] == "rate_limit_exceeded"


def test_unknown_finish_reason_fails_the_response(encoding: HarmonyEncoding) -> None:
    events, stream = run(encoding, [ids_of(encoding, TEXT)[:20]], "cancelled")
    response = assert_well_formed(events)
    assert response["status"] == "failed"
    assert "'cancelled'" in events[-2]["message"]
    assert stream.record().finish_reason == "cancelled"


def test_deltas_are_coalesced_per_feed_by_default(encoding: HarmonyEncoding) -> None:
    ids = ids_of(encoding, TEXT)
    events, _ = run(encoding, [ids])  # one frame with everything
    deltas = [e for e in events if e["type"].endswith(".delta")]
    assert [e["type"] for e in deltas] == [
        "response.reasoning_text.delta",
        "response.output_text.delta",
    ]
    assert deltas[1]["delta"] == "It shipped on Monday, arriving Thursday."


def test_one_delta_per_token_when_asked(encoding: HarmonyEncoding) -> None:
    ids = ids_of(encoding, TEXT)
    events, stream = run(encoding, [ids], ctx=context(coalesce_deltas=False))
    assert_well_formed(events)
    deltas = [e for e in events if e["type"].endswith(".delta")]
    record = stream.record()
    assert len(deltas) == sum(record.content_tokens.values()) > 10


def test_usage_counts_reasoning_tokens_of_analysis_messages(encoding: HarmonyEncoding) -> None:
    ids = ids_of(encoding, TEXT)
    analysis = ids_of(
        encoding, "<|channel|>analysis<|message|>Let me think about the order status.<|end|>"
    )
    events, _ = run(encoding, chunks_of(ids, [20]), ctx=context(input_tokens=65))
    usage = events[-1]["response"]["usage"]
    assert usage == {
        "input_tokens": 65,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": len(ids),
        "output_tokens_details": {"reasoning_tokens": len(analysis)},
        "total_tokens": 65 + len(ids),
    }


def test_upstream_usage_overrides_our_count(encoding: HarmonyEncoding) -> None:
    stream = ResponseStream(encoding, context(), CountingIds())
    events = stream.start() + stream.feed(ids_of(encoding, TEXT)[:-1])
    events += stream.finish("stop", None, output_tokens=99)
    assert events[-1]["response"]["usage"]["output_tokens"] == 99


def test_echo_fields_and_injected_ids_reach_every_snapshot(encoding: HarmonyEncoding) -> None:
    tools = [{"type": "function", "name": "f", "parameters": {}, "strict": False}]
    ctx = context(
        response_id="resp_abc",
        echo={"instructions": "Be brief.", "tools": tools, "temperature": 0.5},
    )
    events, _ = run(encoding, [ids_of(encoding, TEXT)], ctx=ctx)
    for event in (events[0], events[1], events[-1]):
        response = event["response"]
        assert response["id"] == "resp_abc"
        assert response["instructions"] == "Be brief."
        assert response["tools"] == tools
        assert response["temperature"] == 0.5
        assert response["top_p"] == 1.0  # upstream's default echo
        assert response["model"] == "openai/gpt-oss-120b"
    ids = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert ids == ["rs_00000000000000000000000000000001", "msg_00000000000000000000000000000002"]
    assert accumulate(events) is not None


def test_empty_frames_send_nothing(encoding: HarmonyEncoding) -> None:
    stream = ResponseStream(encoding, context(), CountingIds())
    stream.start()
    assert stream.feed([]) == []
    stream.feed(ids_of(encoding, "<|channel|>final<|message|>"))
    assert stream.feed([]) == []


def test_token_ids_that_are_no_u32_are_dropped_and_counted(encoding: HarmonyEncoding) -> None:
    stream = ResponseStream(encoding, context(), CountingIds())
    events = stream.start() + stream.feed(ids_of(encoding, "<|channel|>final<|message|>Hi"))
    events += stream.feed([-1, 2**40]) + stream.feed(ids_of(encoding, " there<|return|>"))
    events += stream.finish("stop")
    response = assert_well_formed(events)
    assert response["output"][0]["content"][0]["text"] == "Hi there"
    assert stream.record().malformed == {"invalid_token_id": 2}


@pytest.mark.parametrize("token", [200002, 200012, 200005, 200007, 976, 0])
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_single_token_responses(encoding: HarmonyEncoding, token: int, finish: str) -> None:
    for chunks in ([[token]], [[], [token], []]):
        events, stream = run(encoding, chunks, finish)
        response = assert_well_formed(events)
        assert response["output"] == []
        assert response["usage"]["output_tokens"] == 1
        validate_events(events)
        malformed = stream.record().malformed
        assert malformed == ({"incomplete_header": 1} if finish == "stop" else {})


def test_the_terminal_snapshot_lists_the_item_closed_in_its_frame_as_sent(
    encoding: HarmonyEncoding,
) -> None:
    """The item closed in the terminal's own frame is the very object its done event carries
    (no decoded copy of its text held beside it); one closed in an earlier frame, kept as UTF-8
    (its text has an emoji), comes back equal."""
    text = TEXT.replace("order status.", "order status 📦.")
    text = text.replace("arriving Thursday.", "arriving Thursday 🚚.")
    ids = ids_of(encoding, text)
    split = ids.index(ids_of(encoding, "<|start|>")[0])
    stream = ResponseStream(encoding, context(), CountingIds())
    events = stream.start() + stream.feed(ids[:split]) + stream.feed(ids[split:])
    last = events + stream.finish("stop")
    done = [e["item"] for e in last if e["type"] == "response.output_item.done"]
    output = last[-1]["response"]["output"]
    assert output == done
    assert output[-1] is done[-1]
    assert output[0] is not done[0]
