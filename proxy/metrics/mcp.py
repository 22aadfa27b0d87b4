"""Hosted MCP tools (proxy/server/hosted/), counted on the same injected registry as `Metrics`
(serving.py): calls and their latency, and tool listings, per server label.

The one label here a client chooses is `server_label` (it names the MCP server in the request):
it is capped at `MAX_LABELS` distinct values per process, the rest counted as `other`, so a
client cannot grow the series without bound."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from proxy.metrics.families import counter, histogram

#: Distinct `server_label` values a process counts under their own name.
MAX_LABELS = 64
#: The label of every server past `MAX_LABELS`.
OTHER = "other"
#: The outcome of a call the budget left unrun.
NOT_RUN = "not_run"
#: Seconds of one call: a local tool's milliseconds up to the longest `mcp_call_timeout`.
_CALL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class McpMetrics:
    """`proxy_mcp_calls_total{server_label,outcome}` (`not_run`: left unrun by the budget),
    `proxy_mcp_call_seconds{server_label}`,
    `proxy_mcp_list_tools_total{server_label,outcome}` (outcome `cached` for a reused list)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = counter(
            registry,
            "proxy_mcp_calls",
            "MCP tool calls the model made, by server label and outcome (ok, error, not_run)",
            ["server_label", "outcome"],
        )
        self.latency = histogram(
            registry,
            "proxy_mcp_call_seconds",
            "Seconds of one MCP tool call, connect included",
            _CALL_BUCKETS,
            ["server_label"],
        )
        self.lists = counter(
            registry,
            "proxy_mcp_list_tools",
            "MCP tool listings, by server label and outcome (ok, error, cached)",
            ["server_label", "outcome"],
        )
        self._labels: set[str] = set()

    def label(self, server_label: str) -> str:
        """The label `server_label` is counted under (module doc)."""
        if server_label in self._labels:
            return server_label
        if len(self._labels) >= MAX_LABELS:
            return OTHER
        self._labels.add(server_label)
        return server_label
