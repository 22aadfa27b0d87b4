"""Shared by the stateful live tests: the simulator and a proxy on a given store, SDK clients."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from openai import OpenAI
from openai_harmony import HarmonyEncoding
from starlette.applications import Starlette

from proxy.config.settings import Settings
from proxy.server.app import create_app
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from proxy.simulator.records import RequestRecord
from proxy.store import Store
from tests.live import LiveServer, wait_for

MODEL = "openai/gpt-oss-120b"
#: A generation long enough to act on while it runs (the simulator's tokens, ~1 ms each).
LONG = {"X-Sim-Tokens": "4000"}
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


@dataclasses.dataclass
class Stack:
    simulator: LiveServer
    proxy: LiveServer
    app: Starlette
    store: Store | None
    clients: list[OpenAI] = dataclasses.field(default_factory=list)

    @property
    def base_url(self) -> str:
        return self.proxy.url + "/v1"

    def client(self, key: str = "key-alice", **kwargs: Any) -> OpenAI:
        """A strict SDK client, closed with the stack (its pooled sockets with it)."""
        made = OpenAI(
            base_url=self.base_url, api_key=key, _strict_response_validation=True, **kwargs
        )
        self.clients.append(made)
        return made

    def completions(self) -> list[RequestRecord]:
        """What reached upstream's /v1/completions, oldest first."""
        records = self.simulator.server.config.app.state.simulator.requests
        return [r for r in records if r.path == "/v1/completions"]

    def metric(self, name: str, **labels: str) -> float:
        registry = self.app.state.registry
        value = registry.get_sample_value(name, labels)
        return 0.0 if value is None else float(value)


@contextmanager
def stack(
    encoding: HarmonyEncoding,
    store: Store | None,
    token_seconds: float = 0.001,
    **overrides: Any,
) -> Iterator[Stack]:
    config = SimulatorConfig(
        stream_interval=20, token_seconds=token_seconds, first_token_seconds=0.001
    )
    with LiveServer(create_simulator_app(config, encoding)) as simulator:
        settings = dataclasses.replace(Settings(upstream_url=simulator.url), **overrides)
        app = create_app(settings, encoding, store=store)
        with LiveServer(app) as proxy:
            assert wait_for(lambda: app.state.proxy.capability.token_ids, 10)
            running = Stack(simulator, proxy, app, store)
            try:
                yield running
            finally:
                for made in running.clients:
                    made.close()


def until(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll `predicate` until it returns something truthy; return that (or fail)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def dumped(events: Any) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json", exclude_unset=True) for e in events]


def first_events(stream: Any, count: int) -> list[dict[str, Any]]:
    """Read `count` events of an SDK stream, then drop it (the client goes away)."""
    seen: list[dict[str, Any]] = []
    for event in stream:
        seen.append(event.model_dump(mode="json", exclude_unset=True))
        if len(seen) == count:
            break
    stream.close()
    return seen
