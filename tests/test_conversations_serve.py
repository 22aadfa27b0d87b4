"""Conversations on real `serve` processes: every call through the strict
`openai` SDK (answers checked against OpenAI's spec), with two proxy processes on one store —
the embedded one in a shared data directory (the processes of one host) and a real Redis
(replicas) — appending to one conversation at once from both. Each `serve` runs its built-in
simulator as upstream."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.conversations_support import SpecLog, dumped_items
from tests.stateful_support import MODEL, TOOLS
from tests.test_stateful_serve import serving


@pytest.fixture
def spec() -> Iterator[SpecLog]:
    log = SpecLog()
    yield log
    log.close_clients()


@pytest.fixture(params=["embedded", "redis"])
def two_processes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two proxy processes on one store (as in test_stateful_serve.py)."""
    if request.param == "embedded":
        shared = ("--data-dir", str(tmp_path / "data"))
    else:
        shared = ("--store-url", request.getfixturevalue("redis_url") + f"?prefix={tmp_path.name}:")
    with serving(*shared) as first, serving(*shared) as second:
        yield first + "/v1", second + "/v1"


def listed(client: OpenAI, key: str) -> list[dict[str, Any]]:
    return dumped_items(client.conversations.items.list(key, order="asc"))


def test_two_processes_share_one_conversation(
    two_processes: tuple[str, str], spec: SpecLog
) -> None:
    a, b = (spec.client(url, "key-serve", max_retries=0) for url in two_processes)
    key = a.conversations.create(items=[{"role": "user", "content": "Hi, I am Ann."}]).id
    assert b.conversations.retrieve(key).id == key
    # a tool loop across the processes: the call made on one, answered on the other
    paris = a.responses.create(
        model=MODEL, input="Weather in Paris?", tools=TOOLS, conversation=key
    )
    call = next(item for item in paris.output if item.type == "function_call")
    answer = b.responses.create(
        model=MODEL,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."}],
        tools=TOOLS,
        conversation={"id": key},
    )
    assert answer.status == "completed"
    assert listed(a, key) == listed(b, key)
    assert [i["type"] for i in listed(a, key)][-len(answer.output) - 1 :] == [
        "function_call_output",
        *(item.type for item in answer.output),
    ]
    # the same history sent in full renders the same prompt on either process
    full = a.responses.input_tokens.count(
        model=MODEL, input=[*listed(b, key), {"role": "user", "content": "More?"}], tools=TOOLS
    )
    kept = b.responses.input_tokens.count(model=MODEL, input="More?", tools=TOOLS, conversation=key)
    assert full.input_tokens == kept.input_tokens
    # an item deleted on one is gone on the other; so is the conversation
    first_item = listed(a, key)[0]["id"]
    b.conversations.items.delete(first_item, conversation_id=key)
    with pytest.raises(openai.NotFoundError):
        a.conversations.items.retrieve(first_item, conversation_id=key)
    with pytest.raises(openai.NotFoundError):
        spec.client(two_processes[1], "key-other").conversations.retrieve(key)
    a.conversations.delete(key)
    with pytest.raises(openai.NotFoundError):
        b.conversations.items.list(key)
    assert {"ConversationResource", "ConversationItemList", "Response"} <= spec.schemas()


def test_concurrent_appends_on_two_processes_lose_nothing(
    two_processes: tuple[str, str], spec: SpecLog
) -> None:
    """Appends and responses on one conversation at once, through both processes: every batch
    lands whole, nothing is lost, and both processes list the same order."""
    clients = [spec.client(url, "key-serve", max_retries=0) for url in two_processes]
    key = clients[0].conversations.create().id

    def append(n: int) -> Any:
        items = [{"role": "user", "content": f"note {n}.{part}"} for part in range(3)]
        return clients[n % 2].conversations.items.create(key, items=items)

    def respond(n: int) -> Any:
        return clients[n % 2].responses.create(model=MODEL, input=f"Question {n}", conversation=key)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        appends = [pool.submit(append, n) for n in range(24)]
        answers = [pool.submit(respond, n) for n in range(6)]
        added = [future.result() for future in appends]
        responses = [future.result() for future in answers]
    items = listed(clients[0], key)
    assert items == listed(clients[1], key)
    ids = [item["id"] for item in items]
    assert len(ids) == len(set(ids)) == 24 * 3 + sum(1 + len(r.output) for r in responses)
    for batch in added:  # each append whole, in its own order
        start = ids.index(batch.first_id)
        assert ids[start : start + 3] == [item.id for item in batch.data]
    texts = [item["content"][0].get("text") if item.get("content") else None for item in items]
    for n, response in enumerate(responses):  # each response: its input, then its output
        start = texts.index(f"Question {n}")
        assert ids[start + 1 : start + 1 + len(response.output)] == [o.id for o in response.output]


def test_embedded_conversations_survive_a_restart(tmp_path: Path, spec: SpecLog) -> None:
    data = ("--data-dir", str(tmp_path / "data"))
    with serving(*data) as url:
        sdk = spec.client(url + "/v1", "key-serve")
        key = sdk.conversations.create(metadata={"who": "ann"}).id
        sdk.responses.create(model=MODEL, input="Remember me", conversation=key)
        before = (sdk.conversations.retrieve(key), listed(sdk, key))
    with serving(*data) as url:
        sdk = spec.client(url + "/v1", "key-serve")
        assert (sdk.conversations.retrieve(key), listed(sdk, key)) == before
        again = sdk.responses.create(model=MODEL, input="Still there?", conversation=key)
        assert len(listed(sdk, key)) == len(before[1]) + 1 + len(again.output)
