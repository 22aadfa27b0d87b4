"""`assert_well_formed(events)`: every rule of a correct Responses stream, in one place.

The rules (what openai-python's types, OpenAI's own streams and strict clients — the SDK's
stream helpers, Codex, the Vercel AI SDK, LangChain — require), numbered as the messages below
cite them:

1. One Harmony message is one output item; every event of an item carries its `output_index`
   (its position in the final `output`) and its `item_id`; `added`, `done` and the snapshot
   entry share one id.
2. `sequence_number` counts 0, 1, 2, … with no gap and no restart; the response id never
   changes.
3. An item is announced (`output_item.added`, and `content_part.added` for messages and
   reasoning) before its first delta.
4. Item k is closed with all its done events before anything of item k+1.
5. An item's deltas concatenate to exactly its done text, the snapshot's text; no delta carries
   a broken multi-byte character.
6. Function calls: `name` from the recipient, `arguments` the raw JSON text (never header
   tokens such as `<|constrain|>json`), ids `call_…` and `fc_…`.
7. A commentary message without recipient (a preamble) is a message item, not dropped (the core
   tests check it: a dropped preamble leaves no trace in the events).
8. Exactly one terminal event: `response.completed`, `response.incomplete`
   (`max_output_tokens`, open items closed `incomplete`), or `error` then `response.failed`.
9. The terminal snapshot's `output` equals the done items; `usage` is numeric. A `compaction`
   item (made before generation) is announced whole and closed by the next event.
10. The fields strict clients read are present (`sequence_number` everywhere, `logprobs` lists
    on text events, `status` on every item, `summary` on reasoning items, the response's `id`,
    `created_at`, `model`, `object`, `output`, `parallel_tool_calls`, `tool_choice`, `tools`).

Used at every layer: the core's events, the SSE the server writes, streams read back by clients.
Every event, and every `response` object inside one, is also validated against OpenAI's OpenAPI
description (`tests/openapi.py`), so every scenario a test runs is checked against it. Returns
the terminal response so callers can assert on it further.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.openapi import assert_events_match_spec

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
ID_PREFIX = {
    "reasoning": "rs_",
    "message": "msg_",
    "function_call": "fc_",
    "web_search_call": "ws_",
}
WEB_SEARCH_STAGES = ("in_progress", "searching", "completed")
PART_TYPE = {"reasoning": "reasoning_text", "message": "output_text"}
DELTA_TYPE = {
    "reasoning": "response.reasoning_text.delta",
    "message": "response.output_text.delta",
    "function_call": "response.function_call_arguments.delta",
}
TEXT_DONE_TYPE = {
    "reasoning": "response.reasoning_text.done",
    "message": "response.output_text.done",
    "function_call": "response.function_call_arguments.done",
}


class _Open:
    def __init__(self, index: int, item: dict[str, Any]) -> None:
        self.index = index
        self.item = item
        self.kind = item["type"]
        self.id = item["id"]
        self.text: list[str] = []
        self.part_added = False
        self.text_done: str | None = None
        self.part_done = False
        self.stages: list[str] = []
        self.logprobs: list[dict[str, Any]] = []


def _item_text(item: dict[str, Any]) -> str:
    if item["type"] == "web_search_call":
        return ""
    if item["type"] == "function_call":
        return str(item["arguments"])
    return "".join(part["text"] for part in item.get("content") or [])


def _check_usage(usage: Any) -> None:
    assert isinstance(usage, dict), f"terminal usage must be an object, got {usage!r}"
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert isinstance(usage[key], int), f"usage.{key} = {usage.get(key)!r}"
    assert isinstance(usage["input_tokens_details"]["cached_tokens"], int)
    assert isinstance(usage["input_tokens_details"]["cache_write_tokens"], int)
    assert isinstance(usage["output_tokens_details"]["reasoning_tokens"], int)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def _check_logprobs(where: str, entries: Any, text: str, *, exact: bool, cut: bool) -> None:
    """A message's logprob entries: OpenAI's `LogProb` shape, and — `exact` — their
    `bytes` concatenate to the text's UTF-8, byte for byte; `cut` (an incomplete item) allows
    the bytes of a character the end of generation cut off after them (at most 3)."""
    assert isinstance(entries, list), f"{where}: logprobs {entries!r}"
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}, f"{where}: {entry}"
        assert isinstance(entry["token"], str), where
        assert isinstance(entry["logprob"], float | int), where
        assert entry["logprob"] <= 0, where
        assert all(isinstance(b, int) and 0 <= b < 256 for b in entry["bytes"]), where
        for alternative in entry["top_logprobs"]:
            assert set(alternative) == {"token", "logprob", "bytes"}, f"{where}: {alternative}"
            assert bytes(alternative["bytes"]) == alternative["token"].encode(), where
    if exact:
        joined, data = b"".join(bytes(entry["bytes"]) for entry in entries), text.encode()
        if cut and joined != data:
            assert joined.startswith(data), f"{where}: token bytes {joined!r} != text {text!r}"
            rest = joined[len(data) :]
            assert len(rest) < 4, f"{where}: {rest!r} after the text"
            assert rest.decode(errors="replace") == "\ufffd", f"{where}: {rest!r} after the text"
        else:
            assert joined == data, f"{where}: token bytes {joined!r} != text {text!r}"


def assert_well_formed(
    events: Sequence[dict[str, Any]], *, invalid_utf8: bool = False, logprobs: bool = False
) -> dict[str, Any]:
    """Assert rules 1-10 of the module docstring (SDK model validation is `sdk.py`'s job).

    `invalid_utf8`: the model wrote bytes that are no UTF-8 at all (random ids), which the
    parser replaces with U+FFFD; otherwise a U+FFFD in a delta is a character broken by a split.
    `logprobs`: the request included `message.output_text.logprobs`: each answer
    message's deltas carry entries (a preamble's none) that add up to its done event's, part's
    and item's, whose bytes are its text's (unless `invalid_utf8`); without it every `logprobs`
    list is empty.
    """
    assert len(events) >= 3, f"a stream has at least created, in_progress, terminal: {events}"
    for number, event in enumerate(events):
        assert event.get("sequence_number") == number, (
            f"event {number} ({event.get('type')}) has sequence_number "
            f"{event.get('sequence_number')} (rule 2: dense from 0)"
        )
    assert events[0]["type"] == "response.created", events[0]["type"]
    assert events[1]["type"] == "response.in_progress", events[1]["type"]
    response_id = events[0]["response"]["id"]
    assert response_id.startswith("resp_"), response_id
    terminals = [e for e in events if e["type"] in TERMINAL]
    assert len(terminals) == 1, f"exactly one terminal event (rule 8), got {len(terminals)}"
    assert events[-1]["type"] in TERMINAL, f"the terminal event comes last: {events[-1]['type']}"

    done_items: list[dict[str, Any]] = []
    current: _Open | None = None
    seen_ids: set[str] = set()
    for number, event in enumerate(events):
        kind = event["type"]
        where = f"event {number} ({kind})"
        if "response" in event:
            assert event["response"]["id"] == response_id, f"{where}: response id changed"
            if kind in ("response.created", "response.in_progress"):
                assert number < 2, f"{where} after the opening events"
                assert event["response"]["status"] == "in_progress"
                assert event["response"]["output"] == []
            continue
        if kind == "error":
            assert events[number + 1]["type"] == "response.failed", f"{where}: must precede failed"
            assert isinstance(event["message"], str), where
            assert event["message"], f"{where}: empty error message"
            continue
        if kind == "response.output_item.added" and event["item"]["type"] == "compaction":
            # Made before generation (a compaction): whole in `added`, closed by the next event.
            item = event["item"]
            assert current is None, where
            assert event["output_index"] == len(done_items), where
            assert item["id"].startswith("cmp_"), where
            assert item["encrypted_content"], where
            closing = events[number + 1]
            assert closing["type"] == "response.output_item.done", f"{where}: not closed at once"
            assert closing["item"] == item, where
            continue
        if kind == "response.output_item.done" and event["item"]["type"] == "compaction":
            assert current is None, where
            assert event["output_index"] == len(done_items), where
            done_items.append(event["item"])
            seen_ids.add(event["item"]["id"])
            continue
        if kind == "response.output_item.added":
            assert current is None, f"{where}: item {current and current.index} still open (rule 4)"
            item = event["item"]
            assert event["output_index"] == len(done_items), (
                f"{where}: output_index {event['output_index']} != position {len(done_items)}"
            )
            prefix = ID_PREFIX.get(item["type"])
            assert prefix is not None, f"{where}: unexpected item type {item['type']}"
            assert item["id"].startswith(prefix), f"{where}: id {item['id']!r} (rule 1)"
            assert item["id"] not in seen_ids, f"{where}: duplicate item id {item['id']}"
            seen_ids.add(item["id"])
            assert item["status"] == "in_progress", where
            if item["type"] == "web_search_call":
                assert item["action"]["type"] in ("search", "open_page", "find_in_page"), where
            elif item["type"] == "function_call":
                assert item["call_id"].startswith("call_"), f"{where}: call_id {item['call_id']!r}"
                assert item["name"], f"{where}: function call without a name"
                assert item["arguments"] == "", where
            else:
                assert item["content"] == [], where
            if item["type"] == "reasoning":
                assert item["summary"] == [], where
            current = _Open(event["output_index"], item)
            continue
        assert current is not None, f"{where}: no item is open (rule 3)"
        if "item_id" in event:
            assert event["item_id"] == current.id, f"{where}: item_id {event['item_id']!r}"
        assert event["output_index"] == current.index, f"{where}: output_index (rule 1)"
        if current.kind == "web_search_call" and kind.startswith("response.web_search_call."):
            stage = kind.rsplit(".", 1)[1]
            assert stage in WEB_SEARCH_STAGES, where
            assert not current.stages or WEB_SEARCH_STAGES.index(stage) > WEB_SEARCH_STAGES.index(
                current.stages[-1]
            ), f"{where}: web search stages out of order"
            current.stages.append(stage)
            if stage == "completed":
                current.text_done = ""
            continue
        if kind == "response.content_part.added":
            assert current.kind in PART_TYPE, where
            assert not current.part_added, where
            assert not current.text, where
            assert event["content_index"] == 0, where
            assert event["part"]["type"] == PART_TYPE[current.kind], where
            assert event["part"]["text"] == "", where
            current.part_added = True
        elif kind == DELTA_TYPE.get(current.kind):
            assert current.text_done is None, f"{where}: delta after done"
            if current.kind in PART_TYPE:
                assert current.part_added, f"{where}: delta before content_part.added (rule 3)"
                assert event["content_index"] == 0, where
            delta = event["delta"]
            if current.kind == "message":
                # the answer's deltas carry their tokens' logprobs; preambles none
                if logprobs and current.item.get("phase") != "commentary":
                    assert event["logprobs"], f"{where}: a delta without its tokens' logprobs"
                    current.logprobs += event["logprobs"]
                else:
                    assert event["logprobs"] == [], where
            assert delta, f"{where}: empty delta"
            assert invalid_utf8 or "\ufffd" not in delta, (
                f"{where}: broken character in {delta!r} (rule 5)"
            )
            delta.encode("utf-8")  # raises on a lone surrogate
            current.text.append(delta)
        elif kind == TEXT_DONE_TYPE.get(current.kind):
            text = event["arguments"] if current.kind == "function_call" else event["text"]
            assert text == "".join(current.text), f"{where}: done text != deltas (rule 5)"
            current.text_done = text
            if current.kind == "message":
                assert event["logprobs"] == current.logprobs, f"{where}: logprobs != deltas'"
            if current.kind == "function_call":
                # Random ids (`invalid_utf8`) may write <|constrain|> as content, which
                # openai-harmony decodes as its text; a header's own must never leak.
                header = "<|constrain|>json" if invalid_utf8 else "<|constrain|>"
                assert header not in text, f"{where}: header in arguments (rule 6)"
                # OpenAI's spec requires the function's name on this event.
                assert event.get("name") == current.item["name"], f"{where}: name"
        elif kind == "response.content_part.done":
            assert current.text_done is not None, f"{where}: before the text done event"
            assert event["part"]["text"] == current.text_done, where
            assert event["part"]["type"] == PART_TYPE[current.kind], where
            if current.kind == "message":
                assert event["part"]["logprobs"] == current.logprobs, f"{where}: logprobs"
            current.part_done = True
        elif kind == "response.output_item.done":
            item = event["item"]
            assert current.text_done is not None, f"{where}: text done event missing"
            if current.kind == "web_search_call":
                assert current.stages[0] == "in_progress", where
                assert current.stages[-1] == "completed", where
            if current.kind in PART_TYPE:
                assert current.part_done, f"{where}: content_part.done missing"
            assert item["id"] == current.id, where
            assert item["type"] == current.kind, where
            assert item["status"] in ("completed", "incomplete"), (
                f"{where}: status {item['status']}"
            )
            assert _item_text(item) == current.text_done, f"{where}: item text != done text"
            if current.kind == "message":
                assert item["content"][0]["logprobs"] == current.logprobs, f"{where}: logprobs"
                if logprobs and item.get("phase") != "commentary":
                    cut = item["status"] == "incomplete"
                    text = current.text_done
                    _check_logprobs(where, current.logprobs, text, exact=not invalid_utf8, cut=cut)
            if current.kind == "function_call":
                added = current.item
                assert (item["call_id"], item["name"]) == (added["call_id"], added["name"]), where
                assert item.get("namespace") == added.get("namespace"), where
            done_items.append(item)
            current = None
        else:
            raise AssertionError(f"{where}: unexpected for a {current.kind} item")
    assert current is None, f"item {current.index} still open at the terminal event (rule 8)"

    terminal = events[-1]
    response = terminal["response"]
    status = {
        "response.completed": "completed",
        "response.incomplete": "incomplete",
        "response.failed": "failed",
    }[terminal["type"]]
    if status == "failed" and response["status"] == "cancelled":
        status = "cancelled"  # OpenAI's event set has no response.cancelled: response.failed
    assert response["status"] == status, f"terminal status {response['status']} != {status}"
    assert response["output"] == done_items, "snapshot output != the done items (rule 9)"
    _check_usage(response["usage"])
    if status == "completed":
        assert all(item.get("status", "completed") == "completed" for item in done_items), (
            "unfinished item"
        )
    if status == "incomplete":
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    if status == "failed":
        assert events[-2]["type"] == "error"
        # the snapshot's code is openai-python's closed set; the error event carries ours
        assert response["error"]["code"] in ("server_error", "rate_limit_exceeded")
        assert response["error"]["message"]
    else:
        assert response["error"] is None
    # The spec: `completed_at` is "only present when the status is `completed`".
    if status == "completed":
        completed_at = response.get("completed_at")
        assert isinstance(completed_at, int | float), f"completed_at {completed_at!r}"
        assert completed_at >= response["created_at"], "completed before it was created"
    else:
        assert response.get("completed_at") is None, f"completed_at on a {status} response"
    for key in ("id", "created_at", "model", "object", "output", "parallel_tool_calls"):
        assert key in response, f"snapshot lacks {key} (rule 10)"
    assert "tool_choice" in response
    assert "tools" in response
    assert_events_match_spec(events)
    return response
