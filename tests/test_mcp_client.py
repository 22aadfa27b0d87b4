"""The MCP client side against real MCP servers on loopback: listing, calls, failures, the time
bound, the result cap, headers to the server only, the policy and the cache."""

from __future__ import annotations

import asyncio
import logging
import runpy
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.mcp import Limits, McpFailure, Policy, Refused, ToolCache, call_tool, credential_key
from proxy.mcp import list_tools as list_server_tools
from tests.live import LiveServer
from tests.mcp_servers import BIG, SEEN_AUTH, mcp_server

LIMITS = Limits(timeout=5.0, result_cap=1000)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with mcp_server() as endpoint:
        yield endpoint


@pytest.mark.parametrize("transport", ["http", "sse"])
def test_lists_and_calls_over_both_transports(transport: str) -> None:
    with mcp_server(transport) as endpoint:
        tools = asyncio.run(list_server_tools(endpoint, None, LIMITS))
        names = {tool["name"] for tool in tools}
        assert names == {"echo", "add", "fail", "sleep", "slow", "big"}
        echo = next(tool for tool in tools if tool["name"] == "echo")
        assert echo["description"] == "Echo the text back."
        assert echo["input_schema"]["properties"]["text"]["type"] == "string"
        outcome = asyncio.run(call_tool(endpoint, None, "echo", {"text": "hi"}, LIMITS))
        assert (outcome.output, outcome.error) == ("echo: hi", None)


def test_a_failing_tool_is_an_error_outcome(url: str) -> None:
    outcome = asyncio.run(call_tool(url, None, "fail", {}, LIMITS))
    assert outcome.output is None
    assert outcome.error is not None
    assert "the tool broke" in outcome.error


def test_an_unknown_tool_is_an_error_outcome(url: str) -> None:
    outcome = asyncio.run(call_tool(url, None, "nope", {}, LIMITS))
    assert outcome.output is None
    assert outcome.error


def test_a_slow_tool_times_out_within_the_bound(url: str) -> None:
    async def run() -> tuple[float, object]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        outcome = await call_tool(url, None, "sleep", {"seconds": 10}, Limits(timeout=0.5))
        return loop.time() - start, outcome

    took, outcome = asyncio.run(run())
    assert took < 3
    assert getattr(outcome, "error", None) == "the MCP tool call timed out after 0.5 s"


def test_a_large_result_is_capped(url: str) -> None:
    outcome = asyncio.run(call_tool(url, None, "big", {}, LIMITS))
    assert outcome.output is not None
    assert outcome.output.startswith("x" * 1000)
    assert outcome.output.endswith("[output truncated at 1000 characters]")
    assert len(outcome.output) < BIG


def test_a_dead_server_is_a_failure_not_a_hang() -> None:
    dead = "http://127.0.0.1:9/mcp"
    outcome = asyncio.run(call_tool(dead, None, "echo", {"text": "x"}, Limits(timeout=2.0)))
    assert outcome.error is not None
    assert outcome.error.startswith("the MCP tool call failed")
    with pytest.raises(McpFailure, match="could not be listed"):
        asyncio.run(list_server_tools(dead, None, Limits(timeout=2.0)))


def test_headers_reach_the_server_and_no_error_quotes_them(url: str) -> None:
    SEEN_AUTH.clear()
    headers = {"Authorization": "Bearer s3cret-token"}
    asyncio.run(call_tool(url, headers, "echo", {"text": "a"}, LIMITS))
    assert "Bearer s3cret-token" in SEEN_AUTH
    failed = asyncio.run(call_tool("http://127.0.0.1:9/mcp", headers, "echo", {}, LIMITS))
    assert "s3cret" not in (failed.error or "")


def test_policy_allows_nothing_by_default() -> None:
    with pytest.raises(Refused) as refused:
        asyncio.run(Policy().check("https://mcp.example.com/mcp"))
    assert refused.value.code == "mcp_server_not_allowed"


