"""The Conversations API end to end: the `openai` SDK (strict, every answer checked
against OpenAI's spec by tests/conversations_support.py) against the proxy on real sockets, in
front of the simulator, on the memory store. The same calls run on the embedded store and on
real Redis with two `serve` processes in test_conversations_serve.py."""

from __future__ import annotations

import concurrent.futures
import itertools
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.store.memory import MemoryStore
from tests.conversations_support import SpecLog, dumped_items
from tests.stateful_support import LONG, MODEL, TOOLS, Stack, dumped, first_events, stack, until
from tests.wellformed import assert_well_formed

_shift = [0.0]  # seconds the memory store's clock is ahead (retention tests)


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding) -> Iterator[Stack]:
    store = MemoryStore(clock=lambda: time.time() + _shift[0])
    with stack(encoding, store, store_timeout=2.0, keepalive_interval=0.5) as running:
        yield running


@pytest.fixture(scope="module")
def spec() -> Iterator[SpecLog]:
    log = SpecLog()
    yield log
    log.close_clients()


@pytest.fixture
def sdk(live: Stack, spec: SpecLog) -> Iterator[OpenAI]:
    made = spec.client(live.base_url, "key-alice", max_retries=0)
    yield made
    made.close()


def listed(client: OpenAI, key: str) -> list[dict[str, Any]]:
    """A conversation's items, oldest first, as the wire carried them."""
    return dumped_items(client.conversations.items.list(key, order="asc"))


def call_of(response: Any) -> Any:
    return next(item for item in response.output if item.type == "function_call")


# -- the calls ---------------------------------------------------------------------------------


def test_create_retrieve_update_delete(sdk: OpenAI, live: Stack, spec: SpecLog) -> None:
    before = len(live.completions())
    empty = sdk.conversations.create()
    assert empty.id.startswith("conv_")
    assert len(empty.id) == 5 + 32
    assert (empty.object, empty.metadata) == ("conversation", {})
    assert abs(empty.created_at - time.time()) < 5
    assert list(sdk.conversations.items.list(empty.id)) == []
    made = sdk.conversations.create(
        items=[
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        ],
        metadata={"topic": "greeting"},
    )
    assert made.metadata == {"topic": "greeting"}
    assert sdk.conversations.retrieve(made.id) == made
    items = listed(sdk, made.id)
    assert [(i["type"], i["role"], i["status"]) for i in items] == [
        ("message", "developer", "completed"),
        ("message", "user", "completed"),
    ]
    assert items[0]["content"] == [{"type": "input_text", "text": "Be brief."}]
    assert all(i["id"].startswith("msg_") for i in items)
    updated = sdk.conversations.update(made.id, metadata={"topic": "farewell", "n": "2"})
    assert updated.metadata == {"topic": "farewell", "n": "2"}
    assert updated.created_at == made.created_at
    assert sdk.conversations.retrieve(made.id).metadata == updated.metadata
    gone = sdk.conversations.delete(made.id)
    assert (gone.id, gone.deleted, gone.object) == (made.id, True, "conversation.deleted")
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.conversations.retrieve(made.id)
    assert missing.value.body["message"] == f"Conversation with id '{made.id}' not found."  # type: ignore[index]
    for call in (
        lambda: sdk.conversations.delete(made.id),
        lambda: sdk.conversations.update(made.id, metadata={}),
        lambda: sdk.conversations.items.list(made.id),
        lambda: sdk.conversations.items.create(made.id, items=[{"role": "user", "content": "x"}]),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert {
        "ConversationResource",
        "DeletedConversationResource",
        "ErrorResponse",
    } <= spec.schemas()
    assert len(live.completions()) == before  # nothing here needs upstream


def test_items_append_get_delete_and_page(sdk: OpenAI, spec: SpecLog) -> None:
    key = sdk.conversations.create(items=[{"role": "user", "content": "zero"}]).id
    added = sdk.conversations.items.create(
        key,
        items=[
            {"role": "user", "content": "one"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "done"},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "r"}],
            },
            {"id": "msg_mine", "role": "assistant", "content": "two"},
        ],
    )
    ids = [item.id for item in added.data]
    assert (added.first_id, added.last_id, added.has_more) == (ids[0], ids[-1], False)
    assert [i.split("_")[0] for i in ids] == ["msg", "fc", "fco", "rs", "msg"]
    assert ids[-1] == "msg_mine"  # a client's id is kept
    everything = listed(sdk, key)
    assert [i["id"] for i in everything][1:] == ids
    assert everything[-1]["content"] == [
        {"type": "output_text", "text": "two", "annotations": [], "logprobs": []}
    ]
    # pages: newest first by default, `after` an item id
    page = sdk.conversations.items.list(key, limit=2)
    assert [i.id for i in page.data] == [ids[-1], ids[-2]]
    assert page.has_more is True
    assert [i.id for i in sdk.conversations.items.list(key, limit=2, after=ids[-2]).data] == [
        ids[-3],
        ids[-4],
    ]
    walked = [item.id for item in sdk.conversations.items.list(key, limit=2, order="asc")]
    assert walked == [everything[0]["id"], *ids]  # the SDK pages through with `after`
    one = sdk.conversations.items.retrieve(ids[2], conversation_id=key)
    assert one.model_dump(mode="json", exclude_unset=True) == everything[3]
    answer = sdk.conversations.items.delete(ids[0], conversation_id=key)
    assert answer.id == key
    assert answer.object == "conversation"
    assert [i["id"] for i in listed(sdk, key)] == [everything[0]["id"], *ids[1:]]
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.conversations.items.retrieve(ids[0], conversation_id=key)
    assert missing.value.body["message"] == f"Item with id '{ids[0]}' not found."  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.items.delete(ids[0], conversation_id=key)
    assert {"ConversationItemList", "ConversationItem"} <= spec.schemas()


