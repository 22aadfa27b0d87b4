"""The response store, measured around any backend (proxy/store/measured.py): what it holds,
what it evicts, how long each call takes and which calls fail."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from proxy.metrics.families import FAST_BUCKETS, counter, gauge, histogram

#: The store's calls (proxy/store/measured.py) and why it drops responses.
STORE_OPS = ("apply", "get", "read_log", "wait_log", "resolve", "signals", "sweep", "stats", "ping")
STORE_EVICTIONS = ("size", "ttl")


class StoreMetrics:
    """The `proxy_store_…` families. Every process reads one shared store: its size is the same
    anywhere (`livemax`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.responses = gauge(
            r,
            "proxy_store_responses",
            "Entries in the response store: responses and conversations",
            "livemax",
        )
        self.bytes = gauge(
            r,
            "proxy_store_bytes",
            "Bytes the response store holds (what store_max_bytes bounds)",
            "livemax",
        )
        self.evictions = counter(
            r,
            "proxy_store_evictions",
            "Stored responses removed: past store_max_bytes (oldest first) or store_ttl",
            ["reason"],
            zeros=STORE_EVICTIONS,
        )
        self.seconds = histogram(
            r,
            "proxy_store_operation_seconds",
            "Time of one response-store call, by operation (a batch of writes is one apply)",
            FAST_BUCKETS,
            ["op"],
        )
        self.errors = counter(
            r,
            "proxy_store_errors",
            "Response-store calls that failed, by operation (a failed apply loses its writes)",
            ["op"],
            zeros=STORE_OPS,
        )
