"""Worker processes on real `serve --workers 2` processes: both workers
serve the port, `/metrics` (main port and `metrics_port`) sums every worker, SIGTERM drains
every worker with a terminal event on every stream, a killed worker is replaced and counted
(and what it held leaves the gauges), the built-in simulator runs once, and settings that
cannot work with workers are refused."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from proxy.simulator import SimulatorConfig
from tests.live import free_port
from tests.reliability import (
    body,
    completion,
    expected_texts,
    log_problems,
    raise_fd_limit,
    scaled,
    sse_events,
    start_proxy_process,
    texts,
    wait_until,
)
from tests.simulator_helpers import SimThread
from tests.stateful_support import LONG, MODEL, TOOLS, dumped, first_events, until
from tests.wellformed import assert_well_formed
from tests.workers_support import Workers, pinned, start_workers

#: 5 ms per token: a 40-token answer ends within the drain, a 3,000-token one does not.
SIM = SimulatorConfig(first_token_seconds=0.02, token_seconds=0.005, record_limit=5000)
DRAIN = 2.0
GRACE = 2.0  # exit within drain_timeout + 2 s, as one process (runner.EXIT_MARGIN)


@pytest.fixture
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    raise_fd_limit()
    with SimThread(encoding, SIM) as running:
        yield running


@pytest.fixture
def workers(sim: SimThread, tmp_path: Path) -> Iterator[Workers]:
    assert sim.server is not None
    metrics_port = free_port()
    running = start_workers(
        sim.server.url,
        tmp_path / "proxy.log",
        *("--drain-timeout", str(DRAIN), "--data-dir", str(tmp_path / "data")),
        *("--metrics-port", str(metrics_port)),
    )
    running.metrics_url = f"http://127.0.0.1:{metrics_port}"
    try:
        yield running
    finally:
        running.process.stop()


async def _streams(
    url: str, count: int, tokens: Any = lambda n: "40", prefix: str = "r"
) -> list[tuple[str, bytes]]:
    """`count` streamed requests at once, each on its own connection (so both workers get
    some): (request id, body, as far as it came)."""
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def one(number: int) -> tuple[str, bytes]:
            request_id = f"{prefix}-{number}"
            chunks: list[bytes] = []
            try:
                async with http.stream(
                    "POST",
                    url + "/v1/responses",
                    json=body(f"Question {number}"),
                    headers={"X-Sim-Tokens": tokens(number), "X-Request-Id": request_id},
                ) as answer:
                    async for chunk in answer.aiter_bytes():
                        chunks.append(chunk)
            except httpx.RemoteProtocolError:  # cut: its worker was killed
                pass
            return request_id, b"".join(chunks)

        return list(await asyncio.gather(*(one(n) for n in range(count))))


def _all_correct(
    workers: Workers,
    encoding: HarmonyEncoding,
    results: list[tuple[str, bytes]],
    min_tokens: int,
) -> tuple[int, list[int]]:
    """Every stream completed with exactly the simulator's answer to its question: the tokens
    they carried, and how many each worker served."""
    tokens = 0
    for number, (_, raw) in enumerate(results):
        events = sse_events(raw)
        response = assert_well_formed(events)
        assert response["status"] == "completed"
        expected = completion(encoding, body(f"Question {number}"), min_tokens=min_tokens)
        assert texts(events) == expected_texts(expected)
        tokens += response["usage"]["output_tokens"]
    served = workers.served_by()
    return tokens, [sum(1 for rid, _ in results if served[rid] == w) for w in (0, 1)]


def test_workers_share_the_port_and_metrics_sum_over_them(
    workers: Workers, encoding: HarmonyEncoding
) -> None:
    streams = 40
    results = asyncio.run(_streams(workers.url, streams))
    tokens, per_worker = _all_correct(workers, encoding, results, 40)
    assert min(per_worker) > 0, per_worker  # the kernel spread the connections
    # `proxy_ready` is what each worker's /readyz last answered (a worker asked while its
    # render worker booted said 503): ask until both have said 200 since.
    assert wait_until(
        lambda: (
            httpx.get(workers.url + "/readyz").status_code == 200
            and workers.metric("proxy_ready") == 1
        ),
        10,
    )
    # Whichever worker answers a scrape (new connections: both do), and the supervisor's
    # metrics port, count every worker's requests and tokens.
    for url in [workers.url] * 6 + [workers.metrics_url]:
        completed = workers.metric("proxy_requests_total", url, outcome="completed", stream="true")
        assert completed == streams
        assert workers.metric("proxy_tokens_total", url) == tokens
        assert workers.metric("proxy_upstream_frame_tokens_count", url) > 0
        assert workers.metric("proxy_worker_processes", url) == 2
        assert workers.metric("proxy_worker_restarts_total", url) == 0
        assert workers.metric("proxy_streams_in_flight", url) == 0
        assert workers.metric("proxy_ready", url) == 1
        assert workers.metric("proxy_draining", url) == 0
        assert workers.metric("proxy_build_info", url) == 1
    print(f"\n{streams} streams over 2 workers: {per_worker}")


def test_sigterm_drains_every_worker(workers: Workers) -> None:
    streams = 40

    async def run() -> tuple[list[tuple[str, bytes]], float, list[int], float]:
        task = asyncio.ensure_future(
            _streams(workers.url, streams, lambda n: "40" if n % 2 else "3000")
        )
        async with asyncio.timeout(30):  # every stream has begun
            while workers.metric("proxy_streams_in_flight") < streams:
                await asyncio.sleep(0.05)
        workers.process.popen.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        await asyncio.sleep(0.3)
        probes = []  # new connections during the drain: every worker answers 503
        async with httpx.AsyncClient(
            timeout=5, limits=httpx.Limits(max_keepalive_connections=0)
        ) as http:
            for _ in range(8):
                probes.append((await http.get(workers.url + "/healthz")).status_code)
        results = await task
        return results, signalled, probes, time.monotonic()

    results, signalled, probes, ended = asyncio.run(run())
    workers.process.popen.wait(timeout=DRAIN + GRACE + 10)
    took = time.monotonic() - signalled
    assert probes == [503] * 8
    outcomes = {"completed": 0, "failed": 0}
    for number, (_, raw) in enumerate(results):
        events = sse_events(raw)
        response = assert_well_formed(events)  # exactly one terminal event, on every stream
        outcomes[response["status"]] += 1
        if response["status"] == "failed":
            assert events[-2]["code"] == "server_shutting_down", events[-2]
            assert number % 2 == 0, "a short answer was cut by the drain"
    assert outcomes == {"completed": streams // 2, "failed": streams // 2}
    served = workers.served_by()
    assert {served[rid] for rid, _ in results} == {0, 1}  # both workers drained streams
    assert ended - signalled < DRAIN + 1.0
    print(f"\nSIGTERM, 2 workers, {streams} streams: {outcomes}, gone after {took:.2f} s")
    assert took < DRAIN + GRACE, f"exit took {took:.2f} s"
    assert workers.process.popen.returncode == 0
    assert log_problems(workers.process.log_text()) == []


def test_a_killed_worker_is_replaced_and_counted(workers: Workers) -> None:
    before = workers.ready()
    streams = 20

    async def run() -> list[tuple[str, bytes]]:
        task = asyncio.ensure_future(_streams(workers.url, streams, lambda n: "400"))
        async with asyncio.timeout(30):
            while workers.metric("proxy_streams_in_flight") < streams:
                await asyncio.sleep(0.05)
        os.kill(before[0], signal.SIGKILL)
        return await task

    results = asyncio.run(run())
    deadline = time.monotonic() + 30
    while workers.ready().get(0) in (None, before[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    after = workers.ready()
    assert after[0] != before[0]
    assert after[1] == before[1]
    # The dead worker's streams were cut (no terminal event: its process is gone); the other
    # worker's completed. Nothing it held stays counted as in flight.
    cut = [rid for rid, raw in results if b"response.completed" not in raw]
    completed = streams - len(cut)
    assert cut, completed
    assert completed, cut
    assert workers.metric("proxy_worker_restarts_total") == 1
    assert workers.metric("proxy_worker_processes") == 2
    assert workers.metric("proxy_streams_in_flight") == 0
    assert workers.metric("proxy_requests_total", outcome="completed", stream="true") == completed
    # The replacement serves, and the dead worker's render worker did not outlive it.
    fresh = asyncio.run(_streams(workers.url, 10, prefix="after"))
    for _, raw in fresh:
        assert assert_well_formed(sse_events(raw))["status"] == "completed"
    died = [r for r in workers.records() if r["msg"] == "worker died: replacing it"]
    assert [(r["worker"], r["pid"], r["exit_code"]) for r in died] == [
        (0, before[0], -signal.SIGKILL)
    ]
    assert [r["msg"] for r in workers.records() if r["level"] == "error"] == [died[0]["msg"]]
    print(f"\nworker 0 killed with {streams} streams open: {len(cut)} cut, {completed} completed")


def test_the_builtin_simulator_runs_once(tmp_path: Path) -> None:
    """…and the metrics directory the supervisor made is there while it runs, gone after."""
    log = tmp_path / "proxy.log"
    temp = tmp_path / "tmp"
    temp.mkdir()
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "proxy", "serve", "--workers", "2", "--host"),
                *("127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path / "data")),
                *("--simulator-token-seconds", "0.001"),
            ],
            env={k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}
            | {"TMPDIR": str(temp)},
            stdout=sink,
            stderr=sink,
        )
    from tests.reliability import ProxyProcess

    workers = Workers(ProxyProcess(process, f"http://127.0.0.1:{port}", log), 2)
    try:
        deadline = time.monotonic() + 30
        while len(workers.ready()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        results = asyncio.run(_streams(workers.url, 16))
        for _, raw in results:
            assert assert_well_formed(sse_events(raw))["status"] == "completed"
        records = workers.records()
        started = [r for r in records if r["msg"].startswith("no upstream configured")]
        assert len(started) == 1
        assert "worker" not in started[0]  # the supervisor's
        upstreams = {r["upstream"] for r in records if r["msg"] == "serving"}
        assert upstreams == {started[0]["simulator"]}
        assert len([r for r in records if r["msg"] == "serving"]) == 2
        assert len([r for r in records if r["msg"] == "reasoning key generated"]) == 1
        [metrics_dir] = temp.glob("proxy-metrics-*")
        assert {p.name.split("_")[0] for p in metrics_dir.glob("*.db")} >= {"counter", "gauge"}
    finally:
        workers.process.stop()
    assert process.returncode == 0
    assert list(temp.iterdir()) == []  # multiproc.remove at the end
    assert log_problems(log.read_text()) == []


@pytest.mark.parametrize("flags", [("--workers", "1"), ("--workers", "auto")], ids=["1", "auto"])
def test_one_worker_is_the_single_process(
    sim: SimThread, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """`workers = 1` (also `auto` on one CPU: the affinity mask says so) is today's single
    process: no supervisor, no multiprocess files, no `pid` series."""
    assert sim.server is not None
    temp = tmp_path / "tmp"
    temp.mkdir()
    process = start_proxy_process(
        sim.server.url,
        tmp_path / "proxy.log",
        *flags,
        *("--data-dir", str(tmp_path / "data")),
        env={"TMPDIR": str(temp)},
        cpus="0",
    )
    try:
        results = asyncio.run(_streams(process.url, 4))
        for _, raw in results:
            assert assert_well_formed(sse_events(raw))["status"] == "completed"
        records = Workers(process, 1).records()
        serving = [r for r in records if r["msg"] == "serving"]
        assert [r["pid"] for r in serving] == [process.pid]  # the serve process itself
        assert "worker" not in serving[0]
        assert not [r for r in records if r["msg"] == "starting workers"]
        scraped = httpx.get(process.url + "/metrics").text
        assert "proxy_worker_processes 1.0" in scraped
        assert 'pid="' not in scraped
        assert list(temp.iterdir()) == []
    finally:
        process.stop()
    assert process.popen.returncode == 0


def test_a_worker_that_cannot_start_stops_the_proxy(sim: SimThread, tmp_path: Path) -> None:
    assert sim.server is not None
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("the store cannot live here")
    started = time.monotonic()
    result = subprocess.run(
        [
            *(sys.executable, "-m", "proxy", "serve", "--workers", "2", "--upstream"),
            *(sim.server.url, "--host", "127.0.0.1", "--port", "0", "--data-dir", str(blocker)),
        ],
        env={k: v for k, v in os.environ.items() if not k.startswith("PROXY_")},
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert time.monotonic() - started < 30
    assert result.stderr.count(b'"worker failed to start: stopping the proxy"') >= 1
    assert b"worker died" not in result.stderr  # no restart loop


def test_workers_refuse_the_memory_store() -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "proxy", "serve", "--workers", "2"),
            *("--store-url", "memory://", "--upstream", "http://127.0.0.1:9"),
        ],
        env={k: v for k, v in os.environ.items() if not k.startswith("PROXY_")},
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert b"bad setting: store_url='memory://' with workers=2" in result.stderr


@pytest.mark.slow
def test_a_thousand_streams_across_two_workers(workers: Workers, encoding: HarmonyEncoding) -> None:
    """1,000 streams across two workers (200 in the suite's short scale): all complete and
    correct, and the metrics add up."""
    streams = scaled(200, 1000)
    results = asyncio.run(_streams(workers.url, streams, lambda n: "100"))
    tokens, per_worker = _all_correct(workers, encoding, results, 100)
    assert sum(per_worker) == streams
    assert min(per_worker) > streams // 4, per_worker
    assert workers.metric("proxy_requests_total", outcome="completed") == streams
    assert workers.metric("proxy_tokens_total") == tokens
    assert workers.metric("proxy_streams_in_flight") == 0
    assert workers.metric("proxy_selfcheck_failures_total") == 0
    print(f"\n{streams} streams over 2 workers {per_worker}: {tokens} tokens, all correct")


def test_the_embedded_store_is_shared_by_the_workers(workers: Workers) -> None:
    """A response created through one worker is continued, retrieved, resumed live and
    cancelled through the other (the embedded store: SQLite in WAL mode in data_dir)."""
    clients: list[Any] = []

    def sdk(index: int) -> OpenAI:
        http = pinned(workers, index)
        made = OpenAI(
            base_url=workers.url + "/v1",
            api_key="key-workers",
            http_client=http,
            _strict_response_validation=True,
        )
        clients.append(made)
        return made

    try:
        a, b = sdk(0), sdk(1)
        created = a.responses.create(model=MODEL, input="Weather in Paris?", tools=TOOLS)
        call = next(item for item in created.output if item.type == "function_call")
        answer = b.responses.create(
            model=MODEL,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sun."}],
            tools=TOOLS,
            previous_response_id=created.id,
        )
        assert answer.status == "completed"
        assert b.responses.retrieve(created.id).model_dump() == created.model_dump()
        # resume live on the other worker: a background stream dropped on worker 0
        stream = a.responses.create(
            model=MODEL,
            input="A long story",
            background=True,
            stream=True,
            extra_headers={"X-Sim-Tokens": "600"},  # ~3 s
        )
        seen = first_events(stream, 5)  # worker 0's connection is gone with the stream
        key = seen[0]["response"]["id"]
        assert b.responses.retrieve(key).status == "in_progress"
        rest = dumped(b.responses.retrieve(key, stream=True, starting_after=4))
        events = seen + rest
        assert assert_well_formed(events)["status"] == "completed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        # cancel on the other worker: the one running it hears it and stops upstream
        a = sdk(0)
        queued = a.responses.create(
            model=MODEL, input="Cancel me", background=True, extra_headers=LONG
        )
        until(lambda: b.responses.retrieve(queued.id).output)
        cancelled = b.responses.cancel(queued.id)
        assert cancelled.status == "cancelled"
        assert a.responses.retrieve(queued.id).status == "cancelled"
        assert cancelled.usage is not None
        assert cancelled.usage.output_tokens < 4000
    finally:
        for made in clients:
            made.close()
    assert log_problems(workers.process.log_text()) == []


def test_acknowledged_stored_responses_outlive_a_killed_worker(workers: Workers) -> None:
    """A stored response whose terminal event reached its client is in the store with every
    event it streamed, though its worker is SIGKILLed right after: the terminal batch is
    committed before the client sees it (the writer defers only writes not yet acknowledged)."""
    before = workers.ready()

    async def run() -> list[tuple[str, bytes]]:
        # half short (they end before the kill), half long (cut by it)
        task = asyncio.ensure_future(
            _streams(workers.url, 20, lambda n: "60" if n % 2 else "2000", prefix="ack")
        )
        async with asyncio.timeout(30):
            while workers.metric("proxy_requests_total", outcome="completed", stream="true") < 10:
                await asyncio.sleep(0.02)
        os.kill(before[0], signal.SIGKILL)
        return await task

    results = asyncio.run(run())
    acknowledged = [sse_events(raw) for _, raw in results if b"response.completed" in raw]
    assert len(acknowledged) >= 10, len(acknowledged)
    deadline = time.monotonic() + 30
    while workers.ready().get(0) in (None, before[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    with httpx.Client(base_url=workers.url, timeout=30) as http:
        for events in acknowledged:
            key = events[0]["response"]["id"]
            stored = http.get(f"/v1/responses/{key}")
            assert stored.status_code == 200, stored.text
            assert stored.json() == events[-1]["response"]
            replay = http.get(f"/v1/responses/{key}", params={"stream": "true"})
            assert sse_events(replay.content) == events
