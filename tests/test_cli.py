"""The command line: every command is reachable and says what it does."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args], capture_output=True, timeout=timeout
    )


@pytest.mark.parametrize("command", ["serve", "simulate", "demo"])
def test_help_of_every_command(command: str) -> None:
    result = run(command, "--help")
    assert result.returncode == 0
    assert f"responses-repair-proxy {command}".encode() in result.stdout


def test_vocab_command() -> None:
    result = run("vocab")
    assert result.returncode == 0
    assert b"o200k_base.tiktoken" in result.stdout


def test_demo_json_shows_the_repair() -> None:
    result = run("demo", "--json", timeout=120)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    demo = orjson.loads(result.stdout)
    before, after = demo["trtllm_serve"], demo["proxy"]
    # at stream_interval 20 the unpatched stream loses most text and never announces the answer
    assert not before["matches_final"]
    assert "message" not in before["items_announced"]
    assert len(before["streamed"]["answer"]) < len(before["final"]["answer"])
    # through the proxy every item is announced and the stream equals the final snapshot
    assert after["matches_final"]
    assert after["items_announced"] == ["reasoning", "message"]
    assert after["streamed"]["answer"] == after["final"]["answer"] != ""
    assert after["empty_item_ids"] == 0
    assert demo["proxy_metrics"]["proxy_unpatched_text_differs_total"] == 1
    assert demo["proxy_metrics"]["proxy_items_unannounced_total"] == 1


@pytest.mark.parametrize(
    ("choice", "uvloop"), [("auto", True), ("uvloop", True), ("asyncio", False)]
)
def test_serve_runs_on_the_event_loop_setting(choice: str, uvloop: bool) -> None:
    import asyncio

    from proxy.server.processes.runner import loop_factory

    factory = loop_factory(choice)
    loop = factory() if factory is not None else asyncio.new_event_loop()
    try:
        assert (type(loop).__module__.startswith("uvloop")) is uvloop
    finally:
        loop.close()
