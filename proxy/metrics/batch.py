"""Histogram observations added in batches: the per-frame histograms of the repaired route,
which would otherwise cost two locked observations per upstream frame."""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

from prometheus_client import Histogram

#: Observations a `HistogramBatch` holds before adding them (a few seconds of one stream).
BATCH_FRAMES: Final = 64


class HistogramBatch:
    """One stream's observations of a histogram, added to it in batches (`flush`).

    prometheus_client's `observe` takes a lock per bucket and sum it touches, ~2 µs, and the
    proxy observes two histograms per upstream frame. Here an observation is a bisection and two
    additions; every `BATCH_FRAMES` observations, and when the stream ends, the counts go to the
    histogram at once. That uses
    the histogram's bucket values (`_upper_bounds`, `_buckets`, `_sum`, prometheus_client
    0.26, multiprocess values included); `tests/test_metrics_batch.py` holds it to `observe`.
    """

    __slots__ = ("_bounds", "_counts", "_histogram", "_pending", "_sum")

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        self._bounds: list[float] = histogram._upper_bounds  # ends in +Inf
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = 0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1  # the first bound >= value
        self._sum += value
        self._pending += 1
        if self._pending >= BATCH_FRAMES:
            self.flush()

    def flush(self) -> None:
        """Add what was observed since the last flush to the histogram."""
        if not self._pending:
            return
        buckets = self._histogram._buckets
        counts = self._counts
        for index, count in enumerate(counts):
            if count:
                buckets[index].inc(count)
                counts[index] = 0
        self._histogram._sum.inc(self._sum)
        self._sum = 0.0
        self._pending = 0