def test_include_seals_reasoning(sdk: OpenAI, live: Stack) -> None:
    key = sdk.conversations.create(
        items=[
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "why"}],
            }
        ]
    ).id
    plain = sdk.conversations.items.list(key).data[0]
    assert getattr(plain, "encrypted_content", None) is None
    sealed = sdk.conversations.items.list(key, include=["reasoning.encrypted_content"]).data[0]
    blob = getattr(sealed, "encrypted_content", None)
    assert isinstance(blob, str)
    assert "why" not in blob
    # the blob opens back into the same item: sent as input, it renders as the plain one
    sdk.responses.create(
        model=MODEL,
        input=[
            {"type": "reasoning", "summary": [], "encrypted_content": blob},
            {"role": "user", "content": "go"},
        ],
        store=False,
    )
    sealed_prompt = live.completions()[-1].prompt_ids
    sdk.responses.create(
        model=MODEL, input=[*listed(sdk, key), {"role": "user", "content": "go"}], store=False
    )
    assert live.completions()[-1].prompt_ids == sealed_prompt
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.conversations.items.list(key, include=["no.such"])  # type: ignore[list-item]
    assert bad.value.body["param"] == "include[0]"  # type: ignore[index]


# -- responses in a conversation ---------------------------------------------------------------


def test_conversation_renders_as_the_same_history_sent_in_input(sdk: OpenAI, live: Stack) -> None:
    """Every kind of turn — plain, streamed, background, after items.create — gets the prompt
    ids the same items sent in `input` get, and adds its input and output to the conversation."""
    key = sdk.conversations.create(items=[{"role": "user", "content": "Hi, I am Ann."}]).id
    turns: list[tuple[list[Any], dict[str, Any]]] = []

    def turn(new_input: Any, **fields: Any) -> tuple[Any, tuple[int, ...]]:
        before = listed(sdk, key)
        response = sdk.responses.create(model=MODEL, input=new_input, conversation=key, **fields)
        if fields.get("stream"):
            response = assert_well_formed(dumped(response))
        elif fields.get("background"):
            until(lambda: sdk.responses.retrieve(response.id).status == "completed")
            response = sdk.responses.retrieve(response.id).model_dump(mode="json")
        else:
            response = response.model_dump(mode="json")
        prompt = live.completions()[-1].prompt_ids
        own = [{"role": "user", "content": new_input}] if isinstance(new_input, str) else new_input
        turns.append(
            (
                before + own,
                {k: v for k, v in fields.items() if k in ("tools", "instructions", "reasoning")},
            )
        )
        after = listed(sdk, key)
        assert len(after) == len(before) + len(own) + len(response["output"])
        assert [i["id"] for i in after[len(after) - len(response["output"]) :]] == [
            item["id"] for item in response["output"]
        ]
        assert response["conversation"] == {"id": key}
        return response, prompt

    paris, p1 = turn("What's the weather in Paris?", tools=TOOLS, reasoning={"effort": "low"})
    call = next(item for item in paris["output"] if item["type"] == "function_call")
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny."}
    _, p2 = turn([output], tools=TOOLS, stream=True)
    sdk.conversations.items.create(key, items=[{"role": "user", "content": "Noted."}])
    _, p3 = turn("And in Tokyo?", tools=TOOLS, instructions="Answer in French.", background=True)
    _, p4 = turn("Thanks", instructions="Answer in French.")
    for (history, fields), prompt in zip(turns, (p1, p2, p3, p4), strict=True):
        sdk.responses.create(model=MODEL, input=history, store=False, **fields)
        assert live.completions()[-1].prompt_ids == prompt
    # usage counts the whole conversation; input_tokens counts it the same way
    counted = sdk.responses.input_tokens.count(
        model=MODEL, input="More?", conversation=key, instructions="Answer in French."
    )
    last = sdk.responses.create(
        model=MODEL, input="More?", conversation=key, instructions="Answer in French."
    )
    assert last.usage is not None
    assert counted.input_tokens == last.usage.input_tokens == len(live.completions()[-1].prompt_ids)
    # input_items: what the response was made from, the conversation's items first
    made_from = [i.id for i in sdk.responses.input_items.list(last.id, order="asc", limit=100)]
    assert made_from == [i["id"] for i in listed(sdk, key)][: len(made_from)]