@pytest.mark.parametrize(
    ("allowed", "target", "ok"),
    [
        (("https://mcp.example.com/api",), "https://mcp.example.com/api/mcp", True),
        (("https://mcp.example.com/api",), "https://mcp.example.com/apix", False),
        (("https://mcp.example.com/api",), "http://mcp.example.com/api", False),
        (("https://mcp.example.com/",), "https://MCP.example.com/x", True),
        (("mcp.example.com",), "https://mcp.example.com:8443/x", True),
        (("mcp.example.com",), "https://evil.example.com/x", False),
        (("mcp.example.com",), "https://mcp.example.com.evil.net/x", False),
    ],
)
def test_allow_list_prefixes_and_hosts(allowed: tuple[str, ...], target: str, ok: bool) -> None:
    policy = Policy(allowed=allowed)
    if ok:
        assert policy.check_url(target) == target.split("/")[2].split(":")[0].lower()
    else:
        with pytest.raises(Refused):
            policy.check_url(target)


@pytest.mark.parametrize(
    "target",
    ["ftp://h/x", "http:///x", "https://user:pw@mcp.example.com/x", "not a url"],
)
def test_malformed_urls_are_refused(target: str) -> None:
    with pytest.raises(Refused) as refused:
        Policy(allowed=("mcp.example.com",)).check_url(target)
    assert refused.value.code in {"invalid_mcp_server_url", "mcp_server_not_allowed"}


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "10.1.2.3", "192.168.0.9", "169.254.169.254", "[::1]"]
)
def test_private_addresses_are_refused_after_resolution(host: str) -> None:
    bare = host.strip("[]")
    policy = Policy(allowed=(bare,))
    with pytest.raises(Refused) as refused:
        asyncio.run(policy.check(f"http://{host}/mcp"))
    assert refused.value.code == "mcp_server_private_address"
    asyncio.run(Policy(allowed=(bare,), allow_private=True).check(f"http://{host}/mcp"))


def test_cache_keys_by_url_and_credential_and_expires() -> None:
    now = [0.0]
    cache = ToolCache(ttl=10, entries=2, clock=lambda: now[0])
    alice = credential_key("https://a/mcp", {"Authorization": "Bearer A"})
    bob = credential_key("https://a/mcp", {"authorization": "Bearer B"})
    assert alice != bob
    assert alice == credential_key("https://a/mcp", {"authorization": "Bearer A"})
    assert "Bearer" not in alice
    cache.put(alice, [{"name": "t"}])
    assert cache.get(alice) == [{"name": "t"}]
    assert cache.get(bob) is None
    now[0] = 10.0
    assert cache.get(alice) is None
    for index in range(3):
        cache.put(credential_key(f"https://{index}/", None), [])
    assert cache.get(credential_key("https://0/", None)) is None
    assert cache.get(credential_key("https://2/", None)) == []
    off = ToolCache(ttl=0, entries=5, clock=lambda: 0.0)
    off.put(alice, [])
    assert off.get(alice) is None


def test_the_compose_demo_server_lists_and_answers() -> None:
    script = Path(__file__).parent.parent / "deploy" / "compose" / "mcp" / "demo_server.py"
    demo = runpy.run_path(str(script))["server"]
    with LiveServer(demo.streamable_http_app(host="0.0.0.0")) as live:
        endpoint = live.url + "/mcp"
        tools = asyncio.run(list_server_tools(endpoint, None, LIMITS))
        assert {tool["name"] for tool in tools} == {"echo", "utc_now"}
        outcome = asyncio.run(call_tool(endpoint, None, "utc_now", {}, LIMITS))
        assert outcome.output is not None
        assert outcome.output.endswith("+00:00")


def test_the_sdk_logs_nothing(url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    headers = {"Authorization": "Bearer s3cret-token"}
    asyncio.run(call_tool(url, headers, "echo", {"text": "a"}, LIMITS))
    asyncio.run(call_tool("http://127.0.0.1:9/mcp?key=s3cret", headers, "echo", {}, LIMITS))
    leaked = [r for r in caplog.records if r.name.split(".")[0] in {"mcp", "httpx2", "httpcore2"}]
    assert leaked == []
