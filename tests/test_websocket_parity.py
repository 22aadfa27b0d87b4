"""A WebSocket turn of `GET /v1/responses` takes the decisions of `POST /v1/responses`, on a
real uvicorn with the HTTP guard, a raw `websockets` client and the scripted upstream double: a
model outside `repair_models`, or an incapable upstream with `passthrough_when_incapable`, is a
clear `error` event (upstream has no WebSocket mode to pass it to); a new worker's turn waits
for the first capability probe; an upstream timeout before its head is counted as over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding
from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send
from websockets.sync.client import ClientConnection, connect

from proxy.config.settings import Settings
from proxy.harmony.response import CountingIds
from proxy.server.app import create_app
from proxy.server.http.guard import http_guard
from tests.live import LiveServer, wait_for
from tests.openapi import spec_errors
from tests.reliability import LogCapture, Proxy
from tests.upstream_double import MODEL, UpstreamDouble

TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


class SlowProbe:
    """The double, its `/v1/models` (the first probe's first call) held `hold` seconds."""

    def __init__(self, app: UpstreamDouble) -> None:
        self.app = app
        self.hold = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/models":
            await asyncio.sleep(self.hold)
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[UpstreamDouble, SlowProbe, str]]:
    double = UpstreamDouble()
    slow = SlowProbe(double)
    with LiveServer(slow) as server:
        yield double, slow, server.url


@contextmanager
def guarded(url: str, encoding: HarmonyEncoding, *, wait: bool = True, **overrides: Any) -> Any:
    """The proxy on uvicorn with the HTTP guard of `serve`; `wait`: until its first probe."""
    settings = dataclasses.replace(Settings(upstream_url=url, store_url="off"), **overrides)
    registry = CollectorRegistry()
    logs = LogCapture()
    logger = logging.getLogger("responses_repair_proxy.wsparity")
    logger.setLevel(logging.INFO)
    app = create_app(settings, encoding, ids=CountingIds(), registry=registry, logger=logger)
    options = http_guard(settings, app.state.metrics, logger).uvicorn_options()
    with LiveServer(app, **options) as server, logs.attached():
        logs.thread = server._thread.ident
        if wait:
            assert wait_for(lambda: app.state.proxy.probed.is_set(), 10)
        yield Proxy(server, registry, logs, app)


def ws(proxy: Proxy) -> ClientConnection:
    return connect(proxy.url.replace("http://", "ws://") + "/v1/responses", open_timeout=5)


def turn(connection: Any, **fields: Any) -> list[dict[str, Any]]:
    body = {"type": "response.create", "model": MODEL, "input": "Say hi.", **fields}
    connection.send(json.dumps(body))
    events = [json.loads(connection.recv(timeout=15))]
    while events[-1]["type"] not in TERMINAL:
        events.append(json.loads(connection.recv(timeout=15)))
    return events


def test_a_model_outside_the_repair_set_is_an_error_event(
    upstream: tuple[UpstreamDouble, SlowProbe, str], encoding: HarmonyEncoding
) -> None:
    double, _, url = upstream
    with guarded(url, encoding, repair_models=("openai/gpt-oss-*",)) as proxy, ws(proxy) as conn:
        before = len(double.completions())
        refused = turn(conn, model="llama-3-70b", stream_id="s1")[-1]
        assert len(double.completions()) == before  # nothing went upstream
        served = turn(conn)[-1]  # the session goes on
    assert refused["type"] == "error"
    assert refused["status"] == 400
    assert refused["stream_id"] == "s1"
    error = refused["error"]
    assert (error["param"], error["code"]) == ("model", "model_not_repaired")
    assert "'llama-3-70b'" in error["message"]
    assert "POST /v1/responses" in error["message"]
    assert spec_errors(refused, "ResponsesServerEvent") == []
    assert served["type"] == "response.completed"
    assert (
        proxy.metric(
            "proxy_requests_total",
            route="responses",
            stream="true",
            outcome="client_error",
            model="other",
        )
        == 1
    )


def test_an_incapable_upstream_with_pass_through_is_an_error_event(
    upstream: tuple[UpstreamDouble, SlowProbe, str], encoding: HarmonyEncoding
) -> None:
    double, _, url = upstream
    double.capable = False
    try:
        with guarded(url, encoding, passthrough_when_incapable=True) as proxy, ws(proxy) as conn:
            refused = turn(conn)[-1]
    finally:
        double.capable = True
    assert refused["type"] == "error"
    assert refused["status"] == 502
    error = refused["error"]
    assert error["code"] == "upstream_not_capable"
    assert "token_ids" in error["message"]
    assert "passthrough_when_incapable" in error["message"]
    assert "POST /v1/responses" in error["message"]


def test_a_turn_before_the_first_probe_waits_for_it(
    upstream: tuple[UpstreamDouble, SlowProbe, str], encoding: HarmonyEncoding
) -> None:
    _, slow, url = upstream
    slow.hold = 1.5
    try:
        started = time.monotonic()
        with guarded(url, encoding, wait=False) as proxy, ws(proxy) as conn:
            assert not proxy.app.state.proxy.probed.is_set()
            events = turn(conn)
            took = time.monotonic() - started
    finally:
        slow.hold = 0.0
    assert events[-1]["type"] == "response.completed", events[-1]  # never upstream_not_capable
    assert took >= 1.3


def test_an_upstream_timeout_before_its_head_is_counted_as_over_http(
    upstream: tuple[UpstreamDouble, SlowProbe, str], encoding: HarmonyEncoding
) -> None:
    double, _, url = upstream
    with guarded(url, encoding, first_token_timeout=0.5) as proxy, ws(proxy) as conn:
        double.queue = [[("sleep", 1.0)]]
        refused = turn(conn)[-1]
        served = turn(conn)[-1]

        def counted() -> bool:
            return (
                proxy.metric("proxy_timeouts_total", kind="first_byte") == 1
                and proxy.metric("proxy_upstream_errors_total", kind="timeout") == 1
            )

        assert wait_for(counted, 5)
        assert wait_for(lambda: proxy.in_flight() == 0, 5)  # counted out after its last event
        outcome = proxy.metric(
            "proxy_requests_total",
            route="responses",
            stream="true",
            outcome="upstream_error",
            model="other",
        )
    assert refused["type"] == "error"
    assert refused["status"] == 504
    assert refused["error"]["code"] == "upstream_timeout"
    assert served["type"] == "response.completed"
    assert outcome == 1
