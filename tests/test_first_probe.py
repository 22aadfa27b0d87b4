"""A proxy that has just started — or a worker just started or replaced — never answers from "not
probed yet": requests that arrive before its first capability probe has ended wait for it
(bounded), and /readyz is not ready until it has run. On real servers: the proxy app on uvicorn,
and `serve --workers 2` processes, in front of a simulator whose first probe is held back.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from proxy.server.deps import ServerState
from tests.constraints_support import Upstreams, body_for, start_proxy
from tests.reliability import sse_events
from tests.wellformed import assert_well_formed
from tests.workers_support import Workers, pinned, start_workers


@pytest.fixture
def upstreams(encoding: HarmonyEncoding) -> Iterator[Upstreams]:
    made = Upstreams(encoding)
    made.start("xgrammar")
    yield made
    made.close()


def test_requests_before_the_first_probe_wait_for_it(
    encoding: HarmonyEncoding, upstreams: Upstreams
) -> None:
    server, gate = upstreams.servers["xgrammar"]
    gate.hold = 1.5  # the first probe takes that long
    try:
        started = time.monotonic()
        proxy = start_proxy(encoding, (server, gate), wait=False)
        try:
            ready = httpx.get(proxy.url + "/readyz", timeout=5)
            assert ready.status_code == 503
            assert ready.json()["probed"] is False
            answer = httpx.post(
                proxy.url + "/v1/responses", json=body_for("named", stream=False), timeout=15
            )
            took = time.monotonic() - started
            assert answer.status_code == 200, answer.text  # never 503 upstream_not_capable
            assert answer.json()["status"] == "completed"
            assert took >= 1.4
            assert httpx.get(proxy.url + "/readyz", timeout=5).status_code == 200
        finally:
            proxy.close()
    finally:
        gate.hold = 0.0


def test_the_wait_for_the_first_probe_is_bounded(
    encoding: HarmonyEncoding, upstreams: Upstreams
) -> None:
    server, gate = upstreams.servers["xgrammar"]
    gate.hold = 5.0
    try:
        state = ServerState(first_probe_wait=0.5)
        proxy = start_proxy(encoding, (server, gate), wait=False, state=state)
        try:
            started = time.monotonic()
            answer = httpx.post(proxy.url + "/v1/responses", json=body_for("none"), timeout=15)
            assert 0.4 < time.monotonic() - started < 4
            assert answer.status_code == 503
            assert answer.json()["error"]["code"] == "upstream_not_capable"
            assert answer.headers["retry-after"] == "1"
        finally:
            proxy.close()
    finally:
        gate.hold = 0.0


@pytest.fixture
def workers(upstreams: Upstreams, tmp_path: Path) -> Iterator[Workers]:
    server, _ = upstreams.servers["xgrammar"]
    started = start_workers(server.url, tmp_path / "proxy.log", "--data-dir", str(tmp_path / "d"))
    yield started
    started.process.stop()


def test_a_replaced_worker_waits_for_its_first_probe(
    upstreams: Upstreams, workers: Workers
) -> None:
    """Kill worker 0; while its replacement's first probe is held back, a request it serves
    waits for the probe and is answered, never 503 upstream_not_capable."""
    _, gate = upstreams.servers["xgrammar"]
    before = workers.ready()

    def probes_of_worker_0() -> int:
        return sum(
            1
            for r in workers.records()
            if r["msg"] == "upstream capability" and r.get("worker") == 0
        )

    probed_before = probes_of_worker_0()
    gate.hold = 6.0  # the replacement's first probe; pinning a client takes well under that
    try:
        os.kill(before[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        replaced: int | None = None
        while replaced is None:
            assert time.monotonic() < deadline, workers.process.log_text()[-2000:]
            for record in workers.records():
                new = record.get("pid") != before[0]
                if record["msg"] == "worker ready" and record.get("worker") == 0 and new:
                    replaced = record["pid"]
            time.sleep(0.02)
        client = pinned(workers, 0)  # the pinning requests need no probe
        try:
            assert probes_of_worker_0() == probed_before  # its probe is still held back
            ready = client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["probed"] is False
            started = time.monotonic()
            answer = client.post(
                "/v1/responses",
                json={**body_for("named"), "stream": True},
                headers={"x-request-id": "after-replacement"},
            )
            assert answer.status_code == 200, answer.text
            assert assert_well_formed(sse_events(answer.content))["status"] == "completed"
            assert workers.worker_of("after-replacement") == 0
            assert time.monotonic() - started < 9  # the wait ended with the probe
            assert probes_of_worker_0() == probed_before + 1
            assert client.get("/readyz").status_code == 200
        finally:
            client.close()
    finally:
        gate.hold = 0.0
