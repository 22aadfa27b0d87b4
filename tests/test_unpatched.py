"""The model of the unpatched upstream against upstream's recorded streams and its own code.

Recorded: every transcript of the trtllm oracle, event for event (and byte for byte), and every
non-streaming `output`. Not recorded: the quirks below, checked against the behaviour read in
upstream's code, and a literal transliteration of upstream's per-output algorithm (which reads
`parser.state` and `parser.messages`) on random token sequences and chunkings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseFunctionToolCall, ResponseReasoningItem
from openai.types.responses.response_function_web_search import (
    ActionOpenPage,
    ActionSearch,
    ResponseFunctionWebSearch,
)
from openai_harmony import HarmonyEncoding, HarmonyError, Role, StreamableParser, StreamState

from proxy.harmony.response import DEFAULT_ECHO, CountingIds, ResponseContext
from proxy.harmony.tokens import CALL, END, START
from proxy.harmony.unpatched.emitter import UnpatchedStream
from proxy.harmony.unpatched.output import UpstreamOutputError, unpatched_output
from tests.conftest import FIXTURES
from tests.harmony import engine_outputs
from tests.spec_departures import normalised

ORACLE = FIXTURES / "trtllm-oracle"
MANIFEST = json.loads((ORACLE / "manifest.json").read_text())
STREAMS = [t for t in MANIFEST["transcripts"] if t["stream"]]
NONSTREAMS = [t for t in MANIFEST["transcripts"] if not t["stream"]]
Events = list[dict[str, Any]]


def _frames(transcript: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (ORACLE / transcript["file"]).read_text().splitlines()]


def _data(frame: dict[str, Any]) -> str:
    return str(frame["frame"]).split("data: ", 1)[1].rstrip("\n")


def _chunks(transcript: dict[str, Any]) -> list[list[int]]:
    ids = MANIFEST["scenarios"][transcript["scenario"]]["token_ids"]
    chunks, position = [], 0
    for size in transcript["chunk_sizes"]:
        chunks.append(ids[position : position + size])
        position += size
    if transcript["stop_mode"] == "stripped":
        chunks[-1] = chunks[-1][:-1]  # upstream cut the stop token from the last output
    return chunks


def _ctx(created: dict[str, Any] | None = None) -> ResponseContext:
    """The context of the recordings (their request echo read back from `response.created`)."""
    response = created or {"id": "resp_1", "created_at": 1767225600.0, "model": "m"}
    echo = {key: response[key] for key in DEFAULT_ECHO if key in response}
    return ResponseContext(response["id"], response["created_at"], response["model"], echo)


def _compact(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def _as_compared(data: str) -> str:
    """An event's JSON with the deliberate departures from upstream in one form (the
    response object follows OpenAI's spec: `tests/spec_departures.py`); everything else, key
    order included, byte for byte."""
    return _compact(normalised(json.loads(data)))


def _first_difference(got: Sequence[str], expected: Sequence[str]) -> str:
    for index, (ours, theirs) in enumerate(zip(got, expected, strict=False)):
        if ours != theirs:
            return f"event {index} differs:\n  ours:     {ours[:700]}\n  upstream: {theirs[:700]}"
    return f"{len(got)} events, upstream sent {len(expected)}: {(got or expected)[-1][:300]}"


# -- the recordings ------------------------------------------------------------------------


@pytest.mark.parametrize("transcript", STREAMS, ids=lambda t: t["file"])
def test_transcript_reproduced(encoding: HarmonyEncoding, transcript: dict[str, Any]) -> None:
    frames = _frames(transcript)
    assert not any("stream_aborted_with" in frame for frame in frames)
    expected = [_data(frame) for frame in frames]
    stop_reason = CALL if transcript["scenario"] == "s2_reasoning_function_call" else None
    # Upstream drew uuids 1 and 2 before the snapshot (the response id among them).
    stream = UnpatchedStream(encoding, _ctx(json.loads(expected[0])["response"]), CountingIds(3))

    opening = [_compact(event) for event in stream.start()]
    steps = [[_compact(event) for event in stream.feed(chunk)] for chunk in _chunks(transcript)]
    steps[-1] += [_compact(event) for event in stream.finish("stop", stop_reason)]
    got = [_as_compared(event) for event in opening + [e for step in steps for e in step]]
    expected = [_as_compared(event) for event in expected]

    assert got == expected, _first_difference(got, expected)
    # Each engine output gives exactly the frames upstream sent while processing it.
    for step, events in enumerate(steps):
        recorded = [_as_compared(_data(f)) for f in frames if f["engine_step"] == step]
        events = [_as_compared(event) for event in events]
        assert events == recorded, f"engine output {step}: " + _first_difference(events, recorded)
    assert stream.aborted is None


@pytest.mark.parametrize("transcript", NONSTREAMS, ids=lambda t: t["file"])
def test_nonstream_output_reproduced(encoding: HarmonyEncoding, transcript: dict[str, Any]) -> None:
    ids = list(MANIFEST["scenarios"][transcript["scenario"]]["token_ids"])
    if transcript["stop_mode"] == "stripped":
        ids = ids[:-1]
    body = json.loads((ORACLE / transcript["file"]).read_text())["body"]
    output = unpatched_output(encoding, ids, CountingIds(3))
    assert [_compact(item) for item in output] == [_compact(item) for item in body["output"]]


REPORT_CHECKS: list[str] = sorted(MANIFEST["published_bug_report_check"], key=len)  # 1, 2, 20


@pytest.mark.parametrize("n", REPORT_CHECKS)
def test_published_bug_report_figures(encoding: HarmonyEncoding, n: str) -> None:
    figures = MANIFEST["published_bug_report_check"][n]
    ids = MANIFEST["scenarios"]["s1_reasoning_final"]["token_ids"]
    stream = UnpatchedStream(encoding, _ctx(), CountingIds(3))
    events = stream.start()
    for position in range(0, len(ids), int(n)):
        events += stream.feed(ids[position : position + int(n)])
    events += stream.finish("stop", None)
    assert _joined(events, "response.reasoning_text.delta") == figures["reasoning"]
    assert _joined(events, "response.output_text.delta") == figures["text"]
    added = [[e["output_index"], e["item"]["type"]] for e in _of(events, "output_item.added")]
    assert added == figures["output_item_added"]
    if n == "20":  # the report: reasoning '.', text ' by'
        assert (figures["reasoning"], figures["text"]) == (".", " by")


def _of(events: Events, suffix: str) -> Events:
    return [event for event in events if event["type"].endswith(suffix)]


def _joined(events: Events, type_: str) -> str:
    return "".join(event["delta"] for event in events if event["type"] == type_)


# -- quirks the recordings do not show ------------------------------------------------------


def _ids(encoding: HarmonyEncoding, text: str) -> list[int]:
    return list(encoding.encode(text, allowed_special="all"))


REASONING = "<|channel|>analysis<|message|>Think about it.<|end|>"
ANSWER = "<|start|>assistant<|channel|>final<|message|>The answer is here.<|return|>"


def _run(
    encoding: HarmonyEncoding,
    chunks: Sequence[Sequence[int]],
    finish: str | None = "stop",
    **options: Any,
) -> tuple[Events, UnpatchedStream]:
    stream = UnpatchedStream(encoding, _ctx(), CountingIds(), **options)
    events = stream.start()
    for chunk in chunks:
        events += stream.feed(chunk)
    return events + stream.finish(finish, None), stream


def test_length_cut_completes_incomplete_without_done_events(encoding: HarmonyEncoding) -> None:
    ids = _ids(encoding, REASONING + ANSWER)[:-3]  # cut inside the answer
    events, stream = _run(encoding, [[i] for i in ids], "length")
    assert [e["type"] for e in events[-3:]] == [
        "response.output_text.delta",
        "response.output_text.delta",
        "response.completed",
    ]
    assert not _of(events, "output_text.done")
    assert not _of(events, "content_part.done")
    response = events[-1]["response"]
    # upstream sends `usage: null`; OpenAI's spec has no null for it, so the key is left out
    assert (response["status"], response["incomplete_details"], response.get("usage")) == (
        "incomplete",
        None,
        None,
    )
    assert response["output"][1]["content"][0]["text"] == "The answer is"
    assert stream.aborted is None


def test_cut_inside_a_header_breaks_the_stream(encoding: HarmonyEncoding) -> None:
    reasoning, header = (
        _ids(encoding, REASONING),
        _ids(encoding, "<|start|>assistant<|channel|>fin"),
    )
    events, stream = _run(encoding, [reasoning, header], "length")
    assert [e["type"] for e in events[2:]] == [
        "response.reasoning_text.done",
        "response.output_item.done",
    ]  # and no terminal event: the snapshot builder raised
    assert stream.aborted == "Unexpected EOS while waiting for message header to complete"
    assert stream.unsent_events == 0


def test_builder_failure_loses_the_last_output(encoding: HarmonyEncoding) -> None:
    call = _ids(encoding, "<|channel|>commentary to=container.exec<|message|>ls<|call|>")
    events, stream = _run(encoding, [call, _ids(encoding, ANSWER)])
    assert stream.aborted == "Unknown recipient: container.exec"
    # Upstream raised in the post-processor of the last output: its three done events and
    # the terminal event were never sent.
    assert stream.unsent_events == 3
    assert [e["type"] for e in events[-3:]] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]


@pytest.mark.parametrize(
    ("reason", "status"), [("timeout", "failed"), ("cancelled", "cancelled"), ("stop", "completed")]
)
def test_finish_reason_sets_the_status(encoding: HarmonyEncoding, reason: str, status: str) -> None:
    events, _ = _run(encoding, [_ids(encoding, REASONING + ANSWER)], reason)
    assert (events[-1]["type"], events[-1]["response"]["status"]) == ("response.completed", status)


@pytest.mark.parametrize("reason", [None, "error", "abort"])
def test_unknown_finish_reason_breaks_the_stream(encoding: HarmonyEncoding, reason: Any) -> None:
    events, stream = _run(encoding, [_ids(encoding, REASONING + ANSWER)], reason)
    assert events[-1]["type"] != "response.completed"
    assert stream.aborted == "Should never reach here!"
    assert stream.unsent_events == 3  # the answer's done events, lost with the last output


def test_postprocess_workers_restart_sequence_numbers(encoding: HarmonyEncoding) -> None:
    ids = _ids(encoding, REASONING + ANSWER)
    plain, _ = _run(encoding, [[i] for i in ids])
    events, _ = _run(encoding, [[i] for i in ids], postprocess_workers=True)
    assert [e["sequence_number"] for e in events] == [0, 1, *range(len(events) - 2)]
    assert [e["type"] for e in events] == [e["type"] for e in plain]


def test_output_without_new_tokens_repeats_the_previous_delta(encoding: HarmonyEncoding) -> None:
    ids = _ids(encoding, "<|channel|>analysis<|message|>Think about it")
    events, _ = _run(encoding, [ids, [], []])
    deltas = _of(events, "reasoning_text.delta")
    assert [e["delta"] for e in deltas] == [" it", " it", " it"]
    assert [e["sequence_number"] for e in deltas] == [4, 5, 6]


def test_empty_outputs_after_a_message_repeat_its_done_events(encoding: HarmonyEncoding) -> None:
    events, _ = _run(encoding, [_ids(encoding, REASONING), [], []])
    done = _of(events, "output_item.done")
    assert [(e["output_index"], e["item"]["content"][0]["text"]) for e in done] == [
        (1, "Think about it."),
        (2, "Think about it."),
        (3, "Think about it."),
    ]


def test_message_boundary_inside_an_output_is_missed(encoding: HarmonyEncoding) -> None:
    reasoning, answer = _ids(encoding, REASONING), _ids(encoding, ANSWER)
    events, _ = _run(encoding, [reasoning[:-1], reasoning[-1:] + answer[:-1], answer[-1:]])
    assert [(e["output_index"], e["item"]["type"]) for e in _of(events, "item.added")] == [
        (0, "reasoning")
    ]
    (text_delta,) = _of(events, "output_text.delta")
    assert (text_delta["output_index"], text_delta["delta"]) == (0, ".")
    assert not _of(events, "reasoning_text.done")


def test_tool_calls_and_preambles_are_never_streamed(encoding: HarmonyEncoding) -> None:
    text = (
        REASONING + "<|start|>assistant<|channel|>commentary<|message|>One moment.<|end|>"
        "<|start|>assistant<|channel|>commentary to=browser.search <|constrain|>json<|message|>"
        '{"query": "weather"}<|call|>'
    )
    events, _ = _run(encoding, [[i] for i in _ids(encoding, text)])
    streamed = {e["item"]["type"] for e in _of(events, "item.added") + _of(events, "item.done")}
    assert streamed == {"reasoning"}
    assert not _of(events, "output_text.delta")
    output = events[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "web_search_call"]
    assert output[1]["action"]["query"] == "cursor:weather"


def test_analysis_with_a_recipient_is_not_streamed(encoding: HarmonyEncoding) -> None:
    text = "<|channel|>analysis to=python<|message|>print(1)<|call|>"
    events, _ = _run(encoding, [[i] for i in _ids(encoding, text)])
    assert [e["type"] for e in events[2:]] == ["response.completed"]
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "print(1)"


def test_snapshot_leaves_out_other_authors(encoding: HarmonyEncoding) -> None:
    text = (
        REASONING + "<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>{}"
        "<|end|><|start|>user<|message|>Thanks<|end|>" + ANSWER
    )
    ids = _ids(encoding, text)
    events, _ = _run(encoding, [ids[i : i + 3] for i in range(0, len(ids), 3)])
    output = events[-1]["response"]["output"]
    assert output == unpatched_output(encoding, ids, CountingIds())
    assert [item["type"] for item in output] == ["reasoning", "message"]


def test_rejected_id_cuts_the_rest_of_its_output(encoding: HarmonyEncoding) -> None:
    # <|end|> twice: the second is rejected and the answer in the same output is never parsed,
    # so every later output is rejected too (the parser still waits for <|start|>).
    reasoning, answer = _ids(encoding, REASONING), _ids(encoding, ANSWER)
    events, stream = _run(encoding, [reasoning, [END, *answer[:-1]], answer[-1:]])
    assert [e["output_index"] for e in _of(events, "item.done")] == [1]
    assert not _of(events, "output_text.delta")
    assert stream.aborted is not None  # the snapshot builder rejects the ids too


def test_rejected_header_still_moves_the_index(encoding: HarmonyEncoding) -> None:
    # An unknown role fails the header at <|message|>: the parser waits for <|start|> again,
    # every output re-counts the index, and the last closed message is closed again.
    outputs = [_ids(encoding, REASONING), _ids(encoding, "<|start|>foo<|message|>"), []]
    events, stream = _run(encoding, [*outputs, _ids(encoding, ANSWER)])
    assert stream.aborted == "Unknown role: foo"  # the snapshot builder fails on it too
    assert _brief(events[2:]) == [
        ("reasoning_text.done", 1, "Think about it."),
        ("item.done", 1),
        ("reasoning_text.done", 3, "Think about it."),
        ("item.done", 3),
        ("output_text.done", 4, "The answer is here."),
        ("part.done", 4),
        ("item.done", 4),
    ]


def test_out_of_vocab_id_in_content(encoding: HarmonyEncoding) -> None:
    ids = [*_ids(encoding, "<|channel|>analysis<|message|> ok"), 10**9, *_ids(encoding, " x")]
    events, stream = _run(encoding, [ids, [END]])
    assert _of(events, "reasoning_text.done")[0]["text"] == " ok\ufffd"
    assert stream.aborted is None


def test_id_outside_u32_breaks_the_stream_without_raising(encoding: HarmonyEncoding) -> None:
    events, stream = _run(encoding, [_ids(encoding, REASONING), [-1], [START]])
    assert events[-1]["type"] == "response.output_item.done"
    assert stream.aborted is not None
    assert stream.unsent_events == 0


def test_misuse_raises(encoding: HarmonyEncoding) -> None:
    stream = UnpatchedStream(encoding, _ctx(), CountingIds())
    with pytest.raises(RuntimeError, match="expected started"):
        stream.feed([1])
    stream.start()
    stream.finish("stop", None)
    with pytest.raises(RuntimeError, match="is finished"):
        stream.finish("stop", None)


class _GuardedParser(StreamableParser):
    """A parser whose O(n) properties fail the test when read."""

    @property
    def state(self) -> StreamState:
        raise AssertionError("parser.state read")

    @property
    def state_data(self) -> dict[str, Any]:
        raise AssertionError("parser.state_data read")

    @property
    def messages(self) -> Any:
        raise AssertionError("parser.messages read")


@pytest.mark.parametrize("size", [1, 3, 20])
def test_never_reads_the_parsers_whole_state(encoding: HarmonyEncoding, size: int) -> None:
    long_reasoning = "<|channel|>analysis<|message|>" + "Think about it. " * 200 + "<|end|>"
    ids = _ids(encoding, long_reasoning + ANSWER)
    stream = UnpatchedStream(encoding, _ctx(), CountingIds())
    stream._parser = _GuardedParser(encoding, Role.ASSISTANT)
    events = stream.start()
    for position in range(0, len(ids), size):
        events += stream.feed(ids[position : position + size])
    events += stream.finish("stop", None)
    assert events[-1]["response"]["status"] == "completed"


# -- the non-streaming builder for every recipient and channel ------------------------------


def _output(encoding: HarmonyEncoding, text: str) -> Events:
    return unpatched_output(encoding, _ids(encoding, text), CountingIds())


def _dump(model: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump()
    return dumped


def test_browser_calls_become_web_search_calls(encoding: HarmonyEncoding) -> None:
    head = "<|channel|>commentary to=browser."
    search = _output(encoding, head + 'search <|constrain|>json<|message|>{"query":"q"}<|call|>')
    action: Any = ActionSearch(query="cursor:q", type="search")
    expected = ResponseFunctionWebSearch(
        id=f"ws_{1:032x}", action=action, status="completed", type="web_search_call"
    )
    assert search == [_dump(expected)]
    # On any channel, and a missing url is "".
    opened = _output(encoding, "<|channel|>analysis to=browser.open<|message|>{}<|call|>")
    action = ActionOpenPage(url="cursor:", type="open_page")
    assert opened == [_dump(expected.model_copy(update={"action": action}))]


def test_function_call_items(encoding: HarmonyEncoding) -> None:
    text = (
        '<|channel|>commentary to=functions.ns.lookup <|constrain|>json<|message|>{"a":1}<|call|>'
    )
    expected = ResponseFunctionToolCall(
        arguments='{"a":1}',
        call_id=f"call_{1:032x}",
        name="lookup",  # the last dotted part
        type="function_call",
        id=f"fc_{2:032x}",
    )
    assert _output(encoding, text) == [_dump(expected)]


@pytest.mark.parametrize(
    "header",
    [
        "<|channel|>commentary to=python",
        "<|channel|>commentary to=browser",
        "<|channel|>analysis to=functions.lookup",
        "<|channel|>analysis to=container.exec",
    ],
)
def test_recipients_that_become_reasoning(encoding: HarmonyEncoding, header: str) -> None:
    expected = ResponseReasoningItem.model_validate(
        {
            "id": f"rs_{1:032x}",
            "summary": [],
            "type": "reasoning",
            "content": [{"text": "x = 1", "type": "reasoning_text"}],
        }
    )
    assert _output(encoding, header + "<|message|>x = 1<|call|>") == [_dump(expected)]


def test_final_with_a_recipient_is_a_message(encoding: HarmonyEncoding) -> None:
    (item,) = _output(encoding, "<|channel|>final to=functions.x<|message|>Hi<|return|>")
    assert (item["type"], item["content"][0]["text"], item["status"]) == (
        "message",
        "Hi",
        "completed",
    )


def test_messages_from_other_authors_are_left_out(encoding: HarmonyEncoding) -> None:
    text = (
        "<|channel|>final<|message|>Hi<|end|>"
        "<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>{}<|end|>"
        "<|start|>user<|message|>Thanks<|end|>"
    )
    assert [item["type"] for item in _output(encoding, text)] == ["message"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<|channel|>commentary to=container.exec<|message|>ls<|call|>", "Unknown recipient: "),
        ("<|message|>No channel.<|end|>", "Unknown channel: None"),
        ("<|channel|>other<|message|>x<|end|>", "Unknown channel: other"),
        ("<|channel|>commentary to=browser.find<|message|>{}<|call|>", "'pattern'"),
        (
            '<|channel|>commentary to=browser.find<|message|>{"pattern":"p"}<|call|>',
            "validation error for ActionFind",
        ),
        ("<|channel|>commentary to=browser.scroll<|message|>{}<|call|>", "Unknown browser action"),
        ("<|channel|>commentary to=browser.open<|message|>not json<|call|>", "Expecting value"),
        ("<|channel|>commentary to=browser.open<|message|>[1]<|call|>", "'list' object has no"),
        ("<|channel|>final<|message|>Hi<|end|><|start|>assistant", "Unexpected EOS"),
        ("", "Unexpected EOS"),
        ("<|channel|>final<|message|>Hi<|end|>Hi", "Unexpected token"),
    ],
)
def test_what_upstreams_builder_rejects(encoding: HarmonyEncoding, text: str, message: str) -> None:
    with pytest.raises(UpstreamOutputError, match=message.replace("(", r"\(")):
        _output(encoding, text)


def test_ids_outside_u32_are_rejected(encoding: HarmonyEncoding) -> None:
    with pytest.raises(UpstreamOutputError):
        unpatched_output(encoding, [2**40], CountingIds())


# -- upstream's algorithm, read literally, on random input ----------------------------------


class _Upstream:
    """`_generate_streaming_event_harmony` as upstream writes it: state and messages per output."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.parser = StreamableParser(encoding, role=Role.ASSISTANT)
        self.index, self.added = 0, False

    def feed(self, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        try:
            for token in ids:
                self.parser.process(token)
            messages = self.parser.messages
        except (HarmonyError, UnicodeDecodeError, ValueError):
            messages = []
        if self.parser.state == StreamState.EXPECT_START:
            self.index += 1
            self.added = False
            if messages and messages[-1].recipient is None:
                text = getattr(messages[-1].content[0], "text", None)
                if messages[-1].channel == "analysis":
                    out += [("reasoning_text.done", self.index, text), ("item.done", self.index)]
                elif messages[-1].channel == "final":
                    out += [("output_text.done", self.index, text), ("part.done", self.index)]
                    out += [("item.done", self.index)]
        delta = self.parser.last_content_delta
        if delta and self.parser.current_recipient is None:
            kind = {"final": "output_text", "analysis": "reasoning_text"}
            channel = self.parser.current_channel
            if channel in kind:
                if not self.added:
                    self.added = True
                    out += [("item.added", self.index), ("part.added", self.index)]
                out += [(f"{kind[channel]}.delta", self.index, delta)]
        return out


def _brief(events: Events) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for event in events:
        kind = event["type"].removeprefix("response.").replace("content_part", "part")
        kind = kind.replace("output_item", "item")
        value = event.get("delta", event.get("text"))
        out.append((kind, event["output_index"]) + (() if value is None else (value,)))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), finish=st.sampled_from(["stop", "length", None]))
