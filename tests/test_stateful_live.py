"""The stateful Responses API end to end: the `openai` SDK (strict) against the proxy
on real sockets, in front of the simulator, on the memory store. The same calls run on the
embedded store and on Redis with real `serve` processes in test_stateful_serve.py."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.request.prepare import prepare_request
from proxy.server.stateful.scope import SHARED_SCOPE, scope_of
from proxy.store.memory import MemoryStore
from tests.agents_support import weather_agent
from tests.stateful_support import LONG, MODEL, TOOLS, Stack, dumped, first_events, stack, until
from tests.wellformed import assert_well_formed


@pytest.fixture(scope="module")
def live(encoding: HarmonyEncoding) -> Iterator[Stack]:
    with stack(encoding, MemoryStore(), store_timeout=2.0, keepalive_interval=0.5) as running:
        yield running


def outputs(response: Any) -> list[dict[str, Any]]:
    """A response's output items as a client sends them back in `input`."""
    return [item.model_dump(mode="json", exclude_unset=True) for item in response.output]


def status_of(client: Any, key: str) -> str | None:
    """A response's status; None while it is not stored yet (an abandoned stream's record is
    written by the store's writer a moment after the client left)."""
    try:
        return str(client.responses.retrieve(key).status)
    except openai.NotFoundError:
        return None


def call_of(response: Any) -> Any:
    return next(item for item in response.output if item.type == "function_call")


# -- create, retrieve, delete ------------------------------------------------------------------