def test_store_false_adds_to_the_conversation_only(sdk: OpenAI) -> None:
    key = sdk.conversations.create().id
    unstored = sdk.responses.create(model=MODEL, input="Hello", conversation=key, store=False)
    assert unstored.store is False
    assert unstored.conversation is not None
    assert next(i["type"] for i in listed(sdk, key)) == "message"
    assert len(listed(sdk, key)) == 1 + len(unstored.output)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unstored.id)


def test_only_ended_responses_add_items(sdk: OpenAI, live: Stack) -> None:
    """Completed and incomplete responses add their items; failed and cancelled ones add
    nothing, so the same request can be sent again."""
    key = sdk.conversations.create().id
    cut = sdk.responses.create(
        model=MODEL, input="Long", conversation=key, max_output_tokens=16, extra_headers=LONG
    )
    assert cut.status == "incomplete"
    assert len(listed(sdk, key)) == 1 + len(cut.output)
    before = listed(sdk, key)
    failed = dumped(
        sdk.responses.create(
            model=MODEL,
            input="Break",
            conversation=key,
            stream=True,
            extra_headers={"X-Sim-Fault": "cut@5"},
        )
    )
    assert assert_well_formed(failed)["status"] == "failed"
    with pytest.raises(openai.InternalServerError) as refused:  # upstream refused: a 502
        sdk.responses.create(
            model=MODEL,
            input="Break",
            conversation=key,
            store=False,
            extra_headers={"X-Sim-Fault": "http:500"},
        )
    assert refused.value.status_code == 502
    stream = sdk.responses.create(
        model=MODEL, input="Leave", conversation=key, stream=True, extra_headers=LONG
    )
    seen = first_events(stream, 4)
    until(lambda: sdk.responses.retrieve(seen[0]["response"]["id"]).status == "cancelled")
    job = sdk.responses.create(
        model=MODEL, input="Cancel", conversation=key, background=True, extra_headers=LONG
    )
    until(lambda: sdk.responses.retrieve(job.id).output)
    assert sdk.responses.cancel(job.id).status == "cancelled"
    assert listed(sdk, key) == before


