"""`items.kept`: a closed item kept until the response's end gives back the item it was, and
holds its text as UTF-8 only where that is smaller."""

from __future__ import annotations

import copy
import sys

import orjson

from proxy.harmony.stream import events as ev
from proxy.harmony.stream.items import KeptItem, kept, shown

EMOJI = "Emoji take several tokens each: 🎉 🦜 ⏳ 👩‍💻. " * 20


def _items(text: str) -> list[ev.Item]:
    return [
        ev.message_item("msg_1", text, "completed", "final_answer", [{"token": "x"}]),
        ev.reasoning_item("rs_1", text, "completed", "sealed"),
        ev.function_call_item("fc_1", "call_1", "f", None, text, "completed"),
    ]


def test_an_item_with_emoji_is_kept_as_utf8_and_given_back_equal() -> None:
    for item in _items(EMOJI):
        sent = copy.deepcopy(item)
        made = kept(item)
        assert isinstance(made, KeptItem)
        assert item == sent  # the item sent is not touched
        assert orjson.dumps(shown(made)) == orjson.dumps(sent)  # key order too
        assert sys.getsizeof(made._utf8) < sys.getsizeof(EMOJI) / 2


def test_ascii_and_two_byte_texts_and_items_without_text_stay_as_they_are() -> None:
    for text in ("plain text " * 50, "東京と大阪は日本の都市です。" * 20):
        for item in _items(text):
            assert kept(item) is item
            assert shown(item) is item
    searched = ev.web_search_item("ws_1", {"type": "search", "query": "q"}, "completed")
    assert kept(searched) is searched
    empty = ev.message_item("msg_2", None, "incomplete", "final_answer")
    assert kept(empty) is empty