def test_create_retrieve_delete(live: Stack) -> None:
    client = live.client()
    created = client.responses.create(model=MODEL, input="Hello there", store=True)
    assert created.status == "completed"
    assert created.model_dump() == client.responses.retrieve(created.id).model_dump()
    events = dumped(client.responses.create(model=MODEL, input="Stream this", stream=True))
    terminal = assert_well_formed(events)
    again = client.responses.retrieve(terminal["id"])
    assert again.model_dump(mode="json", exclude_unset=True) == terminal
    assert client.responses.delete(created.id) is None
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)
    unstored = client.responses.create(model=MODEL, input="Forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError, match="Previous response") as unknown:
        client.responses.create(model=MODEL, input="And?", previous_response_id=unstored.id)
    assert unknown.value.code == "previous_response_not_found"


def test_response_ids_carry_128_random_bits(live: Stack) -> None:
    from proxy.harmony.response import random_id

    client = live.client()
    first = client.responses.create(model=MODEL, input="a", store=False).id
    second = client.responses.create(model=MODEL, input="b", store=False).id
    for key in (first, second):
        assert key.startswith("resp_")
        assert len(key.removeprefix("resp_")) * 4 >= 128
        int(key.removeprefix("resp_"), 16)
    assert first != second
    # every hex digit varies: no uuid version or variant bits fixed (a uuid4 has 122)
    digits = [random_id("resp").removeprefix("resp_") for _ in range(200)]
    assert all(len({d[i] for d in digits}) > 4 for i in range(32))


def test_previous_response_id_errors_reach_no_upstream(live: Stack) -> None:
    client = live.client(max_retries=0)
    before = len(live.completions())
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL, input="x", previous_response_id="msg_123")
    assert bad.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert bad.value.code == "invalid_value"
    missing = "resp_" + "0" * 31 + "9"
    # OpenAI's answer, which clients and other Responses servers' test suites check for: a 400
    # naming the parameter, not a 404 (the path names no response), on every path that
    # resolves a chain — streamed or not, background, and the input token count.
    calls = [
        lambda: client.responses.create(model=MODEL, input="x", previous_response_id=missing),
        lambda: list(
            client.responses.create(
                model=MODEL, input="x", previous_response_id=missing, stream=True
            )
        ),
        lambda: client.responses.create(
            model=MODEL, input="x", previous_response_id=missing, background=True
        ),
        lambda: client.responses.input_tokens.count(
            model=MODEL, input="x", previous_response_id=missing
        ),
    ]
    for call in calls:
        with pytest.raises(openai.BadRequestError) as unknown:
            call()
        assert unknown.value.status_code == 400
        assert unknown.value.body == {  # type: ignore[comparison-overlap]
            "message": f"Previous response with id '{missing}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
    assert len(live.completions()) == before


def test_a_chain_with_a_deleted_response_is_not_found(live: Stack) -> None:
    client = live.client(max_retries=0)
    first = client.responses.create(model=MODEL, input="One")
    second = client.responses.create(model=MODEL, input="Two", previous_response_id=first.id)
    client.responses.delete(first.id)
    for call in (
        lambda: client.responses.create(model=MODEL, input="x", previous_response_id=second.id),
        lambda: client.responses.input_tokens.count(
            model=MODEL, input="x", previous_response_id=second.id
        ),
    ):
        with pytest.raises(openai.BadRequestError) as broken:
            call()
        assert broken.value.code == "previous_response_not_found"
        assert broken.value.param == "previous_response_id"  # type: ignore[attr-defined]
        message = broken.value.body["message"]  # type: ignore[index]
        assert message.startswith(f"Previous response with id '{second.id}' not found: ")
        assert first.id in message


# -- previous_response_id: the prompt is the whole history's -------------------------------------


def test_chain_of_four_turns_renders_the_whole_history(live: Stack) -> None:
    client = live.client()
    paris = client.responses.create(
        model=MODEL, input="What's the weather in Paris?", tools=TOOLS, reasoning={"effort": "low"}
    )
    first_call = call_of(paris)
    output_1 = {"type": "function_call_output", "call_id": first_call.call_id, "output": "Sunny."}
    answer = client.responses.create(
        model=MODEL, input=[output_1], tools=TOOLS, previous_response_id=paris.id
    )
    tokyo = client.responses.create(
        model=MODEL,
        input="And in Tokyo?",
        tools=TOOLS,
        instructions="Answer in French.",
        previous_response_id=answer.id,
    )
    second_call = call_of(tokyo)
    output_2 = {"type": "function_call_output", "call_id": second_call.call_id, "output": "Rain."}
    last = client.responses.create(
        model=MODEL,
        input=[output_2],
        tools=TOOLS,
        instructions="Answer in French.",
        previous_response_id=tokyo.id,
    )
    assert [r.status for r in (paris, answer, tokyo, last)] == ["completed"] * 4
    assert last.previous_response_id == tokyo.id
    assert [item.type for item in paris.output] == ["reasoning", "function_call"]
    chained = live.completions()[-4:]
    history = [
        {"role": "user", "content": "What's the weather in Paris?"},
        *outputs(paris),
        output_1,
        *outputs(answer),
        {"role": "user", "content": "And in Tokyo?"},
        *outputs(tokyo),
        output_2,
    ]
    # The same conversations sent in full, each with its own request's fields.
    cuts = [(len(outputs(paris)) + 2, {}), (len(history), {"instructions": "Answer in French."})]
    for (cut, fields), record in zip(cuts, [chained[1], chained[3]], strict=True):
        full = client.responses.create(model=MODEL, input=history[:cut], tools=TOOLS, **fields)
        assert full.status == "completed"
        assert live.completions()[-1].prompt_ids == record.prompt_ids
    # usage counts the whole prompt
    assert last.usage is not None
    assert last.usage.input_tokens == len(chained[3].prompt_ids)


def test_instructions_come_from_the_new_request_only(
    live: Stack, encoding: HarmonyEncoding
) -> None:
    client = live.client()
    first = client.responses.create(model=MODEL, input="Hi", instructions="Speak like a pirate.")
    client.responses.create(model=MODEL, input="Again", previous_response_id=first.id)
    prompt = encoding.decode(list(live.completions()[-1].prompt_ids))
    assert "pirate" not in prompt
    assert "Hi" in prompt


def test_input_tokens_counts_what_upstream_gets(live: Stack) -> None:
    client = live.client()
    first = client.responses.create(model=MODEL, input="Count me", tools=TOOLS)
    counted = client.responses.input_tokens.count(
        model=MODEL, input="And me", tools=TOOLS, previous_response_id=first.id
    )
    second = client.responses.create(
        model=MODEL, input="And me", tools=TOOLS, previous_response_id=first.id
    )
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == len(live.completions()[-1].prompt_ids)
    assert second.usage is not None
    assert counted.input_tokens == second.usage.input_tokens
    plain = client.responses.input_tokens.count(input="Just this")
    assert plain.input_tokens > 0
    with pytest.raises(openai.BadRequestError):
        client.responses.input_tokens.count(input="x", extra_body={"seed": 1})


# -- input items ------------------------------------------------------------------------------


def test_input_items_list_the_context_with_pagination(live: Stack) -> None:
    client = live.client()
    first = client.responses.create(
        model=MODEL,
        input=[
            {"role": "developer", "content": "Be kind."},
            {"role": "user", "content": "One"},
            {"role": "user", "content": [{"type": "input_text", "text": "Two"}]},
        ],
    )
    second = client.responses.create(model=MODEL, input="Three", previous_response_id=first.id)
    listed = list(client.responses.input_items.list(second.id, order="asc", limit=2))
    kinds = [(item.type, getattr(item, "role", None)) for item in listed]
    expected = [
        ("message", "developer"),
        ("message", "user"),
        ("message", "user"),
        *[(item.type, getattr(item, "role", None)) for item in first.output],
        ("message", "user"),
    ]
    assert kinds == expected
    page = client.responses.input_items.list(second.id, limit=2)  # desc by default
    assert page.has_more is True
    assert [item.id for item in page.data] == [item.id for item in reversed(listed)][:2]
    raw = httpx.get(
        f"{live.base_url}/responses/{second.id}/input_items",
        params={"limit": 2, "order": "asc", "after": listed[1].id},
        headers={"Authorization": "Bearer key-alice"},
    ).json()
    assert [item["id"] for item in raw["data"]] == [item.id for item in listed[2:4]]
    assert raw["first_id"] == listed[2].id
    assert raw["object"] == "list"
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(second.id, limit=101)


# -- isolation --------------------------------------------------------------------------------


def test_another_credential_gets_404_for_everything(live: Stack) -> None:
    alice, bob = live.client("key-alice", max_retries=0), live.client("key-bob", max_retries=0)
    mine = alice.responses.create(model=MODEL, input="Private", background=True)
    until(lambda: alice.responses.retrieve(mine.id).status == "completed")
    calls = [
        lambda: bob.responses.retrieve(mine.id),
        lambda: list(bob.responses.retrieve(mine.id, stream=True)),
        lambda: bob.responses.delete(mine.id),
        lambda: bob.responses.cancel(mine.id),
        lambda: bob.responses.input_items.list(mine.id),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError) as hidden:  # as for an id that never existed
        bob.responses.create(model=MODEL, input="x", previous_response_id=mine.id)
    assert hidden.value.code == "previous_response_not_found"
    assert alice.responses.retrieve(mine.id).id == mine.id  # bob's delete did nothing


def test_requests_without_credentials_share_one_scope(live: Stack) -> None:
    body = {"model": MODEL, "input": "Anyone"}
    created = httpx.post(f"{live.base_url}/responses", json=body, timeout=10).json()
    fetched = httpx.get(
        f"{live.base_url}/responses/{created['id']}", headers={"x-request-id": "get-1"}
    )
    assert fetched.status_code == 200
    assert fetched.headers["x-request-id"] == "get-1"
    with_key = httpx.get(
        f"{live.base_url}/responses/{created['id']}", headers={"Authorization": "Bearer k"}
    )
    assert with_key.status_code == 404


def test_scope_is_a_hash_of_the_bearer_token_or_the_configured_header() -> None:
    bearer = [(b"authorization", b"Bearer sk-1")]
    assert scope_of(bearer, "authorization") == scope_of(
        [(b"authorization", b"bearer  sk-1")], "authorization"
    )
    assert scope_of(bearer, "authorization") != scope_of(
        [(b"authorization", b"Bearer sk-2")], "authorization"
    )
    assert "sk-1" not in scope_of(bearer, "authorization")
    assert scope_of([], "authorization") == SHARED_SCOPE
    assert scope_of([(b"x-api-key", b"abc")], "x-api-key") != SHARED_SCOPE
    assert scope_of([(b"x-api-key", b"")], "x-api-key") == SHARED_SCOPE


# -- streams: replay, background, resume, cancel -------------------------------------------------


def test_retrieve_stream_replays_from_starting_after(live: Stack) -> None:
    client = live.client()
    events = dumped(client.responses.create(model=MODEL, input="Replay me", stream=True))
    key = events[0]["response"]["id"]
    assert dumped(client.responses.retrieve(key, stream=True)) == events
    tail = dumped(client.responses.retrieve(key, stream=True, starting_after=5))
    assert tail == events[6:]


def test_background_response_runs_without_a_client(live: Stack) -> None:
    client = live.client()
    queued = client.responses.create(model=MODEL, input="In the background", background=True)
    assert queued.status == "queued"
    assert queued.background is True
    assert queued.output == []
    done = until(lambda: (r := client.responses.retrieve(queued.id)).status == "completed" and r)
    assert done.output_text
    replay = dumped(client.responses.retrieve(queued.id, stream=True))
    assert assert_well_formed(replay)["id"] == queued.id


def test_background_stream_dropped_and_resumed_misses_nothing(live: Stack) -> None:
    client = live.client()
    stream = client.responses.create(
        model=MODEL, input="Tell me a long story", background=True, stream=True, extra_headers=LONG
    )
    seen = first_events(stream, 6)  # the client goes away; the generation goes on
    key = seen[0]["response"]["id"]
    running = client.responses.retrieve(key)
    assert running.status == "in_progress"
    rest = dumped(client.responses.retrieve(key, stream=True, starting_after=5))
    events = seen + rest
    response = assert_well_formed(events)
    assert response["status"] == "completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert response["usage"]["output_tokens"] >= 3000


def test_polling_shows_a_background_response_progress(live: Stack) -> None:
    client = live.client()
    queued = client.responses.create(
        model=MODEL, input="Progress", background=True, extra_headers=LONG
    )
    texts = []
    while True:
        current = client.responses.retrieve(queued.id)
        texts.append(
            "".join(
                part.text  # type: ignore[union-attr]
                for item in current.output
                for part in (getattr(item, "content", None) or [])
            )
        )
        if current.status == "completed":
            break
        time.sleep(0.1)
    assert any(0 < len(text) < len(texts[-1]) for text in texts[:-1]), "no partial output seen"
    assert all(texts[-1].startswith(text) for text in texts)


def test_cancel_stops_upstream_and_ends_cancelled(live: Stack) -> None:
    client = live.client()
    queued = client.responses.create(
        model=MODEL, input="Cancel me", background=True, extra_headers=LONG
    )
    until(lambda: client.responses.retrieve(queued.id).output)
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    record = live.completions()[-1]
    assert until(lambda: record.closed)
    assert record.disconnected  # upstream's generation was aborted
    assert not record.completed
    assert client.responses.cancel(queued.id).status == "cancelled"  # idempotent
    assert client.responses.retrieve(queued.id).status == "cancelled"
    events = dumped(client.responses.retrieve(queued.id, stream=True))
    assert assert_well_formed(events)["status"] == "cancelled"
    assert events[-1]["type"] == "response.failed"


def test_cancel_of_a_foreground_response_is_400(live: Stack) -> None:
    client = live.client(max_retries=0)
    created = client.responses.create(model=MODEL, input="Foreground")
    with pytest.raises(openai.BadRequestError, match="synchronous"):
        client.responses.cancel(created.id)


def test_foreground_stream_dropped_is_stored_cancelled_and_upstream_stops(live: Stack) -> None:
    client = live.client()
    stream = client.responses.create(model=MODEL, input="Drop me", stream=True, extra_headers=LONG)
    first = next(iter(stream))
    stream.close()
    key = first.response.id  # type: ignore[union-attr]
    record = live.completions()[-1]
    assert until(lambda: record.closed)
    assert record.disconnected  # a foreground stream still cancels upstream
    assert until(lambda: status_of(client, key) == "cancelled")


def test_item_reference_resolves_from_the_store(live: Stack, encoding: HarmonyEncoding) -> None:
    client = live.client(max_retries=0)
    first = client.responses.create(model=MODEL, input="Remember this")
    message = next(item for item in first.output if item.type == "message")
    client.responses.create(
        model=MODEL,
        input=[{"type": "item_reference", "id": message.id}, {"role": "user", "content": "Go on"}],
    )
    referenced = live.completions()[-1].prompt_ids
    inline = [outputs(first)[-1], {"role": "user", "content": "Go on"}]
    assert (
        tuple(prepare_request({"model": MODEL, "input": inline}, encoding).prompt_token_ids)
        == referenced
    )
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_nope"}])
    assert missing.value.body["param"] == "input[0].id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        live.client("key-bob", max_retries=0).responses.create(
            model=MODEL, input=[{"type": "item_reference", "id": message.id}]
        )


