"""What a fault through the proxy changed in its metrics, and the checks every fault test ends
with: the next request served and counted, nothing unhandled in the logs."""

from __future__ import annotations

import httpx

from tests.reliability import Proxy, body, sse_events, wait_until
from tests.wellformed import assert_well_formed

#: The `proxy_upstream_errors_total` kinds a fault test follows (`timeout` for upstream_timeout).
UPSTREAM_CODES = (
    "upstream_disconnected",
    "malformed_frame",
    "missing_token_ids",
    "upstream_error",
    "upstream_incomplete",
    "upstream_timeout",
    "upstream_unreachable",
    "upstream_rejected",
)


def snapshot(proxy: Proxy) -> dict[str, float]:
    names = {
        "failed": ("proxy_requests_total", {"outcome": "failed"}),
        "completed": ("proxy_requests_total", {"outcome": "completed"}),
    }
    out = {
        key: proxy.metric(name, route="responses", stream="true", model="other", **labels)
        for key, (name, labels) in names.items()
    }
    for code in UPSTREAM_CODES:
        kind = "timeout" if code == "upstream_timeout" else code
        out[code] = proxy.metric("proxy_upstream_errors_total", kind=kind)
    for kind in ("idle", "first_token", "first_byte"):
        out["timeout_" + kind] = proxy.metric("proxy_timeouts_total", kind=kind)
    out["client_error"] = proxy.metric(
        "proxy_requests_total",
        route="responses",
        stream="true",
        model="other",
        outcome="client_error",
    )
    out["upstream_error_outcome"] = proxy.metric(
        "proxy_requests_total",
        route="responses",
        stream="true",
        model="other",
        outcome="upstream_error",
    )
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in before if after[key] != before[key]}


def changes(proxy: Proxy, before: dict[str, float], expected: dict[str, float]) -> dict[str, float]:
    """The metric changes since `before`, once they match `expected` or after 5 s: the proxy
    counts a request just after its last byte, so the client can be a little ahead (more than
    a second on a loaded 2-core machine: seen once)."""
    wait_until(lambda: delta(before, snapshot(proxy)) == expected, 5.0)
    return delta(before, snapshot(proxy))


def assert_serves_next(proxy: Proxy, client: httpx.Client) -> None:
    before = snapshot(proxy)
    answer = client.post(proxy.url + "/v1/responses", json=body("And now?"))
    assert answer.status_code == 200
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"
    assert changes(proxy, before, {"completed": 1}) == {"completed": 1}  # and counted


def assert_clean_logs(proxy: Proxy) -> None:
    assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]
