"""The render seam: worker processes give the same `PreparedRequest` as
`prepare_request` on the loop, cheap bodies stay inline, and a render that runs too long, a full
queue, a dead worker or a cancelled caller each end in a clear answer with the pool still serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy import vocab
from proxy.errors import ClientError
from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.request.prepare import PreparedRequest, prepare_request
from proxy.server.rendering import worker as render_worker
from proxy.server.rendering.pool import RenderPool
from proxy.server.rendering.renderer import (
    INLINE_MAX_BYTES,
    INLINE_MAX_OBJECTS,
    INLINE_MAX_RUN,
    InlineRenderer,
    is_cheap,
    longest_run,
)
from tests.conftest import FIXTURES
from tests.reliability import TOOLS

MODEL = "openai/gpt-oss-120b"
#: A render that takes minutes in openai-harmony's quadratic BPE.
HOSTILE = {"model": MODEL, "input": "a" * 200_000}


def golden_bodies() -> list[dict[str, Any]]:
    """Every request body of the recorded upstream prompt fixtures (valid and invalid ones)."""
    bodies = []
    for path in sorted((FIXTURES / "trtllm-prompts").glob("d*.json")):
        if path.name.endswith(".expected_fixed.json"):
            continue
        case = json.loads(path.read_text())
        for step in case.get("steps") or [case]:
            if isinstance(step.get("request_body"), dict):
                bodies.append(step["request_body"])
    return bodies


def agent_body(items: int) -> dict[str, Any]:
    """Above every inline bound: goes to a worker."""
    history: list[dict[str, Any]] = [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n}: " + "word " * 40}
        for n in range(items)
    ]
    return {"model": MODEL, "instructions": "Be brief.", "tools": TOOLS, "input": history}


def run(
    coroutine: Callable[[RenderPool], Coroutine[Any, Any, Any]],
    encoding: HarmonyEncoding,
    **options: Any,
) -> Any:
    """Run `coroutine(pool)` against a started pool of real worker processes."""

    async def main() -> Any:
        async with started_pool(encoding, **options) as pool:
            return await coroutine(pool)

    return asyncio.run(main())


class Recorder:
    def __init__(self) -> None:
        self.renders: list[tuple[str, str]] = []
        self.logs: list[tuple[str, dict[str, Any]]] = []

    def on_render(self, path: str, outcome: str) -> None:
        self.renders.append((path, outcome))

    def log(self, message: str, **fields: Any) -> None:
        self.logs.append((message, fields))


class started_pool:
    def __init__(self, encoding: HarmonyEncoding, **options: Any) -> None:
        self.recorder: Recorder = options.pop("recorder", Recorder())
        settings = {"workers": 1, "timeout": 10.0, "queue": 8, **options}
        self.pool = RenderPool(
            encoding,
            vocab.loaded_dir(os.environ),
            log=self.recorder.log,
            on_render=self.recorder.on_render,
            **settings,
        )

    async def __aenter__(self) -> RenderPool:
        await self.pool.start()
        await self.pool.wait_ready(60)
        return self.pool

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.aclose()
        assert self.pool.pids == []


def outcome(prepare: Callable[[], PreparedRequest]) -> Any:
    """A PreparedRequest, or the 4xx's fields: what a client would see."""
    try:
        return prepare()
    except ClientError as error:
        return ("error", error.status, error.message, error.param, error.code)


async def aoutcome(work: Coroutine[Any, Any, PreparedRequest]) -> Any:
    try:
        return await work
    except ClientError as error:
        return ("error", error.status, error.message, error.param, error.code)


# -- the same answers ----------------------------------------------------------------------------


def test_pool_and_inline_give_the_same_prepared_requests(encoding: HarmonyEncoding) -> None:
    bodies = [*golden_bodies(), agent_body(30), agent_body(3), {"model": MODEL, "input": "Hi"}]
    bodies += [{**body, "input": "x" * 3000} for body in bodies[:10]]  # force worker renders
    assert len(bodies) > 40
    expected = [outcome(lambda b=body: prepare_request(b, encoding)) for body in bodies]
    recorder = Recorder()

    async def render_all(pool: RenderPool) -> list[Any]:
        return [await aoutcome(pool.prepare(body)) for body in bodies]

    got = run(render_all, encoding, recorder=recorder)
    assert got == expected
    for prepared in got:
        if isinstance(prepared, PreparedRequest):
            # one list in both places, as prepare_request builds it
            assert prepared.completion_body["prompt"] is prepared.prompt_token_ids
    paths = {path for path, _ in recorder.renders}
    assert paths == {"inline", "worker"}
    assert ("worker", "client_error") in recorder.renders
    assert ("worker", "ok") in recorder.renders


