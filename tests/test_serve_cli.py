"""`responses-repair-proxy serve` as a process: start-up, bad settings, draining on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from tests.harmony import ids_of
from tests.live import LiveServer, free_port, wait_for
from tests.test_server_live import sse_events
from tests.upstream_double import MODEL, UpstreamDouble, script_for
from tests.wellformed import assert_well_formed

ANSWER = (
    "<|channel|>analysis<|message|>Slowly thinking about the question at hand.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>A slow and steady answer.<|return|>"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}
    env.update(extra)
    return env


@pytest.fixture
def double() -> Iterator[tuple[UpstreamDouble, LiveServer]]:
    double = UpstreamDouble()
    with LiveServer(double) as server:
        yield double, server


def start(*args: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_for(ready, 20, 0.05):
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"proxy did not become ready: {err.decode()[-2000:]}")
    return process, url


def test_bad_setting_fails_at_start_naming_it() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--port", "http"],
        env=_env(),
        capture_output=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert b"--port='http'" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve"],
        env=_env(PROXY_IDLE_TIMEOUT="-3"),
        capture_output=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert b"PROXY_IDLE_TIMEOUT='-3'" in result.stderr


def test_sigterm_drains_streams_then_fails_the_rest(
    double: tuple[UpstreamDouble, LiveServer], encoding: HarmonyEncoding
) -> None:
    upstream, server = double
    ids = ids_of(encoding, ANSWER)
    process, url = start("--upstream", server.url, "--drain-timeout", "1", "--log-format", "json")
    results: dict[str, list[dict[str, Any]]] = {}

    upstream.queue = [script_for(ids, 1, pause=0.01), script_for(ids, 1, pause=0.3)]

    def client(name: str) -> None:
        body = {"model": MODEL, "input": "Hi", "stream": True}
        answer = httpx.post(url + "/v1/responses", json=body, timeout=30)
        results[name] = sse_events(answer.content)

    threads = [
        threading.Thread(target=client, args=("quick",)),  # done within the drain period
    ]
    threads[0].start()
    time.sleep(0.05)
    slow = threading.Thread(target=client, args=("slow",))  # ~8 s: cut by the drain
    slow.start()
    assert wait_for(lambda: len(upstream.completions()) == 2, 5)
    time.sleep(0.2)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    for thread in (threads[0], slow):
        thread.join(timeout=15)
    process.wait(timeout=15)
    took = time.monotonic() - signalled
    _, err = process.communicate()
    # uvicorn re-raises the signal after a clean shutdown: the exit status says "terminated"
    assert process.returncode in (0, -signal.SIGTERM), err.decode()[-2000:]
    assert took < 1 + 5 + 1, f"drain took {took:.1f} s"
    assert assert_well_formed(results["quick"])["status"] == "completed"
    slow_response = assert_well_formed(results["slow"])
    assert slow_response["status"] == "failed"
    assert results["slow"][-2]["code"] == "server_shutting_down"
    assert b"Traceback" not in err