def test_matches_upstreams_algorithm_on_random_input(
    encoding: HarmonyEncoding, data: st.DataObject, finish: str | None
) -> None:
    outputs = data.draw(engine_outputs(encoding))
    upstream = _Upstream(encoding)
    stream = UnpatchedStream(encoding, _ctx(), CountingIds())
    stream.start()
    for ids in outputs:
        assert _brief(stream.feed(ids)) == upstream.feed(ids), outputs
    tail = stream.finish(finish, None)
    all_ids = [token for ids in outputs for token in ids]
    try:
        expected = unpatched_output(encoding, all_ids, CountingIds())
    except UpstreamOutputError:
        assert tail == []
        assert stream.aborted is not None
    else:
        if finish is None:
            assert tail == []
            assert stream.aborted == "Should never reach here!"
        else:
            assert [e["response"]["output"] for e in tail] == [expected]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    outputs=st.lists(
        st.lists(st.integers(-(2**40), 2**40) | st.sampled_from([END, START])), max_size=6
    ),
    finish=st.sampled_from(["stop", "length", "timeout", None, "bogus"]),
)
def test_malformed_ids_never_raise(
    encoding: HarmonyEncoding, outputs: list[list[int]], finish: str | None
) -> None:
    stream = UnpatchedStream(encoding, _ctx(), CountingIds())
    events = stream.start()
    for ids in outputs:
        events += stream.feed(ids)
    events += stream.finish(finish, None)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert (stream.aborted is None) == (events[-1]["type"] == "response.completed")
