"""One MCP operation per connection: list a server's tools, or call one, within a time bound.

The official SDK's streamable HTTP client is used, or its SSE client for a URL whose path ends in
`/sse` (the older transport). The client's headers go to that server only. Any failure — connect,
protocol, timeout, a tool's own error — comes back as a short message that names no secret; a
result is cut to the size cap.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp_types as types
import orjson

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

# The SDK's and its HTTP client's own log lines quote server URLs and exceptions' texts, which
# may hold a client's credential (a token in a query string, a header echoed in an error): the
# proxy logs what it decides itself (logs.py), and none of theirs.
for _name in ("mcp", "mcp_types", "httpx2", "httpcore2"):
    _quiet = logging.getLogger(_name)
    _quiet.handlers = [logging.NullHandler()]
    _quiet.propagate = False
    _quiet.setLevel(logging.CRITICAL + 1)


class McpFailure(Exception):
    """The server could not be listed; the message is safe to show the client."""


@dataclass(frozen=True, slots=True)
class Limits:
    """`timeout`: seconds for one whole operation (connect included); `result_cap`: characters
    of a call's output kept."""

    timeout: float = 30.0
    result_cap: int = 65536


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """A call's `output` text, or its `error` (exactly one is set); `tool_error`: the tool
    answered with an error (else the server was not reached or did not answer in time)."""

    output: str | None
    error: str | None
    tool_error: bool = False


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context of every MCP client, made once: a client that makes its own spends
    ~20 ms of CPU loading the CA bundle, on every MCP session (bench/mcp_roundtrip.py)."""
    return httpx2.create_ssl_context()


def _client(
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """An HTTP client for one MCP session (the SDK's client factory's signature); redirects are
    left to the SDK, which follows them within the server's origin only."""
    return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, verify=_tls())


@contextlib.asynccontextmanager
async def _session(
    url: str, headers: Mapping[str, str] | None, limits: Limits
) -> AsyncIterator[ClientSession]:
    # The SDK imports OpenTelemetry's API: loaded with the first MCP session, not with the
    # proxy (tracing off imports nothing of OpenTelemetry; a worker without MCP tools less).
    from mcp.client.session import ClientSession
    from mcp.client.sse import sse_client

    plain = dict(headers or {})
    timeout = httpx2.Timeout(limits.timeout)
    if urlsplit(url).path.rstrip("/").endswith("/sse"):
        transport = sse_client(
            url,
            headers=plain,
            timeout=limits.timeout,
            sse_read_timeout=limits.timeout,
            httpx_client_factory=_client,
        )
    else:
        transport = _owned(_client(plain, timeout), url)
    async with transport as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write, read_timeout_seconds=limits.timeout) as session:
            await session.initialize()
            yield session


@contextlib.asynccontextmanager
async def _owned(client: httpx2.AsyncClient, url: str) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client

    async with client, streamable_http_client(url, http_client=client) as streams:
        yield streams


def tool_definition(tool: types.Tool) -> dict[str, Any]:
    """A listed tool as an `mcp_list_tools` item's entry."""
    annotations = tool.annotations.model_dump(exclude_none=True) if tool.annotations else None
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input_schema,
        "annotations": annotations,
    }


async def list_tools(
    url: str, headers: Mapping[str, str] | None, limits: Limits
) -> list[dict[str, Any]]:
    """The server's tools (all pages), or `McpFailure`."""
    try:
        with anyio.fail_after(limits.timeout):
            async with _session(url, headers, limits) as session:
                tools: list[dict[str, Any]] = []
                cursor: str | None = None
                for _ in range(100):
                    params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    page = await session.list_tools(params=params)
                    tools.extend(tool_definition(tool) for tool in page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                return tools
    except TimeoutError as exc:
        raise McpFailure("the MCP server did not list its tools in time") from exc
    except Exception as exc:  # the SDK raises many kinds, also in exception groups
        raise McpFailure(f"the MCP server could not be listed ({_kind(exc)})") from exc


async def call_tool(
    url: str,
    headers: Mapping[str, str] | None,
    name: str,
    arguments: dict[str, Any],
    limits: Limits,
) -> CallOutcome:
    """Call `name`; never raises for the server's faults (they are the outcome's `error`)."""
    try:
        with anyio.fail_after(limits.timeout):
            async with _session(url, headers, limits) as session:
                result = await session.call_tool(name, arguments)
    except TimeoutError:
        return CallOutcome(None, f"the MCP tool call timed out after {limits.timeout:g} s")
    except Exception as exc:  # the SDK raises many kinds, also in exception groups
        return CallOutcome(None, f"the MCP tool call failed ({_kind(exc)})")
    text = _cap(result_text(result), limits.result_cap)
    if result.is_error:
        return CallOutcome(None, text or "the MCP tool reported an error", tool_error=True)
    return CallOutcome(text, None)


def result_text(result: types.CallToolResult) -> str:
    """The text of a result: its text blocks joined, else its structured content as JSON."""
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return orjson.dumps(result.structured_content).decode()
    return ""


def _cap(text: str, cap: int) -> str:
    if len(text) <= cap:
        return text
    return text[:cap] + f"\n[output truncated at {cap} characters]"


def _kind(exc: BaseException) -> str:
    """A safe name for what went wrong: the innermost exception's class, never its text (it may
    quote a header or a URL with a secret)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return type(exc).__name__