def test_errors_reach_no_upstream(sdk: OpenAI, live: Stack, spec: SpecLog) -> None:
    before = len(live.completions())
    key = sdk.conversations.create(items=[{"id": "msg_held", "role": "user", "content": "x"}]).id
    cases: list[tuple[dict[str, Any], type[Exception], str | None]] = [
        ({"conversation": "resp_123"}, openai.BadRequestError, "conversation"),
        ({"conversation": {"id": 7}}, openai.BadRequestError, "conversation.id"),
        ({"conversation": {"id": key, "x": 1}}, openai.BadRequestError, "conversation.x"),
        ({"conversation": "conv_" + "0" * 32}, openai.NotFoundError, "conversation"),
        (
            {"conversation": key, "previous_response_id": "resp_1"},
            openai.BadRequestError,
            "conversation",
        ),
        (
            {"conversation": key, "input": [{"id": "msg_held", "role": "user", "content": "y"}]},
            openai.BadRequestError,
            "input",
        ),
        (
            {
                "conversation": key,
                "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}],
            },
            openai.BadRequestError,
            "input[0].call_id",
        ),
    ]
    for fields, error, param in cases:
        body = {"model": MODEL, "input": "hi", **fields}
        with pytest.raises(error) as raised:
            sdk.responses.create(**body)
        assert raised.value.body["param"] == param, fields  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError, match="Mutually exclusive"):
        sdk.responses.create(
            model=MODEL, input="x", conversation=key, previous_response_id="resp_1"
        )
    with pytest.raises(openai.BadRequestError, match="Duplicate item found with id msg_held"):
        sdk.responses.create(
            model=MODEL,
            input=[{"id": "msg_held", "role": "user", "content": "y"}],
            conversation=key,
        )
    with (
        spec.client(live.base_url, "key-mallory") as other,
        pytest.raises(openai.NotFoundError),
    ):
        other.responses.create(model=MODEL, input="x", conversation=key)
    assert len(live.completions()) == before


