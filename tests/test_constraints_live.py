"""`tool_choice` and `text.format` on both kinds of upstream, end to end: the strict openai SDK
through a real proxy (uvicorn on loopback) in front of the simulator with a guided-decoding
backend (every constraint enforced) and without one (a stock trtllm-serve: `response_format`
accepted and ignored, and a scripted model that writes what the constraint forbids). Without
enforcement each constrained request is refused (the default) or, in best effort, ends `failed`
with `constraint_violated` — never a `completed` response that breaks its constraint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding
from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send

from proxy.config import Settings
from proxy.harmony.constraint import CONSTRAINT_VIOLATED
from proxy.server.app import create_app
from proxy.server.capability import decoder, with_setting
from proxy.server.deps import ServerState
from proxy.server.processes.runner import simulated_upstream
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from proxy.upstream.client import Upstream
from proxy.upstream.probe import GUIDED, NOT_PROBED, Capability
from tests.live import LiveServer, wait_for
from tests.wellformed import assert_well_formed

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


def _body(name: str, **more: Any) -> dict[str, Any]:
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


@pytest.fixture(scope="module")
def upstreams(encoding: HarmonyEncoding) -> Iterator[Upstreams]:
    made = Upstreams(encoding)
    made.start("xgrammar")
    made.start("stock")
    yield made
    made.close()


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


@pytest.fixture(scope="module")
def proxies(encoding: HarmonyEncoding, upstreams: Upstreams) -> Iterator[dict[str, Proxy]]:
    made = {
        f"{kind}/{policy}": start_proxy(
            encoding, upstreams.servers[kind], unenforced_constraints=policy
        )
        for kind in ("xgrammar", "stock")
        for policy in ("refuse", "best_effort")
    }
    yield made
    for proxy in made.values():
        proxy.close()


def streamed(client: OpenAI, body: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    return [
        event.model_dump(mode="json", exclude_unset=True, by_alias=True)
        for event in client.responses.create(stream=True, **body, **kwargs)
    ]


# -- what the probe finds ------------------------------------------------------------------------


def test_the_probe_tells_the_two_upstreams_apart(
    proxies: dict[str, Proxy], upstreams: Upstreams
) -> None:
    for name, proxy in proxies.items():
        capability = proxy.app.state.proxy.capability
        enforced = name.startswith("xgrammar")
        assert capability.token_ids
        assert capability.guided is enforced
        assert capability.takes_response_format
        assert (capability.guided_detail == GUIDED) is enforced
        assert capability.guided_detail in capability.detail
        ready = httpx.get(proxy.url + "/readyz", timeout=5).json()
        assert ready["ready"]
        assert ready["probed"]
        assert ready["guided_decoding"] == ("enforced" if enforced else "not_enforced")
        assert ready["unenforced_constraints"] == name.split("/")[1]
        assert proxy.metric("proxy_upstream_guided_decoding") == (1.0 if enforced else 0.0)
    # the guided probe is one constrained completion with a few tokens, after the other two
    probe = next(body for body in upstreams.servers["stock"][1].bodies if "response_format" in body)
    assert probe["response_format"]["format"]["type"] == "const_string"
    assert probe["max_tokens"] <= 16
    assert probe["detokenize"] is False


def test_an_upstream_that_refuses_the_field_enforces_nothing(
    encoding: HarmonyEncoding, upstreams: Upstreams
) -> None:
    server, gate = upstreams.servers["xgrammar"]
    gate.refuse = True
    try:

        async def probe() -> Capability:
            upstream = Upstream(server.url, connect_timeout=5.0)
            try:
                return await upstream.probe(decode=decoder(encoding))
            finally:
                await upstream.aclose()

        capability = asyncio.run(probe())
        assert capability.token_ids  # everything else is served
        assert capability.guided is False
        assert not capability.takes_response_format
        assert "response_format is not supported" in capability.guided_detail
        # in best effort the field is left out of its requests, which then succeed
        proxy = start_proxy(encoding, (server, gate), unenforced_constraints="best_effort")
        try:
            gate.bodies.clear()
            events = streamed(proxy.client(), _body("required"))
            response = assert_well_formed(events)
            assert response["status"] == "completed"  # unguided, the model called anyway
            assert holds("required", response)
            assert gate.bodies
            assert "response_format" not in gate.bodies[-1]
        finally:
            proxy.close()
    finally:
        gate.refuse = False


def test_without_the_decoder_or_with_the_setting_nothing_is_probed(
    encoding: HarmonyEncoding, upstreams: Upstreams
) -> None:
    server, gate = upstreams.servers["xgrammar"]

    async def probe() -> Capability:
        upstream = Upstream(server.url, connect_timeout=5.0)
        try:
            return await upstream.probe()
        finally:
            await upstream.aclose()

    gate.bodies.clear()
    found = asyncio.run(probe())
    assert (found.guided, found.guided_detail) == (None, NOT_PROBED)
    assert not any("response_format" in body for body in gate.bodies)
    on = with_setting(found, "on")
    assert (on.guided, on.takes_response_format) == (True, True)
    assert "guided_decoding = on" in on.detail
    off = with_setting(found, "off")
    assert (off.guided, off.takes_response_format) == (False, False)
    assert with_setting(found, "auto") is found


def test_the_capability_log_line_names_guided_decoding(
    encoding: HarmonyEncoding, upstreams: Upstreams, caplog: pytest.LogCaptureFixture
) -> None:
    logger = logging.getLogger("test.constraints.capability")
    with caplog.at_level(logging.INFO, logger=logger.name):
        proxy = start_proxy(encoding, upstreams.servers["stock"], logger=logger)
        proxy.close()
    [line] = [r for r in caplog.records if r.getMessage() == "upstream capability"]
    assert line.guided_decoding == "not_enforced"  # type: ignore[attr-defined]
    assert "guided_decoding_backend: xgrammar" in line.detail  # type: ignore[attr-defined]


# -- the constraint suite, on both upstreams, under both policies --------------------------------


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_with_a_backend_every_constraint_is_enforced(proxies: dict[str, Proxy], name: str) -> None:
    for policy in ("refuse", "best_effort"):
        proxy = proxies[f"xgrammar/{policy}"]
        response = assert_well_formed(streamed(proxy.client(), _body(name)))
        assert response["status"] == "completed", response.get("error")
        assert holds(name, response), response["output"]
        answer = proxy.client().responses.create(stream=False, **_body(name))
        assert answer.status == "completed"
        assert holds(name, answer.model_dump(mode="json")), answer.output


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_without_a_backend_each_constraint_is_refused(proxies: dict[str, Proxy], name: str) -> None:
    proxy = proxies["stock/refuse"]
    before = proxy.metric("proxy_constraint_refusals_total", constraint=KIND[name])
    generations = len([body for body in proxy.gate.bodies if body.get("stream")])
    for stream in (True, False):
        with pytest.raises(openai.BadRequestError) as caught:
            proxy.client(max_retries=0).responses.create(stream=stream, **_body(name))
        error = caught.value.body
        assert isinstance(error, dict)
        assert caught.value.status_code == 400
        assert error["code"] == "constraint_not_enforced"
        assert error["param"] == ("text.format" if name.startswith("json") else "tool_choice")
        assert "guided_decoding_backend: xgrammar" in error["message"]
        assert "unenforced_constraints = best_effort" in error["message"]
    after = proxy.metric("proxy_constraint_refusals_total", constraint=KIND[name])
    assert after == before + 2
    # refused before generation: nothing reached upstream (the probe's requests are no streams)
    assert len([body for body in proxy.gate.bodies if body.get("stream")]) == generations


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_without_a_backend_best_effort_fails_each_broken_constraint(
    proxies: dict[str, Proxy], name: str
) -> None:
    proxy = proxies["stock/best_effort"]
    labels = {"constraint": KIND[name], "enforced": "false"}
    before = proxy.metric("proxy_constraint_violations_total", **labels)
    events = streamed(proxy.client(), _body(name))
    response = assert_well_formed(events)
    assert response["status"] == "failed"  # the stock model broke it: never "completed"
    [error] = [event for event in events if event["type"] == "error"]
    assert error["code"] == CONSTRAINT_VIOLATED
    assert "does not enforce response_format" in error["message"]
    answer = proxy.client().responses.create(stream=False, **_body(name))
    assert answer.status == "failed"
    assert answer.error is not None
    assert answer.error.code == "server_error"  # OpenAI's closed set; the message says which
    assert answer.error.message.startswith(CONSTRAINT_VIOLATED)
    after = proxy.metric("proxy_constraint_violations_total", **labels)
    assert after == before + 2
    failed = {"route": "responses", "stream": "false", "outcome": "failed", "model": "other"}
    # counted once the answer is out: a moment after the client has it
    assert wait_for(lambda: proxy.metric("proxy_requests_total", **failed) >= 1, 5)


def test_a_forbidden_message_is_never_announced_and_upstream_is_closed(
    encoding: HarmonyEncoding,
) -> None:
    """The check stops at the header: a call under "none" is never announced; a text answer
    under "required" ends the response at its header and closes the upstream request there,
    long before the answer would have ended (a paced simulator: ~0.5 ms per token)."""
    paced = Upstreams(encoding)
    server, gate = paced.start("stock", token_seconds=0.0005)
    proxy = start_proxy(encoding, (server, gate), unenforced_constraints="best_effort")
    try:
        events = streamed(proxy.client(), _body("none"))
        added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
        assert added == ["reasoning"]
        assert assert_well_formed(events)["status"] == "failed"
        long = {"X-Sim-Tokens": "4000"}  # reasoning and the answer ~2,000 tokens each
        events = streamed(proxy.client(), _body("required"), extra_headers=long)
        response = assert_well_formed(events)
        assert response["status"] == "failed"
        assert [item["type"] for item in response["output"]] == ["reasoning"]
        simulator = gate.app.state.simulator
        record = next(r for r in reversed(simulator.requests) if r.path == "/v1/completions")
        assert wait_for(lambda: record.closed, 5)
        assert record.disconnected
        assert not record.completed
        assert record.tokens_sent < 3500  # ~2,000: the reasoning and the answer's header
    finally:
        proxy.close()
        paced.close()


def test_an_upstream_said_to_enforce_is_still_checked(
    encoding: HarmonyEncoding, upstreams: Upstreams
) -> None:
    """`guided_decoding = on` in front of a stock server: requests go through, and the check
    after the fact still fails every broken one (counted as enforced). Rendered in a render
    worker process: the constraint travels with the prepared request."""
    proxy = start_proxy(
        encoding, upstreams.servers["stock"], guided_decoding="on", render_workers=1
    )
    try:
        assert wait_for(proxy.app.state.renderer.ready, 30)
        assert proxy.app.state.proxy.capability.guided is True
        assert httpx.get(proxy.url + "/readyz").json()["guided_decoding"] == "enforced"
        for name in ("none", "json_schema"):
            response = assert_well_formed(streamed(proxy.client(), _body(name)))
            assert response["status"] == "failed"
            labels = {"constraint": KIND[name], "enforced": "true"}
            assert proxy.metric("proxy_constraint_violations_total", **labels) == 1
        worker = proxy.metric("proxy_renders_total", path="worker", outcome="ok")
        assert worker >= 1  # the one with tools, too costly to render on the event loop
    finally:
        proxy.close()


def test_an_upstream_said_not_to_enforce_is_refused_without_a_probe(
    encoding: HarmonyEncoding, upstreams: Upstreams
) -> None:
    server, gate = upstreams.servers["xgrammar"]
    gate.bodies.clear()
    proxy = start_proxy(encoding, (server, gate), guided_decoding="off")
    try:
        assert not any("response_format" in body for body in gate.bodies)  # not probed
        assert httpx.get(proxy.url + "/readyz").json()["guided_decoding"] == "not_enforced"
        with pytest.raises(openai.BadRequestError, match="guided_decoding = off"):
            proxy.client(max_retries=0).responses.create(**_body("none"))
        events = streamed(proxy.client(), {"model": MODEL, "input": "Hi"})  # unconstrained
        assert assert_well_formed(events)["status"] == "completed"
    finally:
        proxy.close()


# -- stored and background responses behave the same ---------------------------------------------


def test_stored_and_background_responses_fail_the_same(proxies: dict[str, Proxy]) -> None:
    proxy = proxies["stock/best_effort"]
    client = proxy.client()
    stored = client.responses.create(stream=False, **_body("json_object"))
    assert client.responses.retrieve(stored.id).status == "failed"
    job = client.responses.create(background=True, **_body("named"))
    assert job.status == "queued"
    deadline = time.monotonic() + 10
    while (found := client.responses.retrieve(job.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert found.status == "failed"
    assert found.error is not None
    assert found.error.message.startswith(CONSTRAINT_VIOLATED)
    replay = [
        event.model_dump(mode="json", exclude_unset=True, by_alias=True)
        for event in client.responses.retrieve(job.id, stream=True)
    ]
    assert assert_well_formed(replay)["status"] == "failed"
    assert [e["code"] for e in replay if e["type"] == "error"] == [CONSTRAINT_VIOLATED]
    # refused before anything is queued or stored
    refusing = proxies["stock/refuse"].client(max_retries=0)
    with pytest.raises(openai.BadRequestError, match="constraint"):
        refusing.responses.create(background=True, **_body("none"))


@pytest.mark.parametrize("guided", [True, False])
def test_the_builtin_simulator_setting_picks_the_upstream(
    encoding: HarmonyEncoding, guided: bool
) -> None:
    """`serve` without an upstream runs the simulator with `simulator_guided_decoding`."""

    async def probe() -> Capability:
        settings = Settings(simulator_guided_decoding=guided, simulator_token_seconds=0.0)
        logger = logging.getLogger("test.constraints.builtin")
        async with simulated_upstream(settings, encoding, logger) as running:
            assert running.upstream_url is not None
            upstream = Upstream(running.upstream_url, connect_timeout=5.0)
            try:
                return await upstream.probe(decode=decoder(encoding))
            finally:
                await upstream.aclose()

    assert asyncio.run(probe()).guided is guided
