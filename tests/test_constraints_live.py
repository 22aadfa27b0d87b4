"""`tool_choice` and `text.format` on both kinds of upstream, end to end: the strict openai SDK
through a real proxy (uvicorn on loopback) in front of the simulator with a guided-decoding
backend (every constraint enforced) and without one (a stock trtllm-serve: `response_format`
accepted and ignored, and a scripted model that writes what the constraint forbids). Without
enforcement each constrained request is refused (the default) or, in best effort, ends `failed`
with `constraint_violated` — never a `completed` response that breaks its constraint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.harmony.constraint import CONSTRAINT_VIOLATED
from proxy.server.capability import decoder, with_setting
from proxy.server.processes.runner import simulated_upstream
from proxy.upstream.client import Upstream
from proxy.upstream.probe import GUIDED, NOT_PROBED, Capability
from tests.constraints_support import (
    CONSTRAINTS,
    KIND,
    MODEL,
    Proxy,
    Upstreams,
    body_for,
    holds,
    start_proxy,
    streamed,
)
from tests.live import wait_for
from tests.wellformed import assert_well_formed


@pytest.fixture(scope="module")
def upstreams(encoding: HarmonyEncoding) -> Iterator[Upstreams]:
    made = Upstreams(encoding)
    made.start("xgrammar")
    made.start("stock")
    yield made
    made.close()


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
            events = streamed(proxy.client(), body_for("required"))
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
        response = assert_well_formed(streamed(proxy.client(), body_for(name)))
        assert response["status"] == "completed", response.get("error")
        assert holds(name, response), response["output"]
        answer = proxy.client().responses.create(stream=False, **body_for(name))
        assert answer.status == "completed"
        assert holds(name, answer.model_dump(mode="json")), answer.output


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_without_a_backend_each_constraint_is_refused(proxies: dict[str, Proxy], name: str) -> None:
    proxy = proxies["stock/refuse"]
    before = proxy.metric("proxy_constraint_refusals_total", constraint=KIND[name])
    generations = len([body for body in proxy.gate.bodies if body.get("stream")])
    for stream in (True, False):
        with pytest.raises(openai.BadRequestError) as caught:
            proxy.client(max_retries=0).responses.create(stream=stream, **body_for(name))
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
    events = streamed(proxy.client(), body_for(name))
    response = assert_well_formed(events)
    assert response["status"] == "failed"  # the stock model broke it: never "completed"
    [error] = [event for event in events if event["type"] == "error"]
    assert error["code"] == CONSTRAINT_VIOLATED
    assert "does not enforce response_format" in error["message"]
    answer = proxy.client().responses.create(stream=False, **body_for(name))
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
        events = streamed(proxy.client(), body_for("none"))
        added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
        assert added == ["reasoning"]
        assert assert_well_formed(events)["status"] == "failed"
        long = {"X-Sim-Tokens": "4000"}  # reasoning and the answer ~2,000 tokens each
        events = streamed(proxy.client(), body_for("required"), extra_headers=long)
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
            response = assert_well_formed(streamed(proxy.client(), body_for(name)))
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
            proxy.client(max_retries=0).responses.create(**body_for("none"))
        events = streamed(proxy.client(), {"model": MODEL, "input": "Hi"})  # unconstrained
        assert assert_well_formed(events)["status"] == "completed"
    finally:
        proxy.close()


def test_none_without_tools_needs_no_engine(proxies: dict[str, Proxy]) -> None:
    """`tool_choice: "none"` with no function tool asks nothing of the engine (no function is
    in the prompt): served on a stock upstream under `refuse`, still checked after the fact."""
    proxy = proxies["stock/refuse"]
    body = {"model": MODEL, "input": "Hi", "tool_choice": "none"}
    response = assert_well_formed(streamed(proxy.client(), body))
    assert response["status"] == "completed"
    assert not [item for item in response["output"] if item["type"] == "function_call"]
    with pytest.raises(openai.BadRequestError, match=r"constraint_not_enforced|guided"):
        proxy.client(max_retries=0).responses.create(**body_for("none"))


# -- stored and background responses behave the same ---------------------------------------------


def test_stored_and_background_responses_fail_the_same(proxies: dict[str, Proxy]) -> None:
    proxy = proxies["stock/best_effort"]
    client = proxy.client()
    stored = client.responses.create(stream=False, **body_for("json_object"))
    assert client.responses.retrieve(stored.id).status == "failed"
    job = client.responses.create(background=True, **body_for("named"))
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
        refusing.responses.create(background=True, **body_for("none"))


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
