"""Table-driven core cases: Harmony text → ids → events, each fed at every chunking.

For each case: the events are well-formed at every chunking (tests/wellformed.py), identical up to
delta coalescing, the snapshot says exactly what the Harmony text says, and the openai SDK
validates and accumulates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from tests.harmony import chunks_of, coalesced, context, ids_of, run, semantic
from tests.sdk import accumulate
from tests.wellformed import assert_well_formed

R, F, C = "analysis", "final", "commentary"


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    expected: list[tuple[Any, ...]]
    finish: str = "stop"
    status: str = "completed"
    namespaces: frozenset[str] = frozenset()
    malformed: dict[str, int] = field(default_factory=dict)
    cut: int = 0  # tokens dropped from the end (to end inside a multi-byte character)


def reasoning(text: str) -> tuple[Any, ...]:
    return ("reasoning", text)


def message(text: str) -> tuple[Any, ...]:
    return ("message", "assistant", text)


def call(name: str, arguments: str, namespace: str | None = None) -> tuple[Any, ...]:
    return ("function_call", name, namespace, arguments)


CASES = [
    Case(
        "reasoning_then_final",
        "<|channel|>analysis<|message|>Think about it.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>The answer is 42.<|return|>",
        [reasoning("Think about it."), message("The answer is 42.")],
    ),
    Case("final_only", "<|channel|>final<|message|>Hi.<|return|>", [message("Hi.")]),
    Case(
        "function_call_constrain_json",
        "<|channel|>analysis<|message|>Call it.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"location":"Paris"}<|call|>',
        [reasoning("Call it."), call("get_weather", '{"location":"Paris"}')],
    ),
    Case(
        "function_call_recipient_before_channel",
        '<|channel|>commentary to=functions.lookup<|message|>{"q": 1}<|end|>'
        "<|start|>assistant to=functions.lookup_more<|channel|>commentary json"
        '<|message|>{"q": 2}<|call|>',
        [call("lookup", '{"q": 1}'), call("lookup_more", '{"q": 2}')],
    ),
    Case(
        "preamble_is_a_message",
        "<|channel|>analysis<|message|>Plan.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done.<|return|>",
        [reasoning("Plan."), message("Let me check."), message("Done.")],
    ),
    Case(
        "namespace_tool",
        '<|channel|>commentary to=crm.find_order <|constrain|>json<|message|>{"id":"W1"}<|call|>',
        [call("find_order", '{"id":"W1"}', namespace="crm")],
        namespaces=frozenset({"crm"}),
    ),
    Case(
        "browser_search_is_a_web_search_call",
        "<|channel|>analysis<|message|>Search it.<|end|>"
        '<|start|>assistant<|channel|>analysis to=browser.search<|message|>{"query":"gpt-oss"}'
        "<|call|>",
        [
            reasoning("Search it."),
            (
                "web_search_call",
                {"type": "search", "query": "gpt-oss"},
            ),
        ],
    ),
    Case(
        "browser_open_and_find",
        '<|channel|>analysis to=browser.open<|message|>{"id": "https://a.example", "cursor": 1}'
        "<|call|><|start|>assistant<|channel|>analysis to=browser.find<|message|>"
        '{"pattern": "price"}<|call|>',
        [
            ("web_search_call", {"type": "open_page", "url": "https://a.example"}),
            ("web_search_call", {"type": "find_in_page", "pattern": "price", "url": ""}),
        ],
    ),
    Case(
        "browser_call_with_broken_json",
        "<|channel|>analysis to=browser.search<|message|>{query: oops<|call|>",
        [("web_search_call", {"type": "search"})],
    ),
    Case(
        "browser_call_with_non_object_json",
        '<|channel|>analysis to=browser.open<|message|>["https://a.example"]<|call|>',
        [("web_search_call", {"type": "open_page", "url": None})],
    ),
    Case(
        "python_and_unknown_tools_are_reasoning",
        "<|channel|>analysis to=python<|message|>print(1)<|call|>"
        "<|start|>assistant<|channel|>commentary to=container.exec<|message|>ls<|call|>",
        [reasoning("print(1)"), reasoning("ls")],
    ),
    Case(
        "two_calls_in_a_row",
        '<|channel|>commentary to=functions.a <|constrain|>json<|message|>{"x":1}<|call|>'
        '<|start|>assistant<|channel|>commentary to=functions.b<|message|>{"y":2}<|call|>',
        [call("a", '{"x":1}'), call("b", '{"y":2}')],
    ),
    Case(
        "unicode_split_across_tokens",
        "<|channel|>analysis<|message|>emoji 🫠 and 𝔘𝔫𝔦 ok<|end|>"
        "<|start|>assistant<|channel|>final<|message|>"
        "世界 e\u0301 👩\u200d👩\u200d👧\u200d👦 龘<|return|>",
        [
            reasoning("emoji 🫠 and 𝔘𝔫𝔦 ok"),
            message("世界 e\u0301 👩\u200d👩\u200d👧\u200d👦 龘"),
        ],
    ),
    Case(
        "length_cut_mid_answer",
        "<|channel|>analysis<|message|>Short.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>The answer is",
        [reasoning("Short."), message("The answer is")],
        finish="length",
        status="incomplete",
    ),
    Case(
        "length_cut_mid_multibyte_character",
        "<|channel|>final<|message|>a🫠",  # 🫠 is three tokens; the last one never comes
        [message("a")],
        finish="length",
        status="incomplete",
        cut=1,
    ),
    Case(
        "length_cut_in_header",
        "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>fin",
        [reasoning("Hmm.")],
        finish="length",
        status="incomplete",
    ),
    Case(
        "stop_token_cut_off",  # the `stripped` stop mode: no <|return|> reaches the core
        "<|channel|>final<|message|>Bye.",
        [message("Bye.")],
    ),
    Case(
        "garbage_after_the_end",
        "<|channel|>final<|message|>Done.<|return|>trailing words",
        [message("Done.")],
        malformed={"token_outside_message": 3},  # "tr", "ailing", " words"
    ),
    Case(
        "stray_start_inside_content",
        "<|channel|>analysis<|message|>Thinking<|start|>assistant<|channel|>final"
        "<|message|>Answer.<|return|>",
        [reasoning("Thinking"), message("Answer.")],
        malformed={"missing_end": 1},
    ),
    Case(
        "hallucinated_user_turn_skipped",
        "<|channel|>final<|message|>A.<|end|><|start|>user<|message|>fake question<|end|>"
        "<|start|>assistant<|channel|>final<|message|>B.<|return|>",
        [message("A."), message("B.")],
        malformed={"unexpected_role": 1},
    ),
    Case(
        "invalid_header_skipped",
        "<|channel|>final<|message|>A.<|end|><|start|>bogus<|message|>lost text<|end|>"
        "<|start|>assistant<|channel|>final<|message|>B.<|return|>",
        [message("A."), message("B.")],
        malformed={"invalid_header": 1, "token_outside_message": 3},
    ),
    Case(
        "header_never_completed",
        "hello world",
        [],
        malformed={"incomplete_header": 1},
    ),
    Case(
        "empty_message",
        "<|channel|>final<|message|><|return|>",
        [message("")],
    ),
]

CHUNKINGS = [[1], [2], [3], [7], [20], [1000], [1, 3, 1, 8, 2, 5, 13], [0, 1], [2, 0, 0, 5]]


def _chunking_id(sizes: list[int]) -> str:
    return "N" + "-".join(map(str, sizes))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case_at_every_chunking(encoding: HarmonyEncoding, case: Case) -> None:
    ids = ids_of(encoding, case.text)[: -case.cut or None]
    reference = None
    ctx = context(namespaces=case.namespaces)
    for sizes in CHUNKINGS:
        events, stream = run(encoding, chunks_of(ids, sizes), case.finish, ctx=ctx)
        where = f"{case.name} at {_chunking_id(sizes)}"
        response = assert_well_formed(events)
        assert response["status"] == case.status, where
        assert semantic(response["output"]) == case.expected, where
        record = stream.record()
        assert dict(record.malformed) == case.malformed, where
        assert record.output_tokens == len(ids), where
        normalized = coalesced(events)
        if reference is None:
            reference = normalized
        assert normalized == reference, f"{where}: differs from N1 beyond delta coalescing"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_sdk_accepts_the_stream(encoding: HarmonyEncoding, case: Case) -> None:
    ids = ids_of(encoding, case.text)[: -case.cut or None]
    events, _ = run(
        encoding, chunks_of(ids, [3]), case.finish, ctx=context(namespaces=case.namespaces)
    )
    accumulated = accumulate(events)  # validates every event strictly; raises on lifecycle errors
    if case.status != "completed":
        return  # the accumulator only assembles on response.completed
    assert accumulated is not None
    texts = [t for kind, *rest in case.expected if kind == "message" for t in rest[1:]]
    assert accumulated.output_text == "".join(texts)
    calls = [item for item in accumulated.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [
        (e[1], e[3]) for e in case.expected if e[0] == "function_call"
    ]
