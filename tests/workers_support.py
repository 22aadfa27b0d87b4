"""Shared by the worker-process tests: a `serve --workers N` process with its JSON
log, which worker served a request (every worker's log line says `worker`), its `/metrics`
parsed, and HTTP clients pinned to one worker.

Pinning: the kernel hands each new connection to one worker's listener (SO_REUSEPORT) and it
stays there, so a client with one keep-alive connection talks to one worker. `pinned` opens
connections until one reaches the wanted worker (a cheap probe whose log line names it), and
then checks on every answer that the connection is still the same one.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.reliability import ProxyProcess, start_proxy_process

_probes = itertools.count()


@dataclasses.dataclass
class Workers:
    """A `serve --workers N` process."""

    process: ProxyProcess
    count: int
    #: The supervisor's `metrics_port`, when one was given.
    metrics_url: str = ""

    @property
    def url(self) -> str:
        return self.process.url

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.process.log_text().splitlines():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                out.append({"msg": line, "level": "raw"})
        return out

    def ready(self) -> dict[int, int]:
        """Worker number → pid of its latest process that said ready and has found upstream
        capable: until its first probe is back, a worker's repaired requests wait for it
        (tests/test_first_probe.py), which would skew timings. Each process logs "worker ready"
        once and its first probe's "upstream capability" once, in either order; so a worker is
        ready when it logged the second as often as the first."""
        pids: dict[int, int] = {}
        started: dict[int, int] = {}
        probed: dict[int, int] = {}
        for record in self.records():
            worker = record.get("worker")
            if record["msg"] == "worker ready":
                pids[worker] = record["pid"]
                started[worker] = started.get(worker, 0) + 1
            elif record["msg"] == "upstream capability" and record.get("capable"):
                probed[worker] = probed.get(worker, 0) + 1
        return {w: pid for w, pid in pids.items() if probed.get(w, 0) >= started[w]}

    def worker_of(self, request_id: str, timeout: float = 5.0) -> int:
        """The worker whose log has the request line of `request_id`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.records():
                if record.get("request_id") == request_id and record["msg"] == "request":
                    return int(record["worker"])
            time.sleep(0.02)
        raise AssertionError(f"no log line for request {request_id}")

    def served_by(self) -> dict[str, int]:
        """Request id → worker, for every request line logged so far."""
        return {r["request_id"]: r["worker"] for r in self.records() if r.get("msg") == "request"}

    def metrics(self, url: str | None = None) -> dict[tuple[str, frozenset[Any]], float]:
        text = httpx.get((url or self.url) + "/metrics", timeout=5).text
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def metric(self, name: str, url: str | None = None, **labels: str) -> float:
        """One sample of a fresh scrape (summed over label sets not named in `labels`)."""
        wanted = set(labels.items())
        return sum(
            value
            for (sample, sample_labels), value in self.metrics(url).items()
            if sample == name and wanted <= sample_labels
        )


def start_workers(upstream_url: str, log: Path, *flags: str, count: int = 2) -> Workers:
    """`serve --workers count` against `upstream_url`, every worker accepting."""
    process = start_proxy_process(upstream_url, log, "--workers", str(count), *flags)
    workers = Workers(process, count)
    deadline = time.monotonic() + 30
    while len(workers.ready()) < count:
        if time.monotonic() > deadline or process.popen.poll() is not None:
            process.stop()
            raise AssertionError(f"workers did not start: {process.log_text()[-3000:]}")
        time.sleep(0.05)
    return workers


def local_port(answer: httpx.Response) -> int:
    stream = answer.extensions["network_stream"]
    port: int = stream.get_extra_info("client_addr")[1]
    return port


def pinned(workers: Workers, index: int, timeout: float = 30.0) -> httpx.Client:
    """An httpx client whose one connection is served by worker `index` (module doc); an
    answer on any other connection fails the test."""
    for _ in range(64):
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=300)
        client = httpx.Client(base_url=workers.url, limits=limits, timeout=timeout)
        request_id = f"pin-{index}-{next(_probes)}"
        answer = client.get("/v1/responses/resp_pinprobe", headers={"x-request-id": request_id})
        port = local_port(answer)
        if workers.worker_of(request_id) != index:
            client.close()
            continue

        def same_connection(answer: httpx.Response, port: int = port) -> None:
            assert local_port(answer) == port, "the pinned connection was replaced"

        client.event_hooks["response"] = [same_connection]
        return client
    raise AssertionError(f"no connection reached worker {index}")
