"""The stateful API on real `serve` processes: every call through the
`openai` SDK, on the embedded store (a restart loses nothing; two processes on one host share
it) and on a real Redis with two proxy processes — create on one, continue, resume and cancel on
the other. Each `serve` runs its built-in simulator as upstream."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.stateful_support import LONG, MODEL, TOOLS, dumped, first_events, until
from tests.test_serve_cli import start
from tests.wellformed import assert_well_formed

PACE = ("--simulator-token-seconds", "0.001", "--keepalive-interval", "0.5")


@contextmanager
def serving(*args: str) -> Iterator[str]:
    process, url = start(*PACE, *args)
    try:
        yield url
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    _, err = process.communicate()
    assert b"Traceback" not in err, err.decode()[-3000:]


_clients: list[OpenAI] = []


def client(url: str, key: str = "key-serve") -> OpenAI:
    """A strict SDK client, closed after the test (`closing_clients`)."""
    made = OpenAI(base_url=url + "/v1", api_key=key, _strict_response_validation=True)
    _clients.append(made)
    return made


@pytest.fixture(autouse=True)
def closing_clients() -> Iterator[None]:
    yield
    while _clients:
        _clients.pop().close()


def snapshot(sdk: OpenAI, key: str) -> dict[str, Any]:
    """Everything the API tells about one stored response."""
    return {
        "response": sdk.responses.retrieve(key).model_dump(mode="json"),
        "items": [i.model_dump(mode="json") for i in sdk.responses.input_items.list(key)],
        "events": dumped(sdk.responses.retrieve(key, stream=True)),
    }


def test_embedded_store_survives_a_restart(tmp_path: Path) -> None:
    data = ("--data-dir", str(tmp_path / "data"))
    with serving(*data) as url:
        sdk = client(url)
        first = sdk.responses.create(model=MODEL, input="Weather in Paris?", tools=TOOLS)
        streamed = dumped(
            sdk.responses.create(
                model=MODEL, input="Go on", previous_response_id=first.id, stream=True
            )
        )
        second = assert_well_formed(streamed)["id"]
        background = sdk.responses.create(model=MODEL, input="Later", background=True)
        until(lambda: sdk.responses.retrieve(background.id).status == "completed")
        before = {key: snapshot(sdk, key) for key in (first.id, second, background.id)}
    assert (tmp_path / "data" / "store.sqlite3").exists()
    with serving(*data) as url:
        sdk = client(url)
        after = {key: snapshot(sdk, key) for key in before}
        assert after == before
        third = sdk.responses.create(model=MODEL, input="Still there?", previous_response_id=second)
        assert third.status == "completed"
        with pytest.raises(openai.NotFoundError):
            client(url, "key-other").responses.retrieve(first.id)


@pytest.fixture(params=["embedded", "redis"])
def two_processes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two proxy processes on one store: the embedded one in a shared data directory (the
    worker processes of one host), or Redis (replicas)."""
    if request.param == "embedded":
        shared = ("--data-dir", str(tmp_path / "data"))
    else:
        shared = ("--store-url", request.getfixturevalue("redis_url") + f"?prefix={tmp_path.name}:")
    with serving(*shared) as first, serving(*shared) as second:
        yield first, second


def test_two_processes_share_create_continue_resume_cancel(
    two_processes: tuple[str, str],
) -> None:
    a, b = (client(url) for url in two_processes)
    # create on one, continue on the other
    created = a.responses.create(model=MODEL, input="What's the weather in Paris?", tools=TOOLS)
    call = next(item for item in created.output if item.type == "function_call")
    answer = b.responses.create(
        model=MODEL,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."}],
        tools=TOOLS,
        previous_response_id=created.id,
    )
    assert answer.status == "completed"
    listed = [i.id for i in b.responses.input_items.list(answer.id, order="asc")]
    assert listed[1 : 1 + len(created.output)] == [item.id for item in created.output]
    # resume on the other: a background stream dropped on one, followed live on the other
    stream = a.responses.create(
        model=MODEL, input="A long story", background=True, stream=True, extra_headers=LONG
    )
    seen = first_events(stream, 5)
    key = seen[0]["response"]["id"]
    assert b.responses.retrieve(key).status == "in_progress"  # live, seen from the other
    rest = dumped(b.responses.retrieve(key, stream=True, starting_after=4))
    events = seen + rest
    assert assert_well_formed(events)["status"] == "completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # cancel on the other: the process running it hears it and stops its upstream request
    queued = a.responses.create(model=MODEL, input="Cancel me", background=True, extra_headers=LONG)
    until(lambda: b.responses.retrieve(queued.id).output)
    cancelled = b.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert a.responses.retrieve(queued.id).status == "cancelled"
    assert cancelled.usage is not None
    assert cancelled.usage.output_tokens < 4000  # stopped early
    # delete on one: gone on both
    b.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(created.id)