def test_the_wire_format_round_trips(encoding: HarmonyEncoding) -> None:
    prepared = prepare_request(agent_body(12), encoding)
    payload = render_worker.encode_prepared(prepared)
    assert payload[:1] == render_worker.PREPARED
    again = render_worker.decode_prepared(memoryview(payload)[1:])
    assert again == prepared
    assert again.completion_body["prompt"] is again.prompt_token_ids
    error = ClientError("bad", status=422, param="input[0]", code="invalid_value")
    back = render_worker.decode_error(memoryview(render_worker.encode_error(error))[1:])
    assert (back.status, back.message, back.param, back.code) == (
        422,
        "bad",
        "input[0]",
        "invalid_value",
    )


def test_a_body_orjson_cannot_encode_is_refused_inline_as_before(encoding: HarmonyEncoding) -> None:
    deep: Any = []
    for _ in range(300):  # past orjson's 254 levels, so it cannot go to a worker
        deep = [deep]
    body = {"model": MODEL, "input": "x" * 5000, "metadata": {"k": deep}}
    expected = outcome(lambda: prepare_request(body, encoding))
    assert expected[0] == "error"
    assert expected[1] == 400
    recorder = Recorder()
    got = run(lambda pool: aoutcome(pool.prepare(body)), encoding, recorder=recorder)
    assert got == expected
    assert recorder.renders == [("inline", "client_error")]


# -- the fast path ---------------------------------------------------------------------------------


def test_the_fast_path_bounds() -> None:
    assert longest_run(b"") == 0
    assert longest_run(b"ab cd\tefg\n h") == 3
    small = orjson.dumps({"model": MODEL, "input": "Where is my order?", "stream": True})
    assert is_cheap(small)
    assert not is_cheap(b"x" * (INLINE_MAX_BYTES + 1))
    assert not is_cheap(b"{" * (INLINE_MAX_OBJECTS + 1))
    assert not is_cheap(b"a" * (INLINE_MAX_RUN + 1))
    assert is_cheap(b"a" * INLINE_MAX_RUN)
    # JSON escapes make a run look longer, never shorter: "\n" is two non-space bytes
    assert longest_run(orjson.dumps("a\nb")) == 6


def test_inline_renderer_is_prepare_request(encoding: HarmonyEncoding) -> None:
    renderer = InlineRenderer(encoding)
    body = agent_body(4)
    assert renderer.ready()
    assert asyncio.run(renderer.prepare(body)) == prepare_request(body, encoding)


# -- limits ----------------------------------------------------------------------------------------


def test_a_render_over_render_timeout_is_a_400_and_the_worker_is_replaced(
    encoding: HarmonyEncoding,
) -> None:
    recorder = Recorder()

    async def scenario(pool: RenderPool) -> tuple[Any, list[int], list[int], Any]:
        before = pool.pids
        hostile = await aoutcome(pool.prepare(HOSTILE))
        assert not pool.ready()  # killed at once
        await pool.wait_ready(60)  # the replacement loads the encoding
        after = pool.pids
        return hostile, before, after, await pool.prepare(agent_body(5))

    hostile, before, after, next_one = run(scenario, encoding, timeout=1.0, recorder=recorder)
    assert hostile[:2] == ("error", 400)
    assert hostile[4] == "render_timeout"
    assert "render_timeout (1 s)" in hostile[2]
    assert hostile[3] == "input"
    assert before != after  # killed and replaced
    assert len(after) == 1
    assert next_one == prepare_request(agent_body(5), encoding)
    assert ("worker", "timeout") in recorder.renders
    assert any(message == "render timeout" for message, _ in recorder.logs)