def test_store_metrics_are_exported(live: Stack) -> None:
    client = live.client()
    client.responses.create(model=MODEL, input="Measure me")
    assert live.metric("proxy_store_operation_seconds_count", op="apply") > 0
    assert live.metric("proxy_store_operation_seconds_count", op="get") >= 0
    text = httpx.get(live.proxy.url + "/metrics").text
    for name in (
        "proxy_store_responses",
        "proxy_store_bytes",
        'proxy_store_errors_total{op="apply"}',
        'proxy_store_evictions_total{reason="size"}',
    ):
        assert name in text


# -- a store that is down never breaks a foreground stream -------------------------------------


def test_store_down_foreground_streams_complete_stateful_calls_503(
    encoding: HarmonyEncoding,
) -> None:
    from proxy.store.redis_store import RedisStore
    from tests.live import free_port

    dead = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5)
    with stack(encoding, dead, store_timeout=1.0) as down:
        client = down.client(max_retries=0)
        events = dumped(client.responses.create(model=MODEL, input="Still works", stream=True))
        response = assert_well_formed(events)
        assert response["status"] == "completed"
        assert client.responses.create(model=MODEL, input="JSON too").status == "completed"
        assert until(lambda: down.metric("proxy_store_errors_total", op="apply") >= 2)
        for call in (
            lambda: client.responses.retrieve(response["id"]),
            lambda: client.responses.create(model=MODEL, input="x", background=True),
            lambda: client.responses.create(
                model=MODEL, input="x", previous_response_id=response["id"]
            ),
        ):
            with pytest.raises(openai.InternalServerError) as caught:
                call()
            assert caught.value.status_code == 503
            assert caught.value.body["code"] == "store_unavailable"  # type: ignore[index]
        assert (
            client.responses.create(model=MODEL, input="unstored", store=False).status
            == "completed"
        )


