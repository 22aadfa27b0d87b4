"""`HistogramBatch` adds to a histogram exactly what `observe` would have (buckets, count, sum),
in batches: after every `BATCH_FRAMES` observations and on `flush()`."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from proxy.metrics.batch import BATCH_FRAMES, HistogramBatch

BUCKETS = (0, 1, 2.5, 20, 256)
VALUES = st.one_of(
    st.sampled_from([0.0, 1.0, 2.5, 20.0, 256.0, -1.0, 1e9, math.inf]),  # on the bounds too
    st.floats(-10, 1000, allow_nan=False),
)


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, Histogram]:
    direct, batched = CollectorRegistry(), CollectorRegistry()
    return (
        direct,
        Histogram("h", "h", buckets=BUCKETS, registry=direct),
        batched,
        Histogram("h", "h", buckets=BUCKETS, registry=batched),
    )


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if not sample.name.endswith("_created"):
                out[f"{sample.name}{sorted(sample.labels.items())}"] = sample.value
    return out


@given(values=st.lists(VALUES, max_size=3 * BATCH_FRAMES))
def test_the_same_histogram_as_observe(values: list[float]) -> None:
    direct, expected, batched, histogram = _pair()
    batch = HistogramBatch(histogram)
    for value in values:
        expected.observe(value)
        batch.observe(value)
    batch.flush()
    got, want = _samples(batched), _samples(direct)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-9) or got[key] == value, key


def test_counts_reach_the_histogram_every_batch_and_at_the_end() -> None:
    _, _, batched, histogram = _pair()
    batch = HistogramBatch(histogram)
    for _ in range(BATCH_FRAMES - 1):
        batch.observe(2)
    assert _samples(batched)["h_count[]"] == 0  # not yet
    batch.observe(2)
    assert _samples(batched)["h_count[]"] == BATCH_FRAMES
    batch.observe(300)
    batch.flush()
    batch.flush()  # nothing twice
    samples = _samples(batched)
    assert samples["h_count[]"] == BATCH_FRAMES + 1
    assert samples["h_bucket[('le', '256.0')]"] == BATCH_FRAMES
    assert samples["h_sum[]"] == 2 * BATCH_FRAMES + 300
    assert b"h_bucket" in generate_latest(batched)