def test_a_full_queue_is_a_429(encoding: HarmonyEncoding) -> None:
    recorder = Recorder()

    async def scenario(pool: RenderPool) -> list[Any]:
        busy = asyncio.ensure_future(aoutcome(pool.prepare(HOSTILE)))  # holds the one worker
        await asyncio.sleep(0.2)
        waiting = asyncio.ensure_future(aoutcome(pool.prepare(agent_body(5))))  # the queue
        await asyncio.sleep(0.1)
        refused = await aoutcome(pool.prepare(agent_body(6)))  # over render_queue
        return [refused, await waiting, await busy]

    refused, waited, busy = run(scenario, encoding, timeout=1.5, queue=1, recorder=recorder)
    assert refused[:2] == ("error", 429)
    assert refused[4] == "render_queue_full"
    assert "1 requests are already waiting" in refused[2]
    # the queued request waited while the hostile one held the worker: no worker came free
    # within render_timeout, so it is a 429 as well (a bounded wait), never a hang
    assert waited[:2] == ("error", 429)
    assert "no render worker was free within render_timeout" in waited[2]
    assert busy[4] == "render_timeout"
    assert recorder.renders.count(("worker", "queue_full")) == 2


def test_a_worker_that_dies_is_restarted(encoding: HarmonyEncoding) -> None:
    recorder = Recorder()

    async def scenario(pool: RenderPool) -> tuple[Any, Any, Any]:
        (idle,) = pool.pids
        os.kill(idle, signal.SIGKILL)  # dies while idle
        for _ in range(500):
            if pool.pids and pool.pids != [idle]:
                break
            await asyncio.sleep(0.01)
        await pool.wait_ready(60)
        first = await pool.prepare(agent_body(5))
        # dies while rendering
        work = asyncio.ensure_future(aoutcome(pool.prepare(HOSTILE)))
        await asyncio.sleep(0.3)
        os.kill(pool.pids[0], signal.SIGKILL)
        died = await work
        await pool.wait_ready(60)
        return first, died, await pool.prepare(agent_body(6))

    first, died, last = run(scenario, encoding, recorder=recorder)
    assert first == prepare_request(agent_body(5), encoding)
    assert died[:2] == ("error", 400)
    assert died[4] == "render_failed"
    # -9, or 255 when asyncio's child watcher lost the race to reap it
    assert "exit code -9" in died[2] or "exit code 255" in died[2], died[2]
    assert last == prepare_request(agent_body(6), encoding)
    exits = [fields for message, fields in recorder.logs if message == "render worker exited"]
    assert len(exits) == 2
    assert ("worker", "worker_died") in recorder.renders


def test_a_cancelled_caller_leaves_the_worker_in_step(encoding: HarmonyEncoding) -> None:
    async def scenario(pool: RenderPool) -> list[PreparedRequest]:
        results = []
        for items in (20, 21, 22):
            task = asyncio.ensure_future(pool.prepare(agent_body(items)))
            await asyncio.sleep(0)  # on its way to the worker
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            results.append(await pool.prepare(agent_body(items + 10)))
        return results

    got = run(scenario, encoding)
    assert got == [prepare_request(agent_body(n + 10), encoding) for n in (20, 21, 22)]


def test_the_pool_must_be_started(encoding: HarmonyEncoding) -> None:
    pool = RenderPool(encoding, vocab.loaded_dir(os.environ), workers=1, timeout=1, queue=1)
    assert not pool.ready()
    # cheap bodies render inline even so; the rest needs the workers of the lifespan
    assert asyncio.run(pool.prepare({"model": MODEL, "input": "Hi"})).model == MODEL
    with pytest.raises(RuntimeError, match="not running"):
        asyncio.run(pool.prepare(agent_body(5)))
    with pytest.raises(ValueError, match="at least one worker"):
        RenderPool(encoding, vocab.loaded_dir(os.environ), workers=0, timeout=1, queue=1)


def test_workers_start_with_the_first_body_that_needs_one(encoding: HarmonyEncoding) -> None:
    """An idle proxy, or one that only sees cheap bodies, runs no render worker process."""

    async def scenario() -> tuple[bool, list[int], list[int], Any]:
        pool = RenderPool(encoding, vocab.loaded_dir(os.environ), workers=2, timeout=10, queue=4)
        await pool.start()
        try:
            await pool.prepare({"model": MODEL, "input": "Hi"})  # inline
            await asyncio.sleep(0.1)
            ready, idle = pool.ready(), pool.pids
            prepared = await pool.prepare(agent_body(5))  # waits for a worker to load
            return ready, idle, pool.pids, prepared
        finally:
            await pool.aclose()

    ready, idle, spawned, prepared = asyncio.run(scenario())
    assert ready  # /readyz: nothing to wait for yet
    assert idle == []
    assert len(spawned) == 2
    assert prepared == prepare_request(agent_body(5), encoding)


