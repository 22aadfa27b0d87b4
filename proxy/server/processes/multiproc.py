"""One `/metrics` for every worker process: prometheus_client's multiprocess mode.

Each process (the supervisor and every worker) writes its values to memory-mapped files of its
own in one directory, `PROMETHEUS_MULTIPROC_DIR`; a scrape, answered by any worker or by the
supervisor's `metrics_port`, reads them all (`SharedRegistry`). Counters and histograms of a
worker that died stay in their files, so sums never go backwards; its `live*` gauges are
removed (`mark_dead`), so in-flight streams of a dead worker do not stay counted. How each
gauge combines: proxy/metrics/ (its package doc).

prometheus_client picks the mode once, when it is first imported, from the environment: the
supervisor calls `prepare` before anything imports it (cli.py), and the workers inherit the
variable. This module therefore imports prometheus_client only inside its functions. With one
worker none of this runs: no files, no cost.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare(env: MutableMapping[str, str]) -> tuple[Path, bool]:
    """The metrics directory, empty, named in `env` for this process and its children: the
    one `PROMETHEUS_MULTIPROC_DIR` names (its `*.db` files removed: left over from an earlier
    run, they would add its counts to ours), else a new temporary one. Returns it and whether
    it was made here (`remove` it at the end)."""
    given = env.get(ENV)
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.db"):
            stale.unlink()
        return folder, False
    folder = Path(tempfile.mkdtemp(prefix="proxy-metrics-"))
    env[ENV] = str(folder)
    return folder, True


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def check_active() -> None:
    """Raise unless prometheus_client writes to the multiprocess files (it was imported before
    `prepare`: every value would stay in this process, and `/metrics` would miss it)."""
    from prometheus_client import values

    if not getattr(values.ValueClass, "_multiprocess", False):
        raise RuntimeError(
            f"prometheus_client was imported before {ENV} was set: worker metrics would not "
            "be shared (multiproc.prepare must run first)"
        )


def shared_registry(folder: Path) -> CollectorRegistry:
    """A registry for the proxy's metrics whose collection is every process's files: metrics
    register on it as usual (names are still checked), and `generate_latest` of it — what
    `/metrics` serves — reads the sums, not this process's own values."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    class SharedRegistry(CollectorRegistry):
        def __init__(self) -> None:
            super().__init__()
            # prometheus_client's multiprocess module has no type hints.
            self._files = MultiProcessCollector(None, path=str(folder))  # type: ignore[no-untyped-call]

        def collect(self) -> Iterable[Metric]:
            metrics: Iterable[Metric] = self._files.collect()  # type: ignore[no-untyped-call]
            yield from metrics

    return SharedRegistry()


def mark_dead(pid: int, folder: Path) -> None:
    """A worker exited: drop its `live*` gauges (what it held is no longer held)."""
    from prometheus_client.multiprocess import mark_process_dead

    mark_process_dead(pid, str(folder))  # type: ignore[no-untyped-call]