# -- openai-agents chaining turns by previous_response_id ------------------------------------------


def test_openai_agents_tool_loop_over_previous_response_id(live: Stack) -> None:
    import asyncio

    import agents
    from openai import AsyncOpenAI

    calls: list[str] = []

    async def run() -> tuple[Any, Any]:
        async with AsyncOpenAI(base_url=live.base_url, api_key="key-agents") as client:
            agent = weather_agent(client, calls)
            first = await agents.Runner.run(
                agent, "What's the weather in Paris?", auto_previous_response_id=True
            )
            second = await agents.Runner.run(
                agent,
                "And in Tokyo?",
                previous_response_id=first.last_response_id,
                auto_previous_response_id=True,
            )
            return first, second

    before = len(live.completions())
    first, second = asyncio.run(run())
    assert len(calls) == 2
    assert "21" in first.final_output
    assert isinstance(second.final_output, str)
    agent_client = live.client("key-agents")
    last = agent_client.responses.retrieve(second.last_response_id)
    assert last.previous_response_id is not None  # chained, not resent in full
    records = live.completions()[before:]
    assert len(records) == 4  # call, answer, call, answer
    # every later turn was sent as a continuation: its prompt extends the one before
    for earlier, later in itertools.pairwise(records):
        assert later.prompt_ids[: len(earlier.prompt_ids) - 3] == earlier.prompt_ids[:-3]


