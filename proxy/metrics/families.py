"""How a metric family is declared: on the registry it is given, with every series of its fixed
label sets exported at zero from the start, so that rates, ratios and alerts have series from
the first scrape instead of "no data" until the first event of each kind (an unlabelled family
exports its 0 by itself)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: How a gauge's values combine over worker processes (package doc).
Mode = Literal["livesum", "livemin", "livemax"]
#: One series' label values; a single string for a one-label family.
Series = str | tuple[str, ...]

#: Buckets, in seconds, of what takes well under a second (the proxy's own steps, store calls).
FAST_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
)  # fmt: skip


def counter(
    registry: CollectorRegistry,
    name: str,
    documentation: str,
    labels: Sequence[str] = (),
    *,
    zeros: Iterable[Series] = (),
) -> Counter:
    """A counter; each of `zeros` is a series exported at 0 from the start."""
    family = Counter(name, documentation, list(labels), registry=registry)
    _zero(family, zeros)
    return family


def gauge(
    registry: CollectorRegistry,
    name: str,
    documentation: str,
    mode: Mode,
    labels: Sequence[str] = (),
) -> Gauge:
    """A gauge whose values combine over worker processes by `mode`."""
    return Gauge(name, documentation, list(labels), registry=registry, multiprocess_mode=mode)


def histogram(
    registry: CollectorRegistry,
    name: str,
    documentation: str,
    buckets: Sequence[float],
    labels: Sequence[str] = (),
    *,
    zeros: Iterable[Series] = (),
) -> Histogram:
    """A histogram over `buckets`; each of `zeros` is a series exported at 0 from the start."""
    family = Histogram(name, documentation, list(labels), buckets=buckets, registry=registry)
    _zero(family, zeros)
    return family


def _zero(family: Counter | Histogram, zeros: Iterable[Series]) -> None:
    for series in zeros:
        family.labels(*((series,) if isinstance(series, str) else series))
