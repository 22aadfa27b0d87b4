"""The app's side of hosted MCP tools: the policy, the tool-list cache, the limits, the metrics;
one listing and one call, counted (proxy/metrics/mcp.py). Built once per app from the settings
(`Hosted.from_settings`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from proxy.config.settings import Settings
from proxy.harmony.mcp import items
from proxy.harmony.mcp.declare import Server
from proxy.mcp import Limits, McpFailure, Policy, ToolCache, call_tool, credential_key, list_tools
from proxy.metrics.mcp import NOT_RUN, McpMetrics
from proxy.tracing import Tracing

#: Characters of a tool name in a span's name and attributes.
_SPAN_CAP = 128


@dataclass
class Hosted:
    """What every request with `mcp` tools shares."""

    policy: Policy
    cache: ToolCache
    limits: Limits
    max_calls: int
    loop_timeout: float
    metrics: McpMetrics
    #: `mcp` tools one request may declare (`mcp_max_servers`).
    max_servers: int = 16
    monotonic: Callable[[], float] = time.monotonic
    ids: Callable[[str], str] = field(default=lambda prefix: prefix)
    #: Each call a client span under the request's when tracing is on.
    tracing: Tracing | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        registry: CollectorRegistry,
        ids: Callable[[str], str],
        monotonic: Callable[[], float],
    ) -> Hosted:
        return cls(
            policy=Policy(settings.mcp_allowed_servers, settings.mcp_allow_private_addresses),
            cache=ToolCache(settings.mcp_list_cache_seconds, 1024, monotonic),
            limits=Limits(settings.mcp_call_timeout, settings.mcp_result_max_chars),
            max_calls=settings.mcp_max_calls,
            max_servers=settings.mcp_max_servers,
            loop_timeout=settings.mcp_loop_timeout,
            metrics=McpMetrics(registry),
            monotonic=monotonic,
            ids=ids,
        )

    async def listing(self, server: Server) -> tuple[list[dict[str, Any]], str | None, bool]:
        """The server's tools, an error message (then no tools), and whether it was listed now
        (not reused from the cache)."""
        key = credential_key(server.url, server.headers)
        label = self.metrics.label(server.label)
        cached = self.cache.get(key)
        if cached is not None:
            self.metrics.lists.labels(label, "cached").inc()
            return cached, None, False
        try:
            tools = await list_tools(server.url, server.headers, self.limits)
        except McpFailure as failure:
            self.metrics.lists.labels(label, "error").inc()
            return [], str(failure), True
        self.metrics.lists.labels(label, "ok").inc()
        self.cache.put(key, tools)
        return tools, None, True

    async def listings(
        self, servers: list[Server]
    ) -> dict[str, tuple[list[dict[str, Any]], str | None]]:
        """The tools (and an error message) of each of `servers`, by label: the servers listed
        concurrently, so all of them within one `mcp_call_timeout`; servers at one URL with
        one credential are listed once (the others count as reusing it)."""
        groups: dict[str, list[Server]] = {}
        for server in servers:
            groups.setdefault(credential_key(server.url, server.headers), []).append(server)
        # A TaskGroup: cancelled (the client went away), every listing is, its session closed.
        async with asyncio.TaskGroup() as group:
            tasks = [(same, group.create_task(self.listing(same[0]))) for same in groups.values()]
        found: dict[str, tuple[list[dict[str, Any]], str | None]] = {}
        for same, task in tasks:
            tools, error, _ = task.result()
            for server in same:
                found[server.label] = (tools, error)
            for server in same[1:]:
                outcome = "error" if error is not None else "cached"
                self.metrics.lists.labels(self.metrics.label(server.label), outcome).inc()
        return found

    def count_unrun(self, server: Server) -> None:
        """A call the model made that the budget left unrun."""
        self.metrics.calls.labels(self.metrics.label(server.label), NOT_RUN).inc()

    async def call(
        self, server: Server, name: str, arguments: str, approval_request_id: str | None = None
    ) -> dict[str, Any]:
        """Run one call: the finished `mcp_call` item (its `error` set on any failure)."""
        item_id = self.ids("mcp")
        label = self.metrics.label(server.label)
        try:
            parsed = items_arguments(arguments)
        except ValueError:
            error = items.call_error(items.TOOL_ERROR, "the arguments are not a JSON object")
            self.metrics.calls.labels(label, "error").inc()
            return items.call_item(
                item_id,
                server.label,
                name,
                arguments,
                status="failed",
                error=error,
                approval_request_id=approval_request_id,
            )
        started = self.monotonic()
        if self.tracing is None:
            outcome = await call_tool(server.url, server.headers, name, parsed, self.limits)
        else:
            # The server's label and the tool's name only: never its URL, headers or arguments.
            attributes = {"gen_ai.tool.name": name[:_SPAN_CAP], "proxy.mcp.server": label}
            with self.tracing.span(f"mcp {name[:_SPAN_CAP]}", attributes, client=True) as span:
                outcome = await call_tool(server.url, server.headers, name, parsed, self.limits)
                if outcome.error is not None:
                    span.set_attribute("error.type", "tool_error" if outcome.tool_error else "mcp")
        self.metrics.latency.labels(label).observe(self.monotonic() - started)
        self.metrics.calls.labels(label, "error" if outcome.error else "ok").inc()
        if outcome.error is not None:
            kind = items.TOOL_ERROR if outcome.tool_error else items.PROTOCOL_ERROR
            return items.call_item(
                item_id,
                server.label,
                name,
                arguments,
                status="failed",
                error=items.call_error(kind, outcome.error),
                approval_request_id=approval_request_id,
            )
        return items.call_item(
            item_id,
            server.label,
            name,
            arguments,
            status="completed",
            output=outcome.output,
            approval_request_id=approval_request_id,
        )


def items_arguments(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as an object (an empty text is no arguments)."""
    if not arguments.strip():
        return {}
    value = orjson.loads(arguments)
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value