def test_bad_conversation_calls_are_400s(sdk: OpenAI, live: Stack) -> None:
    key = sdk.conversations.create().id
    item = {"role": "user", "content": "x"}
    bad: list[tuple[Any, str]] = [
        (lambda: sdk.conversations.create(items=[item] * 21), "items"),
        (
            lambda: sdk.conversations.create(items=[{"role": "robot", "content": "x"}]),
            "items[0].role",
        ),
        (
            lambda: sdk.conversations.create(items=[{"type": "image_generation_call"}]),
            "items[0].type",
        ),
        (lambda: sdk.conversations.create(metadata={"k": "v" * 600}), "metadata.k"),
        (lambda: sdk.conversations.create(extra_body={"model": MODEL}), "model"),
        (lambda: sdk.conversations.items.create(key, items=[]), "items"),
        (lambda: sdk.conversations.items.create(key, items=[item] * 21), "items"),
        (lambda: sdk.conversations.items.create(key, items=[{"id": "msg_a", **item}] * 2), "items"),
        (
            lambda: sdk.conversations.items.create(
                key, items=[{"type": "item_reference", "id": "msg_zz"}]
            ),
            "items[0].id",
        ),
        (
            lambda: sdk.conversations.update(key, metadata={str(n): "v" for n in range(17)}),
            "metadata",
        ),
        (lambda: sdk.conversations.update(key, metadata={}, extra_body={"items": []}), "items"),
        (lambda: sdk.conversations.items.list(key, limit=101), "limit"),
        (lambda: sdk.conversations.items.list(key, order="sideways"), "order"),  # type: ignore[arg-type]
        (lambda: sdk.conversations.items.list(key, after="msg_nowhere"), "after"),
        (lambda: sdk.conversations.retrieve("resp_123"), "conversation_id"),
    ]
    for call, param in bad:
        with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as raised:
            call()
        assert raised.value.body["param"] == param, param  # type: ignore[attr-defined]
        assert raised.value.status_code in (400, 404)
    auth = {"authorization": "Bearer key-alice"}
    raw: list[tuple[str, bytes, str, int, str | None]] = [
        ("/items", b"items", "text/plain", 415, None),
        ("/items", b"{not json", "application/json", 400, None),
        ("/items", b"[]", "application/json", 400, None),
        ("/items", b"{}", "application/json", 400, "items"),
        ("", b"{}", "application/json", 400, "metadata"),
        ("", b"", "application/json", 400, "metadata"),
    ]
    for path, body, kind, status, param in raw:
        answer = httpx.post(
            f"{live.base_url}/conversations/{key}{path}",
            content=body,
            headers={**auth, "content-type": kind},
        )
        assert answer.status_code == status, (path, body)
        assert answer.json()["error"]["param"] == param
    # a body over max_body_bytes is refused from its Content-Length, before it is read
    with socket.create_connection(("127.0.0.1", live.proxy.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/conversations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1099511627776\r\nExpect: 100-continue\r\n\r\n"
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")
    # a client gone half-way through its body: nothing is written, nothing breaks
    gone = live.metric("proxy_client_disconnects_total", phase="before_upstream")
    with socket.create_connection(("127.0.0.1", live.proxy.port), timeout=5) as sock:
        sock.sendall(
            f"POST /v1/conversations/{key}/items HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer key-alice\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"items": [{"role": "user", "con'
        )
    until(lambda: live.metric("proxy_client_disconnects_total", phase="before_upstream") > gone)
    assert listed(sdk, key) == []


def test_isolation_by_credential(sdk: OpenAI, live: Stack, spec: SpecLog) -> None:
    key = sdk.conversations.create(items=[{"role": "user", "content": "secret"}]).id
    item = listed(sdk, key)[0]["id"]
    other = spec.client(live.base_url, "key-mallory", max_retries=0)
    for call in (
        lambda: other.conversations.retrieve(key),
        lambda: other.conversations.update(key, metadata={}),
        lambda: other.conversations.delete(key),
        lambda: other.conversations.items.list(key),
        lambda: other.conversations.items.create(key, items=[{"role": "user", "content": "x"}]),
        lambda: other.conversations.items.retrieve(item, conversation_id=key),
        lambda: other.conversations.items.delete(item, conversation_id=key),
    ):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        assert "secret" not in str(raised.value.body)
    other.close()
    assert [i["content"][0]["text"] for i in listed(sdk, key)] == ["secret"]


def test_concurrent_responses_append_whole_in_order(sdk: OpenAI, live: Stack) -> None:
    """Responses running at once on one conversation, with appends between them: each lands
    its input then its output, whole, and nothing is lost."""
    key = sdk.conversations.create().id

    def respond(n: int) -> Any:
        return sdk.responses.create(model=MODEL, input=f"Question {n}", conversation=key)

    def append(n: int) -> Any:
        return sdk.conversations.items.create(
            key,
            items=[
                {"role": "user", "content": f"Note {n}"},
                {"role": "assistant", "content": f"Ack {n}"},
            ],
        )

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = [pool.submit(respond, n) for n in range(8)]
        appended = [pool.submit(append, n) for n in range(8)]
        done = [f.result() for f in responses]
        notes = [f.result() for f in appended]
    items = listed(sdk, key)
    assert len(items) == sum(1 + len(r.output) for r in done) + 2 * len(notes)
    ids = [i["id"] for i in items]
    assert len(set(ids)) == len(ids)
    for n, response in enumerate(done):
        start = next(
            i
            for i, item in enumerate(items)
            if item.get("content") and item["content"][0].get("text") == f"Question {n}"
        )
        assert ids[start + 1 : start + 1 + len(response.output)] == [o.id for o in response.output]
    for note in notes:
        start = ids.index(note.first_id)
        assert ids[start : start + 2] == [note.first_id, note.last_id]


# -- retention, store off, openai-agents --------------------------------------------------------


def test_conversations_expire_with_store_ttl(sdk: OpenAI, live: Stack) -> None:
    key = sdk.conversations.create(items=[{"role": "user", "content": "old"}]).id
    _shift[0] = Settings().store_ttl + 1
    try:
        with pytest.raises(openai.NotFoundError):
            sdk.conversations.retrieve(key)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.create(model=MODEL, input="x", conversation=key)
    finally:
        _shift[0] = 0.0


def test_conversations_are_evicted_oldest_first_under_the_bound(
    encoding: HarmonyEncoding, spec: SpecLog
) -> None:
    """`store_max_bytes` counts a conversation's items: growing one evicts the oldest entry."""
    with stack(encoding, MemoryStore(max_bytes=20_000)) as small:
        client = spec.client(small.base_url, "key", max_retries=0)
        text = "x" * 2000
        old = client.conversations.create(items=[{"role": "user", "content": text}] * 5).id
        new = client.conversations.create().id
        for _ in range(4):  # ~19 KB in all: both kept
            client.conversations.items.create(new, items=[{"role": "user", "content": text}])
        assert len(listed(client, old)) == 5
        for _ in range(2):  # past 20 KB: the oldest conversation goes, the newer one stays
            client.conversations.items.create(new, items=[{"role": "user", "content": text}])
        with pytest.raises(openai.NotFoundError):
            client.conversations.retrieve(old)
        assert len(listed(client, new)) == 6


def test_store_off_refuses_conversations(encoding: HarmonyEncoding, spec: SpecLog) -> None:
    with stack(encoding, None, store_url="off") as off:
        client = spec.client(off.base_url, "key", max_retries=0)
        before = len(off.completions())  # the start-up probe's
        with pytest.raises(openai.BadRequestError, match="store_url = off"):
            client.conversations.create()
        with pytest.raises(openai.BadRequestError, match="store_url = off") as bad:
            client.responses.create(model=MODEL, input="x", conversation="conv_123")
        assert bad.value.body["param"] == "conversation"  # type: ignore[index]
        client.close()
        assert len(off.completions()) == before


def test_openai_agents_conversations_session_tool_loop(
    live: Stack, spec: SpecLog, encoding: HarmonyEncoding
) -> None:
    """openai-agents' `OpenAIConversationsSession`: a multi-turn, tool-using agent whose memory
    lives in a conversation on the proxy."""
    import asyncio

    import agents

    from tests.agents_support import weather_agent

    calls: list[str] = []

    async def run() -> tuple[str, list[Any], list[Any]]:
        async with spec.async_client(live.base_url, "key-agents") as client:
            agent = weather_agent(client, calls)
            session = agents.OpenAIConversationsSession(openai_client=client)
            first = await agents.Runner.run(agent, "What's the weather in Paris?", session=session)
            second = await agents.Runner.run(agent, "And in Tokyo?", session=session)
            third = await agents.Runner.run(agent, "Thanks!", session=session)
            items = await session.get_items()
            popped = await session.pop_item()
            assert popped is not None
            assert popped["id"] == items[-1]["id"]
            rest = await session.get_items()
            key = session.session_id
            await session.clear_session()
            with pytest.raises(openai.NotFoundError):
                await client.conversations.retrieve(key)
            del first, second
            return str(third.final_output), items, rest

    final, items, rest = asyncio.run(run())
    # the scripted model calls the tool once a turn, with the turn's question
    assert calls == ["What's the weather in Paris?", "And in Tokyo?", "Thanks!"]
    assert "21" in final  # the answer used the tool's output
    kinds = [item["type"] for item in items]
    assert kinds.count("function_call") == 3
    assert kinds.count("function_call_output") == 3
    users = [i["content"] for i in items if i["type"] == "message" and i["role"] == "user"]
    assert len(users) == 3
    assert rest == items[:-1]
    # the last turn's prompt held the whole conversation the session keeps on the proxy
    prompt = encoding.decode(list(live.completions()[-1].prompt_ids))
    assert "Paris" in prompt
    assert "Tokyo" in prompt
    assert "Thanks!" in prompt


def test_openai_agents_runs_in_a_conversation_by_id(live: Stack, spec: SpecLog) -> None:
    """openai-agents with `conversation_id`: each model call sends only its new items with
    `conversation`, the proxy keeps the rest — a tool loop across turns."""
    import asyncio

    import agents

    from tests.agents_support import weather_agent

    calls: list[str] = []

    async def run() -> tuple[str, str]:
        async with spec.async_client(live.base_url, "key-agents") as client:
            key = (await client.conversations.create()).id
            agent = weather_agent(client, calls)
            await agents.Runner.run(agent, "What's the weather in Paris?", conversation_id=key)
            second = await agents.Runner.run(agent, "And in Tokyo?", conversation_id=key)
            return key, str(second.last_response_id)

    before = len(live.completions())
    key, last = asyncio.run(run())
    assert len(calls) == 2
    sdk = spec.client(live.base_url, "key-agents")
    items = listed(sdk, key)
    kinds = [item["type"] for item in items]
    assert kinds.count("function_call") == kinds.count("function_call_output") == 2
    assert [i["content"][0]["text"] for i in items if i.get("role") == "user"] == [
        "What's the weather in Paris?",
        "And in Tokyo?",
    ]
    assert sdk.responses.retrieve(last).conversation is not None
    records = live.completions()[before:]
    assert len(records) == 4  # call, answer, call, answer
    # every model call continued the conversation: its prompt extends the one before
    for earlier, later in itertools.pairwise(records):
        assert later.prompt_ids[: len(earlier.prompt_ids) - 3] == earlier.prompt_ids[:-3]
    sdk.close()