# -- leases, bounds, store off ---------------------------------------------------------------------


def test_a_response_whose_runner_died_ends_failed_for_readers(live: Stack) -> None:
    """A process that dies mid-response leaves it `in_progress` with a lease that runs out;
    the next reader ends it as failed, with the events a resumed stream needs."""
    from proxy.harmony.history.stored import StoredResponse, encode_events
    from proxy.store import Append, Create

    client = live.client()
    events = dumped(client.responses.create(model=MODEL, input="Half done", stream=True))
    cut = next(i for i, e in enumerate(events) if e["type"].endswith(".delta")) + 1
    orphan = "resp_" + "a" * 32
    started = [
        {**e, "response": {**e["response"], "id": orphan}} if "response" in e else e
        for e in events[:cut]
    ]
    record = StoredResponse(started[0]["response"], [], (), True)
    scope = scope_of([(b"authorization", b"Bearer key-alice")], "authorization")
    now = time.time()
    assert live.store is not None
    writes = [
        Create(orphan, scope, record.encode(), created=now, expires=now + 60, lease=now - 1),
        Append(orphan, *encode_events(started)),
    ]
    live.proxy.call(live.store.apply(writes))
    failed = client.responses.retrieve(orphan)
    assert failed.status == "failed"
    assert failed.error is not None
    assert "stopped" in failed.error.message
    replay = dumped(client.responses.retrieve(orphan, stream=True))
    assert assert_well_formed(replay)["status"] == "failed"
    assert replay[-2]["code"] == "runner_gone"


