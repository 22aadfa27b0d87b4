"""Shared by the constraint tests (tests/test_constraints_live.py, tests/test_first_probe.py): the
constraints and an oracle of what each demands, the simulator behind a gate a test controls, and
a proxy in front of it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

import orjson
from openai import OpenAI
from openai_harmony import HarmonyEncoding
from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send

from proxy.config.settings import Settings
from proxy.server.app import create_app
from proxy.server.deps import ServerState
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from tests.live import LiveServer, wait_for

MODEL = "openai/gpt-oss-120b"


def _tool(name: str, prop: str) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": f"The {name.removeprefix('get_')} for a {prop}.",
        "parameters": {
            "type": "object",
            "properties": {prop: {"type": "string"}},
            "required": [prop],
        },
    }


TOOLS = [_tool("get_weather", "city"), _tool("get_time", "timezone")]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
ONLY_TIME = [{"type": "function", "name": "get_time"}]

#: Every constraint: the request fields, the field a refusal names, and what holds.
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "none": {"tool_choice": "none"},
    "required": {"tool_choice": "required"},
    "named": {"tool_choice": {"type": "function", "name": "get_time"}},
    "allowed_auto": {"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": ONLY_TIME}},
    "allowed_required": {
        "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": ONLY_TIME}
    },
    "json_schema": {
        "tools": None,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA, "strict": True}},
    },
    "json_object": {"tools": None, "text": {"format": {"type": "json_object"}}},
}
KIND = {
    "none": "tool_choice_none",
    "required": "tool_choice_required",
    "named": "tool_choice_function",
    "allowed_auto": "tool_choice_allowed_tools",
    "allowed_required": "tool_choice_allowed_tools",
    "json_schema": "json_schema",
    "json_object": "json_object",
}


def body_for(name: str, **more: Any) -> dict[str, Any]:
    body = {"model": MODEL, "input": "What's the weather in Paris?", "tools": TOOLS}
    body.update(CONSTRAINTS[name])
    body.update(more)
    return {key: value for key, value in body.items() if value is not None}


def holds(name: str, response: dict[str, Any]) -> bool:
    """Whether a response's output holds to constraint `name` (an oracle of the test's own)."""
    calls = [item["name"] for item in response["output"] if item["type"] == "function_call"]
    answers = [
        "".join(part["text"] for part in item["content"])
        for item in response["output"]
        if item["type"] == "message" and item.get("phase") != "commentary"
    ]
    if name == "none":
        return not calls
    if name == "required":
        return bool(calls) and not answers
    if name in ("named", "allowed_required"):
        return calls == ["get_time"] and not answers
    if name == "allowed_auto":
        return set(calls) <= {"get_time"}
    try:
        values = [json.loads(answer) for answer in answers]
    except ValueError:
        return False
    if name == "json_object":
        return bool(values) and all(isinstance(value, dict) for value in values)
    return bool(values) and all(isinstance(value.get("answer"), int) for value in values)


class Gate:
    """The simulator behind a gate a test controls: `/v1/models` held `hold` seconds (a slow
    first probe), `response_format` refused with a 400 when `refuse` (a server that does not
    take the field), and every `/v1/completions` body kept."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.hold = 0.0
        self.refuse = False
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ("/v1/models", "/v1/completions"):
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/v1/models":
            await asyncio.sleep(self.hold)
            await self.app(scope, receive, send)
            return
        raw, more = b"", True
        while more:
            message = await receive()
            raw, more = raw + message.get("body", b""), message.get("more_body", False)
        body = orjson.loads(raw)
        self.bodies.append(body)
        if self.refuse and "response_format" in body:
            error = {"object": "error", "message": "response_format is not supported", "code": 400}
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": orjson.dumps(error)})
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


@dataclasses.dataclass
class Proxy:
    server: LiveServer
    app: Any
    gate: Gate
    clients: list[OpenAI] = dataclasses.field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, **kwargs: Any) -> OpenAI:
        """A strict SDK client, closed with the proxy (its pooled sockets with it)."""
        made = OpenAI(
            base_url=self.url + "/v1", api_key="x", _strict_response_validation=True, **kwargs
        )
        self.clients.append(made)
        return made

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.server.__exit__()

    def metric(self, name: str, **labels: str) -> float:
        value = self.app.state.registry.get_sample_value(name, labels)
        return 0.0 if value is None else float(value)


class Upstreams:
    """The two simulated upstreams, each behind its `Gate`, served while the module runs."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.encoding = encoding
        self.servers: dict[str, tuple[LiveServer, Gate]] = {}

    def start(self, kind: str, **config: Any) -> tuple[LiveServer, Gate]:
        values = {"token_seconds": 0.0, "first_token_seconds": 0.0, **config}
        simulator = SimulatorConfig(guided_decoding=kind == "xgrammar", **values)
        gate = Gate(create_simulator_app(simulator, self.encoding))
        server = LiveServer(gate).__enter__()
        self.servers[kind] = (server, gate)
        return server, gate

    def close(self) -> None:
        for server, _ in self.servers.values():
            server.__exit__()


def start_proxy(
    encoding: HarmonyEncoding,
    upstream: tuple[LiveServer, Gate],
    *,
    wait: bool = True,
    state: ServerState | None = None,
    logger: logging.Logger | None = None,
    **settings: Any,
) -> Proxy:
    server, gate = upstream
    config = dataclasses.replace(
        Settings(upstream_url=server.url, store_url="memory://", render_workers=0), **settings
    )
    app = create_app(config, encoding, registry=CollectorRegistry(), state=state, logger=logger)
    live = LiveServer(app).__enter__()
    if wait:
        assert wait_for(lambda: app.state.proxy.probed.is_set(), 10)
    return Proxy(live, app, gate)


def streamed(client: OpenAI, body: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    return [
        event.model_dump(mode="json", exclude_unset=True, by_alias=True)
        for event in client.responses.create(stream=True, **body, **kwargs)
    ]
