"""Helpers of the simulator tests: a real simulator on a loopback port, and reading its streams.

Two ways to run one, both real uvicorn on real sockets (never an in-memory ASGI transport, which
buffers bodies): `SimThread`, a simulator on its own event loop in a background thread, shared by
the tests of a module and spoken to with a sync httpx client (fast: no start per test); and
`simulator()`, started with `start_simulator` in the test's own loop (`run`), for what needs the
embedding API itself.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from openai_harmony import HarmonyEncoding

from proxy.simulator import (
    RequestRecord,
    RunningSimulator,
    SimulatorConfig,
    create_simulator_app,
    simulator_state,
    start_simulator,
)
from proxy.sse import SSEDecoder
from tests.conftest import FIXTURES

T = TypeVar("T")
ORACLE = FIXTURES / "trtllm-oracle"
MANIFEST: dict[str, Any] = json.loads((ORACLE / "manifest.json").read_text())
FAST = SimulatorConfig(first_token_seconds=0.0, token_seconds=0.0)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class FixtureIds:
    """The ids of the oracle recordings: `resp_…01`, then (upstream drew one uuid for itself)
    `…03`, `…04`, … for the output items. `reset()` before each request."""

    def __init__(self) -> None:
        self._next = 1

    def reset(self) -> None:
        self._next = 1

    def __call__(self, prefix: str) -> str:
        number = self._next
        self._next += 2 if number == 1 else 1
        return f"{prefix}_{number:032x}"


@dataclass
class Sim:
    """A running simulator and a client to it."""

    server: RunningSimulator
    client: httpx.AsyncClient

    @property
    def records(self) -> list[RequestRecord]:
        return list(simulator_state(self.server.app).requests)

    @property
    def last(self) -> RequestRecord:
        return self.records[-1]


@asynccontextmanager
async def simulator(
    encoding: HarmonyEncoding, config: SimulatorConfig = FAST, **seams: Any
) -> AsyncIterator[Sim]:
    app = create_simulator_app(config, encoding, **seams)
    server = await start_simulator(config, encoding, app=app)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:
            yield Sim(server, client)
    finally:
        await server.stop()


class SimThread:
    """`with SimThread(encoding) as sim:` — a simulator on its own loop in a daemon thread."""

    def __init__(
        self, encoding: HarmonyEncoding, config: SimulatorConfig = FAST, **seams: Any
    ) -> None:
        self.app = create_simulator_app(config, encoding, **seams)
        self._config, self._encoding = config, encoding
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: RunningSimulator | None = None
        self.client: httpx.Client | None = None

    def __enter__(self) -> SimThread:
        self._thread.start()
        self.server = self.call(start_simulator(self._config, self._encoding, app=self.app))
        self.client = httpx.Client(base_url=self.server.url, timeout=10.0)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server is not None
        assert self.client is not None
        self.client.close()
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        """Run a coroutine on the simulator's loop (to touch its state safely)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def http(self) -> httpx.Client:
        assert self.client is not None
        return self.client

    @property
    def records(self) -> list[RequestRecord]:
        return list(simulator_state(self.app).requests)

    @property
    def last(self) -> RequestRecord:
        return self.records[-1]

    def stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Streamed:
        """POST and read the whole SSE body, noting a connection that broke."""
        decoder = SSEDecoder()
        with self.http.stream("POST", path, json=body, headers=headers or {}) as response:
            result = Streamed(response.status_code, response.headers)
            try:
                for chunk in response.iter_bytes():
                    result.messages += [(m.event, m.data) for m in decoder.feed(chunk)]
            except httpx.TransportError as exc:
                result.broken = type(exc).__name__
        result.messages += [(m.event, m.data) for m in decoder.flush()]
        return result


@dataclass
class Streamed:
    """A streamed answer: status, headers, the SSE messages, and how the body ended."""

    status: int
    headers: httpx.Headers
    messages: list[tuple[str, str]] = field(default_factory=list)  # (event, data)
    broken: str | None = None  # the transport error when the connection dropped mid-body

    @property
    def data(self) -> list[str]:
        return [data for _, data in self.messages]

    def json(self) -> list[Any]:
        """Every data payload parsed, `[DONE]` left out."""
        return [json.loads(data) for data in self.data if data != "[DONE]"]


async def stream(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Streamed:
    """POST and read the whole SSE body, noting a connection that broke."""
    decoder = SSEDecoder()
    async with client.stream("POST", path, json=body, headers=headers or {}) as response:
        result = Streamed(response.status_code, response.headers)
        try:
            async for chunk in response.aiter_bytes():
                result.messages += [(m.event, m.data) for m in decoder.feed(chunk)]
        except httpx.TransportError as exc:
            result.broken = type(exc).__name__
    result.messages += [(m.event, m.data) for m in decoder.flush()]
    return result


def replay_headers(ids: list[int], sizes: list[int] | None = None, **extra: str) -> dict[str, str]:
    headers = {"X-Sim-Replay": ",".join(map(str, ids))}
    if sizes is not None:
        headers["X-Sim-Chunks"] = ",".join(map(str, sizes))
    headers.update(
        {f"X-Sim-{key.replace('_', '-').title()}": value for key, value in extra.items()}
    )
    return headers


def transcripts(*, stream: bool) -> Iterator[dict[str, Any]]:
    return (t for t in MANIFEST["transcripts"] if t["stream"] is stream)


def recorded_frames(transcript: dict[str, Any]) -> list[str]:
    """The data of each recorded frame (event frames: `event: …\\ndata: …\\n\\n`)."""
    lines = (ORACLE / transcript["file"]).read_text().splitlines()
    return [json.loads(line)["frame"].split("data: ", 1)[1].rstrip("\n") for line in lines]


def scenario(transcript: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = MANIFEST["scenarios"][transcript["scenario"]]
    return found


def delivered_groups(transcript: dict[str, Any]) -> list[list[int]]:
    """The ids of each engine output the recording was made from (the stop token cut from the
    last one in `stripped` mode)."""
    ids, groups, position = scenario(transcript)["token_ids"], [], 0
    for size in transcript["chunk_sizes"]:
        groups.append(ids[position : position + size])
        position += size
    if transcript["stop_mode"] == "stripped":
        groups[-1] = groups[-1][:-1]
    return groups
