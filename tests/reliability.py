"""Shared by the reliability suite (`tests/test_reliability_*.py`).

Everything runs on real loopback sockets: the proxy (in-process on its own uvicorn thread, or as
a `python -m proxy serve` process when its own memory or signals are under test), the trtllm-serve
simulator (`SimThread`, its own loop and thread) or the scripted upstream double, and clients.

Sizes come from `PROXY_RELIABILITY_SCALE`: `short` (the default; `make test` and CI) or `full`
(the long runs quoted in BENCHMARKS.md): `scaled(short, full)`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
from openai_harmony import HarmonyEncoding
from prometheus_client import CollectorRegistry

from proxy.config.settings import Settings
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.response import CountingIds
from proxy.server.app import create_app
from proxy.server.http.guard import http_guard
from proxy.simulator import SimulatorConfig
from proxy.simulator.model import Completion, ScriptedModel
from tests.live import LiveServer, free_port, wait_for

MODEL = "openai/gpt-oss-120b"
SCALE = os.environ.get("PROXY_RELIABILITY_SCALE", "short")
if SCALE not in ("short", "full"):
    raise ValueError(f"PROXY_RELIABILITY_SCALE={SCALE!r}: must be short or full")
FAST_SIM = SimulatorConfig(first_token_seconds=0.0, token_seconds=0.0, record_limit=5000)
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def scaled(short: int, full: int) -> int:
    return full if SCALE == "full" else short


def raise_fd_limit() -> None:
    """A thousand streams need about four thousand descriptors in one test process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def body(text: str = "Where is my order?", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": text, "stream": True, **extra}


def completion(encoding: HarmonyEncoding, request: dict[str, Any], **options: Any) -> Completion:
    """What the simulator's scripted model writes for this request (`min_tokens`, `preamble`)."""
    prompt = prepare_request(request, encoding).prompt_token_ids
    return ScriptedModel(encoding).complete(prompt, **options)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    return [
        orjson.loads(line[6:])
        for line in raw.split(b"\n")
        if line.startswith(b"data: ") and line != b"data: [DONE]"
    ]


def texts(events: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(item type, text) of every finished item, from the terminal snapshot."""
    out = []
    for item in events[-1]["response"]["output"]:
        if item["type"] == "function_call":
            out.append(("function_call", item["arguments"]))
        else:
            out.append((item["type"], "".join(part["text"] for part in item["content"])))
    return out


def expected_texts(done: Completion) -> list[tuple[str, str]]:
    kinds = {"analysis": "reasoning", "final": "message", "commentary": "message"}
    return [
        ("function_call", text) if recipient else (kinds[channel], text)
        for channel, recipient, text in done.messages
    ]


class LogCapture(logging.Handler):
    """Records of the loggers that would show an unhandled exception: uvicorn's ("Exception in
    ASGI application"), asyncio's ("Task exception was never retrieved") and the proxy's."""

    NAMES = ("uvicorn.error", "asyncio", "responses_repair_proxy")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        #: Only records of this thread (the proxy's server thread): the simulator's uvicorn,
        #: in another thread of the same process, logs to the same loggers.
        self.thread: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.thread is None or record.thread == self.thread:
            self.records.append(record)

    def problems(self) -> list[str]:
        return [
            f"{r.name} {r.levelname}: {r.getMessage()[:300]}"
            for r in self.records
            if r.exc_info or r.levelno >= logging.ERROR
        ]

    def text(self) -> str:
        formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
        lines = []
        for record in self.records:
            line = formatter.format(record)
            fields = {k: v for k, v in vars(record).items() if k not in _RESERVED}
            lines.append(f"{line} {fields}")
        return "\n".join(lines)

    @contextmanager
    def attached(self) -> Iterator[LogCapture]:
        loggers = [logging.getLogger(name) for name in self.NAMES]
        for logger in loggers:
            logger.addHandler(self)
        try:
            yield self
        finally:
            for logger in loggers:
                logger.removeHandler(self)


_RESERVED = frozenset([*vars(logging.makeLogRecord({})), "message", "asctime"])


@dataclasses.dataclass
class Proxy:
    """The proxy app on a live uvicorn socket, its metrics registry and its log."""

    server: LiveServer
    registry: CollectorRegistry
    logs: LogCapture
    app: Any

    @property
    def url(self) -> str:
        return self.server.url

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def in_flight(self) -> float:
        return self.metric("proxy_streams_in_flight")


@contextmanager
def running_proxy(
    upstream_url: str, encoding: HarmonyEncoding, **overrides: Any
) -> Iterator[Proxy]:
    settings = dataclasses.replace(Settings(upstream_url=upstream_url), **overrides)
    registry = CollectorRegistry()
    logs = LogCapture()
    logger = logging.getLogger("responses_repair_proxy.reliability")
    logger.setLevel(logging.INFO)
    app = create_app(settings, encoding, ids=CountingIds(), registry=registry, logger=logger)
    # The HTTP guard and forwarding set-up of `serve`, so live tests see what users run.
    options = http_guard(settings, app.state.metrics, logger).uvicorn_options()
    with LiveServer(app, **options) as server, logs.attached():  # the proxy's log propagates
        logs.thread = server._thread.ident
        assert wait_for(lambda: app.state.proxy.capability.token_ids, 10), "probe failed"
        yield Proxy(server, registry, logs, app)


def stream(
    client: httpx.Client, url: str, request: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    answer = client.post(url + "/v1/responses", json=request, headers=headers or {})
    return answer.status_code, answer.content


# -- the proxy as a process ----------------------------------------------------------------------


@dataclasses.dataclass
class ProxyProcess:
    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start_proxy_process(
    upstream_url: str,
    log: Path,
    *flags: str,
    env: Mapping[str, str] | None = None,
    cpus: str | None = None,
    open_files: int | None = None,
) -> ProxyProcess:
    """`python -m proxy serve` against `upstream_url`, JSON log to `log`, ready to serve;
    `env`: variables added to the process's environment; `cpus`: its affinity (`taskset -c`,
    which execs the proxy: the pid is the proxy's); `open_files`: its RLIMIT_NOFILE, soft and
    hard (as `ulimit -n` would set it)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")} | dict(env or {})
    pinned = ("taskset", "-c", cpus) if cpus is not None else ()
    with log.open("wb") as sink:
        popen = subprocess.Popen(
            [
                *pinned,
                *(sys.executable, "-m", "proxy", "serve", "--upstream", upstream_url),
                *("--host", "127.0.0.1", "--port", str(port), "--log-format", "json", *flags),
            ],
            env=env,
            stdout=sink,
            stderr=sink,
            preexec_fn=None if open_files is None else _open_files_limit(open_files),
        )
    process = ProxyProcess(popen, f"http://127.0.0.1:{port}", log)

    def ready() -> bool:
        try:
            return httpx.get(process.url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_for(ready, 30, 0.05):
        process.stop()
        raise AssertionError(f"proxy did not become ready: {process.log_text()[-2000:]}")
    return process


def _open_files_limit(count: int) -> Any:
    def limit() -> None:  # in the child, before it execs the proxy
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))

    return limit


def log_problems(text: str) -> list[str]:
    """Lines of a JSON log that show an error or a traceback."""
    problems = []
    for line in text.splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            problems.append(line[:300])  # not ours: a raw traceback or a crash message
            continue
        if record.get("level") in ("error", "critical") or "exc" in record:
            problems.append(line[:300])
    return problems


def wait_until(predicate: Any, timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# -- an upstream on a raw socket -----------------------------------------------------------------


class RawUpstream:
    """A bare-socket HTTP/1.1 stand-in for trtllm-serve, for what uvicorn would not let an app do
    (drop the connection before a status line; send odd response headers). It answers the probe,
    `/health` and `/v1/models` properly; each streaming `/v1/completions` gets `stream_answer`
    (raw bytes; empty: close at once); a request for a path in `answers` gets its raw pieces
    (50 ms apart), then the connection is closed, or kept for the next request (`keep`), or
    held open until the proxy closes it (`hold`)."""

    def __init__(self, stream_answer: bytes = b"") -> None:
        self.stream_answer = stream_answer
        self.answers: dict[bytes, tuple[list[bytes], str]] = {}
        self.requests: list[bytes] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.url = ""

    def __enter__(self) -> RawUpstream:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self._server = future.result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", 0)

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                payload = await reader.readexactly(length) if length else b""
                self.requests.append(head + payload)
                target = head.split(b" ", 2)[1]
                if target in self.answers:
                    pieces, then = self.answers[target]
                    for number, piece in enumerate(pieces):
                        if number:
                            await asyncio.sleep(0.05)
                        writer.write(piece)
                        await writer.drain()
                    if then == "hold":
                        await reader.read()  # until the proxy closes
                    if then != "keep":
                        return
                    continue
                if target == b"/v1/completions" and b'"stream":true' in payload:
                    if self.stream_answer:
                        writer.write(self.stream_answer)
                        await writer.drain()
                    return  # close: a cut, or the end of a `connection: close` answer
                if target == b"/v1/completions":
                    answer: Any = {"choices": [{"index": 0, "text": "", "token_ids": [200005]}]}
                elif target == b"/v1/models":
                    answer = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                else:
                    answer = {}
                data = orjson.dumps(answer)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(data), data)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()
