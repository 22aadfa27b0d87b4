"""The parts of the worker processes that need no process of their own: the CPU count
behind `workers = auto` (affinity and cgroup quotas, on built trees), the setting, the metrics
directory, the worker spec and socket, the log field, and the embedded store's wake-ups across
connections (what a live resume through another worker relies on)."""

from __future__ import annotations

import asyncio
import io
import logging
import socket
import time
from pathlib import Path

import orjson
import pytest

from proxy import logs
from proxy.config.settings import Settings
from proxy.config.sources import ConfigError, load_settings
from proxy.server.processes import multiproc
from proxy.server.processes.cpus import cgroup_quota, resolve_workers, usable_cpus
from proxy.server.processes.worker import WorkerSpec, bind_socket, check_settings, read_spec
from proxy.store.base import Append, Create
from proxy.store.sqlite import SqliteStore

# -- the CPUs of `auto` --------------------------------------------------------------------------


def _tree(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "self-cgroup"
    proc.write_text(self_cgroup)
    return root, proc


def test_cgroup_v2_quota_of_the_container(tmp_path: Path) -> None:
    # a container with its own cgroup namespace: `0::/`, its limit at the mount's top
    root, proc = _tree(tmp_path, "0::/\n", {"cpu.max": "200000 100000\n"})
    assert cgroup_quota(root=root, self_cgroup=proc) == 2.0
    assert usable_cpus(affinity=8, root=root, self_cgroup=proc) == 2
    assert usable_cpus(affinity=1, root=root, self_cgroup=proc) == 1  # taskset is tighter


def test_cgroup_v2_no_quota_fractions_and_ancestors(tmp_path: Path) -> None:
    root, proc = _tree(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert cgroup_quota(root=root, self_cgroup=proc) is None
    assert usable_cpus(affinity=6, root=root, self_cgroup=proc) == 6
    # 1.5 CPUs: one worker (a second would be throttled); 0.5 CPU: still one
    root, proc = _tree(tmp_path / "a", "0::/\n", {"cpu.max": "150000 100000\n"})
    assert usable_cpus(affinity=4, root=root, self_cgroup=proc) == 1
    root, proc = _tree(tmp_path / "b", "0::/\n", {"cpu.max": "50000 100000\n"})
    assert usable_cpus(affinity=4, root=root, self_cgroup=proc) == 1
    # the process deep in a tree: the tightest of its own cgroup and every ancestor's
    root, proc = _tree(
        tmp_path / "c",
        "0::/kubepods/pod1/proxy\n",
        {
            "kubepods/cpu.max": "max 100000\n",
            "kubepods/pod1/cpu.max": "300000 100000\n",
            "kubepods/pod1/proxy/cpu.max": "max 100000\n",
        },
    )
    assert usable_cpus(affinity=16, root=root, self_cgroup=proc) == 3


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    lines = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    root, proc = _tree(
        tmp_path,
        lines,
        {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cgroup_quota(root=root, self_cgroup=proc) == 2.5
    assert usable_cpus(affinity=8, root=root, self_cgroup=proc) == 2
    # -1: no quota; a mount without the process's path: what the container sees is the top
    root, proc = _tree(
        tmp_path / "none",
        "2:cpu:/docker/xyz\n",
        {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
    )
    assert cgroup_quota(root=root, self_cgroup=proc) is None
    root, proc = _tree(
        tmp_path / "top",
        "2:cpu:/docker/xyz\n",
        {"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"},
    )
    assert usable_cpus(affinity=8, root=root, self_cgroup=proc) == 1


def test_no_cgroup_files_means_the_affinity(tmp_path: Path) -> None:
    assert cgroup_quota(root=tmp_path, self_cgroup=tmp_path / "missing") is None
    assert usable_cpus(affinity=3, root=tmp_path, self_cgroup=tmp_path / "missing") == 3
    root, proc = _tree(tmp_path / "bad", "0::/\n", {"cpu.max": "garbage\n"})
    assert cgroup_quota(root=root, self_cgroup=proc) is None
    # this machine: at least one, at most what the affinity mask allows
    import os

    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
    assert resolve_workers(0) == usable_cpus()
    assert resolve_workers(3) == 3


# -- the setting ---------------------------------------------------------------------------------


def test_the_workers_setting() -> None:
    assert Settings().workers == 1
    assert load_settings({"PROXY_WORKERS": "auto"}).workers == 0
    assert load_settings({"PROXY_WORKERS": "AUTO"}).workers == 0
    assert load_settings({"PROXY_WORKERS": "4"}).workers == 4
    with pytest.raises(ConfigError, match=r"PROXY_WORKERS='-2': must be a number of processes"):
        load_settings({"PROXY_WORKERS": "-2"})
    with pytest.raises(ConfigError, match="PROXY_WORKERS='many'"):
        load_settings({"PROXY_WORKERS": "many"})
    check_settings(Settings(store_url="memory://"), 1)  # one process: fine
    check_settings(Settings(), 4)
    with pytest.raises(ConfigError, match="memory store lives in one process"):
        check_settings(Settings(store_url="memory://"), 2)


# -- the metrics directory -----------------------------------------------------------------------


def test_prepare_empties_a_given_directory_or_makes_one(tmp_path: Path) -> None:
    given = tmp_path / "metrics"
    given.mkdir()
    (given / "counter_123.db").write_bytes(b"stale counts of an earlier run")
    (given / "keep.txt").write_text("not ours")
    env = {multiproc.ENV: str(given)}
    folder, made = multiproc.prepare(env)
    assert (folder, made) == (given, False)
    assert sorted(p.name for p in given.iterdir()) == ["keep.txt"]
    env = {}
    folder, made = multiproc.prepare(env)
    try:
        assert made
        assert env[multiproc.ENV] == str(folder)
        assert list(folder.iterdir()) == []
    finally:
        multiproc.remove(folder)
    assert not folder.exists()


def test_check_active_refuses_a_single_process_prometheus_client() -> None:
    # This test process imported prometheus_client without the variable: values stay local.
    with pytest.raises(RuntimeError, match="imported before PROMETHEUS_MULTIPROC_DIR"):
        multiproc.check_active()


# -- what the supervisor hands a worker ----------------------------------------------------------


def test_the_worker_spec_round_trips_through_a_pipe(tmp_path: Path) -> None:
    settings = Settings(upstream_url="http://127.0.0.1:9", reasoning_keys=(("k", b"k" * 32),))
    spec = WorkerSpec(settings, 1, tmp_path)
    assert read_spec(io.BytesIO(spec.encode())) == spec
    with pytest.raises(EOFError):
        read_spec(io.BytesIO(b""))
    with pytest.raises(EOFError):
        read_spec(io.BytesIO(spec.encode()[:-3]))


def test_workers_bind_one_port_together() -> None:
    first = bind_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = bind_socket("127.0.0.1", port)  # SO_REUSEPORT: the second worker's listener
    try:
        second.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # the bound-only socket (the supervisor's reservation) takes no connection
        accepted, _ = second.accept()
        accepted.close()
        with socket.socket() as plain, pytest.raises(OSError, match="in use"):
            plain.bind(("127.0.0.1", port))  # a process without SO_REUSEPORT cannot take it
    finally:
        first.close()
        second.close()


def test_log_lines_carry_the_worker_number() -> None:
    logger = logs.configure("info", "json", worker=3)
    handler = logger.handlers[0]
    stream = io.StringIO()
    handler.setStream(stream)  # type: ignore[attr-defined]
    try:
        logger.info("request", extra={"request_id": "r1"})
        logging.getLogger("uvicorn.error").info("Started")
    finally:
        logs.configure("info", "json")
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["msg"], line["worker"]) for line in lines] == [("request", 3), ("Started", 3)]


# -- the embedded store across connections -------------------------------------------------------


def test_a_waiter_sees_every_commit_of_another_connection(tmp_path: Path) -> None:
    """Two connections to one file, as two workers have: each append of one wakes the other's
    `wait_log` at once, every time (a wake-up race once let the second wait sleep its whole
    timeout, and a live resume through another worker failed after `store_timeout`)."""

    async def run() -> list[float]:
        path = tmp_path / "store.sqlite3"
        writer = await SqliteStore(path).open()
        reader = await SqliteStore(path).open()
        now = time.time()
        await writer.apply([Create("k", "s", b"{}", now, now + 60)])
        waits = []
        try:
            last = -1
            for mark in range(8):

                async def append(mark: int = mark) -> None:
                    await asyncio.sleep(0.05)
                    await writer.apply([Append("k", mark, b"x")])

                task = asyncio.ensure_future(append())
                started = time.monotonic()
                found = await reader.wait_log("k", last, 10)
                waits.append(time.monotonic() - started)
                await task
                assert [m for m, _ in found] == [mark]
                last = mark
        finally:
            await reader.aclose()
            await writer.aclose()
        return waits

    waits = asyncio.run(run())
    assert max(waits) < 2.0, waits  # polled every 20 ms; the bug waited the full 10 s


def test_every_gauge_says_how_workers_combine() -> None:
    """A gauge left at prometheus_client's default (`all`) would export one series per worker
    pid under a `pid` label, which no dashboard or alert expects (proxy/metrics/)."""
    from prometheus_client import CollectorRegistry, Gauge

    from proxy.metrics.serving import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    gauges = [c for c in registry._collector_to_names if isinstance(c, Gauge)]
    assert len(gauges) >= 9
    modes = {gauge._name: gauge._multiprocess_mode for gauge in gauges}
    assert all(mode.startswith("live") for mode in modes.values()), modes


# -- batched histograms across processes ---------------------------------------------------------

#: A process with prometheus_client in multiprocess mode (the variable set before its import, as
#: a worker has it): its share of the values, observed through `HistogramBatch` as the repaired
#: route does, then left in its files when it exits.
_OBSERVER = """
import sys
from prometheus_client import CollectorRegistry
from proxy.metrics.serving import Metrics
from proxy.metrics.batch import HistogramBatch
from proxy.server.processes import multiproc
multiproc.check_active()
metrics = Metrics(CollectorRegistry())
batch = HistogramBatch(metrics.repair.tokens_per_frame)
for value in map(float, sys.argv[1:]):
    batch.observe(value)
batch.flush()
"""

#: What a scrape of the shared directory reads, as JSON: the frame-token histogram's samples.
_SCRAPER = """
import sys
import orjson
from pathlib import Path
from proxy.metrics.serving import Metrics
from proxy.server.processes import multiproc
registry = multiproc.shared_registry(Path(sys.argv[1]))
Metrics(registry)
samples = {
    f"{s.name}{sorted(s.labels.items())}": s.value
    for metric in registry.collect()
    if metric.name == "proxy_upstream_frame_tokens"
    for s in metric.samples
}
sys.stdout.write(orjson.dumps(samples).decode())
"""


def _frame_histogram(values: list[float]) -> dict[str, float]:
    """The samples `observe` gives in one process (what the sum over workers must equal)."""
    from prometheus_client import CollectorRegistry

    from proxy.metrics.serving import Metrics

    metrics = Metrics(registry := CollectorRegistry())
    for value in values:
        metrics.repair.tokens_per_frame.observe(value)
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for metric in registry.collect()
        if metric.name == "proxy_upstream_frame_tokens"
        for s in metric.samples
        if not s.name.endswith("_created")  # not exported in multiprocess mode
    }


def test_batched_histograms_reach_the_files_and_sum_over_workers(tmp_path: Path) -> None:
    """The frame histograms are added in batches (metrics/batch.py, `HistogramBatch`) straight
    to the histogram's values, which in a worker are memory-mapped files; a scrape sums every
    process's files into what one process observing everything would export."""
    import os
    import subprocess
    import sys

    env = {**os.environ, multiproc.ENV: str(tmp_path)}
    shares = [[20.0] * 70 + [1.0, 3.0], [0.0, 7.0, 20.0, 300.0] * 3]  # 70: past one batch
    for share in shares:
        subprocess.run(
            [sys.executable, "-c", _OBSERVER, *map(str, share)], env=env, check=True, timeout=60
        )
    assert len(list(tmp_path.glob("histogram_*.db"))) == len(shares)  # one file per process
    scraped = subprocess.run(
        [sys.executable, "-c", _SCRAPER, str(tmp_path)],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    got = orjson.loads(scraped.stdout)
    want = _frame_histogram([value for share in shares for value in share])
    assert got == want
    assert got["proxy_upstream_frame_tokens_count[]"] == 72 + 12
    assert got["proxy_upstream_frame_tokens_sum[]"] == 20 * 70 + 4 + 3 * 327