def test_store_max_bytes_evicts_the_oldest_responses(encoding: HarmonyEncoding) -> None:
    with stack(encoding, MemoryStore(max_bytes=60_000)) as small:
        client = small.client(max_retries=0)
        keys = [client.responses.create(model=MODEL, input=f"Turn {n}").id for n in range(12)]
        assert client.responses.retrieve(keys[-1]).status == "completed"
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(keys[0])
        assert small.metric("proxy_store_evictions_total", reason="size") > 0


def test_store_off_refuses_what_needs_it_and_passes_ids_through(
    encoding: HarmonyEncoding,
) -> None:
    with stack(encoding, None, store_url="off") as off:
        client = off.client(max_retries=0)
        created = client.responses.create(model=MODEL, input="Stateless")
        assert created.status == "completed"
        for body, param in (
            ({"previous_response_id": created.id}, "previous_response_id"),
            ({"background": True}, "background"),
            ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].id"),
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                client.responses.create(**{"model": MODEL, "input": "x", **body})  # type: ignore[call-overload]
            assert caught.value.body["param"] == param  # type: ignore[index]
            assert "off" in caught.value.body["message"]  # type: ignore[index]
            if param == "previous_response_id":
                assert caught.value.code == "previous_response_not_found"
        with pytest.raises(openai.BadRequestError) as counted:
            client.responses.input_tokens.count(input="x", previous_response_id=created.id)
        assert counted.value.code == "previous_response_not_found"
        # GET is upstream's business then: trtllm-serve never saw this response
        answer = httpx.get(f"{off.base_url}/responses/{created.id}")
        assert answer.status_code == 404
        assert "not found" in answer.text
        assert client.responses.input_tokens.count(input="x").input_tokens > 0


# -- background runs that do not end by themselves ---------------------------------------------


def test_background_refused_by_upstream_is_stored_failed(live: Stack) -> None:
    client = live.client()
    queued = client.responses.create(
        model=MODEL, input="Refused", background=True, extra_headers={"X-Sim-Fault": "http:500"}
    )
    assert queued.status == "queued"
    failed = until(lambda: (r := client.responses.retrieve(queued.id)).status == "failed" and r)
    assert failed.error is not None
    events = dumped(client.responses.retrieve(queued.id, stream=True))
    assert assert_well_formed(events)["status"] == "failed"


def test_background_runs_still_going_at_shutdown_end_failed(encoding: HarmonyEncoding) -> None:
    import asyncio

    from proxy.harmony.history.stored import StoredResponse, decode_events

    store = MemoryStore()
    with stack(encoding, store, drain_timeout=0.3) as short:
        client = short.client()
        queued = client.responses.create(
            model=MODEL, input="Outlive me", background=True, extra_headers=LONG
        )
        until(lambda: client.responses.retrieve(queued.id).output)
        scope = scope_of([(b"authorization", b"Bearer key-alice")], "authorization")
    # the proxy stopped (its lifespan waited the drain period, then ended the run)
    entry = asyncio.run(store.get(scope, queued.id))
    assert entry is not None
    assert StoredResponse.decode(entry.doc).status == "failed"
    events = decode_events(asyncio.run(store.read_log(queued.id)))
    assert assert_well_formed(events)["status"] == "failed"
    assert events[-2]["code"] == "server_shutting_down"
