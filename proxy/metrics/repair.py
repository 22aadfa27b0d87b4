"""What the repair did, from the core's `RepairRecord` of each finished response: tokens by
channel, malformed output handled, and what the unpatched upstream would have lost (events,
text, items), against the model of its emitter."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from proxy.harmony.stream.events import ITEM_EVENT_TYPES
from proxy.harmony.stream.items import CHANNELS
from proxy.harmony.stream.record import MALFORMED_KINDS, RepairRecord
from proxy.metrics.families import counter, histogram

_TOKENS_PER_FRAME = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128, 256)


class RepairMetrics:
    """The `proxy_…` families of the repair; `observe` counts one response's record."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.tokens = counter(
            r, "proxy_tokens", "Generated tokens by channel", ["channel"], zeros=CHANNELS
        )
        self.tokens_per_frame = histogram(
            r,
            "proxy_upstream_frame_tokens",
            "Tokens per upstream frame (stream_interval and speculative decoding at work)",
            _TOKENS_PER_FRAME,
        )
        self.recovered_events = counter(
            r,
            "proxy_recovered_events",
            "Events the unpatched stream would not have carried (one delta per token)",
            ["type"],
            zeros=ITEM_EVENT_TYPES,
        )
        self.recovered_chars = counter(
            r,
            "proxy_recovered_chars",
            "Text characters the unpatched stream would have lost",
            ["channel"],
            zeros=CHANNELS,
        )
        self.recovered_tokens = counter(
            r,
            "proxy_recovered_tokens",
            "Content tokens the unpatched stream would have lost",
            ["channel"],
            zeros=CHANNELS,
        )
        self.unpatched_text_differs = counter(
            r,
            "proxy_unpatched_text_differs",
            "Streams whose unpatched text would have differed from the final snapshot",
        )
        self.items_unannounced = counter(
            r, "proxy_items_unannounced", "Items the unpatched stream would never have announced"
        )
        self.items_unclosed = counter(
            r, "proxy_items_unclosed", "Items the unpatched stream would never have closed"
        )
        self.repaired_streams = counter(
            r, "proxy_repaired_streams", "Streams where the repair changed what the client saw"
        )
        self.compared_streams = counter(
            r,
            "proxy_compared_streams",
            "Streams compared with the model of the unpatched upstream",
        )
        self.selfcheck_failures = counter(
            r,
            "proxy_selfcheck_failures",
            "Streams whose deltas did not concatenate to the terminal snapshot (must stay 0)",
        )
        self.malformed = counter(
            r,
            "proxy_malformed_outputs",
            "Malformed model output handled, by kind",
            ["kind"],
            zeros=MALFORMED_KINDS,
        )

    def observe(self, record: RepairRecord) -> None:
        """Count what the core recorded for one finished response."""
        for channel, count in record.tokens.items():
            self.tokens.labels(channel).inc(count)
        for kind, count in record.malformed.items():
            self.malformed.labels(kind).inc(count)
        if not record.compared:
            return
        self.compared_streams.inc()
        for event_type, count in record.recovered_events.items():
            if count:
                self.recovered_events.labels(event_type).inc(count)
        for channel, count in record.recovered_chars.items():
            self.recovered_chars.labels(channel).inc(count)
        for channel, count in record.recovered_tokens.items():
            self.recovered_tokens.labels(channel).inc(count)
        if record.unpatched_text_differs:
            self.unpatched_text_differs.inc()
        self.items_unannounced.inc(record.items_unannounced)
        self.items_unclosed.inc(record.items_unclosed)
        if record.repaired:
            self.repaired_streams.inc()