def test_a_harmony_panic_is_a_400_and_the_worker_is_replaced(encoding: HarmonyEncoding) -> None:
    """A 1 MB run of one letter overflows the stack of openai-harmony's regex: a panic (a 500
    inline). The worker answers a 400 and exits; the next requests find a new worker."""
    panic = {"model": MODEL, "input": "a" * 1_000_000}

    async def scenario(pool: RenderPool) -> list[Any]:
        first = await aoutcome(pool.prepare(panic))
        second = await aoutcome(pool.prepare(panic))  # never handed to the exiting worker
        return [first, second, await pool.prepare(agent_body(5))]

    first, second, served = run(scenario, encoding)
    for answer in (first, second):
        assert answer[:2] == ("error", 400)
        assert answer[4] == "render_failed"
        assert "openai-harmony could not render this request" in answer[2]
    assert served == prepare_request(agent_body(5), encoding)


def test_the_worker_loop_in_process(encoding: HarmonyEncoding) -> None:
    """`render_worker.serve` and `handle` on in-memory pipes: ready, a prompt, a 400, EOF; our
    own bug (here: no encoding) is reported, a panic carries its 400 and ends the loop."""
    import io

    def frame(body: dict[str, Any] | bytes) -> bytes:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        return render_worker.HEADER.pack(len(raw)) + raw

    options = render_worker.RenderOptions().encode()
    inbound = io.BytesIO(frame(options) + frame(agent_body(3)) + frame({"model": MODEL}))
    outbound = io.BytesIO()
    render_worker.serve(vocab.loaded_dir(os.environ), inbound, outbound)
    replies = []
    data = memoryview(outbound.getvalue())
    while data:
        (size,) = render_worker.HEADER.unpack_from(data)
        replies.append(data[render_worker.HEADER.size : render_worker.HEADER.size + size])
        data = data[render_worker.HEADER.size + size :]
    assert [bytes(reply[:1]) for reply in replies] == [b"R", b"O", b"E"]
    assert render_worker.decode_prepared(replies[1][1:]) == prepare_request(agent_body(3), encoding)
    assert render_worker.decode_error(replies[2][1:]).code == "missing_required_parameter"
    prefixes = PrefixCache(encoding)
    failure = render_worker.handle(orjson.dumps(agent_body(3)), None, prefixes)
    assert failure.startswith(render_worker.FAILURE)
    with pytest.raises(render_worker.Panicked) as panicked:
        render_worker.handle(
            orjson.dumps({"model": MODEL, "input": "a" * 1_000_000}), encoding, prefixes
        )
    reply = panicked.value.reply
    assert reply.startswith(render_worker.PANICKED)
    assert render_worker.decode_error(memoryview(reply)[1:]).code == "render_failed"


def test_workers_render_with_the_pools_options(encoding: HarmonyEncoding) -> None:
    """The keys and the context limit reach the workers (their first frame), so a sealed
    reasoning item and an over-long prompt are answered as inline."""
    from proxy.harmony.reasoning_seal import ReasoningKeys

    keys = ReasoningKeys.generate("k1")
    options = render_worker.RenderOptions(reasoning_keys=keys, max_prompt_tokens=4000)
    thought = "Let me think about the weather in Paris. " * 20
    sealed_item = {"type": "reasoning", "summary": [], "encrypted_content": keys.seal([thought])}
    plain_item = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": thought}],
    }
    question = {"role": "user", "content": "And tomorrow? " + "x" * 3000}  # worker-sized

    def body(item: dict[str, Any], words: int = 10) -> dict[str, Any]:
        return {
            "model": MODEL,
            "input": [item, {**question}, {"role": "user", "content": "w " * words}],
        }

    expected_ids = prepare_request(body(plain_item), encoding).prompt_token_ids
    long_body = body(plain_item, words=8000)

    async def render(pool: RenderPool) -> tuple[Any, Any, Any]:
        return (
            await aoutcome(pool.prepare(body(sealed_item))),
            await aoutcome(pool.prepare(long_body)),
            await aoutcome(pool.prepare(body({**sealed_item, "encrypted_content": "AAAA"}))),
        )

    sealed, too_long, foreign = run(render, encoding, options=options)
    assert isinstance(sealed, PreparedRequest)
    assert sealed.prompt_token_ids == expected_ids
    assert too_long[:2] == ("error", 400), too_long
    assert too_long[4] == "context_length_exceeded", too_long
    assert foreign[:2] == ("error", 400), foreign
    assert foreign[4] == "invalid_encrypted_content", foreign
    # and the same answer without a worker
    inline = outcome(lambda: options.render(long_body, encoding, None))
    assert inline == too_long
