"""Shared by the end-to-end benchmarks: processes pinned to cores, a cheap HTTP/1.1 streaming
client, the simulator with a send-time recorder, and per-process CPU and memory readings.

Layout on a 2-core machine: the process under test (the proxy, or the byte relay) runs
alone on core 0; the benchmark process — the simulator (a real uvicorn server on its own loop)
and the load generator — on core 1. CPU time and memory of each process come from /proc, so the
benchmark's own cost never counts against the proxy, and the generator's CPU share is reported
to show it was not the bottleneck.

The client is ~80 lines of asyncio: it writes one request, reads the status line and headers,
undoes chunked transfer coding and hands every socket read, stamped with `time.monotonic()`
(system-wide on Linux, so comparable with the simulator's stamps), to the caller. It never parses
JSON on the hot path; h11 or httpx would cost the generator several times more per chunk.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from openai_harmony import HarmonyEncoding
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy import vocab

ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai/gpt-oss-120b"
PROXY_CORE = 0
BENCH_CORE = 1
_TICKS = os.sysconf("SC_CLK_TCK")
#: The cores this process may use, read before anything pins it.
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def encoding() -> HarmonyEncoding:
    return vocab.load_encoding(vocab.ensure_vocab(os.environ))


def cores() -> list[int]:
    return CORES


def pin_self(core: int) -> bool:
    """Pin this process to `core` when the machine has it; False when it cannot."""
    if core not in cores():
        return False
    os.sched_setaffinity(0, {core})
    return True


def raise_fd_limit() -> None:
    """1,000 streams need ~4,000 descriptors across client, proxy and simulator."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- processes -----------------------------------------------------------------------------------


@dataclass
class Process:
    """A server process under test on `url`."""

    name: str
    popen: subprocess.Popen[bytes]
    url: str
    port: int
    #: A folder of its own, removed when it stops (the proxy's embedded response store).
    scratch: Path | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time so far (10 ms resolution) of the process and of every process
        it started that is still running (workers: the CPU a deployment pays for)."""
        return sum(_cpu_ticks(pid) for pid in _process_tree(self.pid)) / _TICKS

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of the tree's live threads, by role (`role_of`): where a
        process's CPU goes — its event loop (the main thread) or its other threads (the store's
        SQLite thread, the default executor); and, as "… switches", their context switches
        (voluntary and not) so far."""
        found: dict[str, float] = {}
        for pid in _process_tree(self.pid):
            role = role_of(pid, self.pid)
            try:
                tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
            except OSError:
                continue
            for tid in tids:
                try:
                    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                except OSError:
                    continue
                stat = fields.rsplit(")", 1)[1].split()
                name = f"{role}: {'loop' if tid == pid else 'threads'}"
                found[name] = found.get(name, 0.0) + (int(stat[11]) + int(stat[12])) / _TICKS
                try:
                    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
                except OSError:
                    continue
                switches = sum(
                    int(line.split()[1])
                    for line in status.splitlines()
                    if line.endswith("ctxt_switches") or "ctxt_switches:" in line
                )
                found[f"{name} switches"] = found.get(f"{name} switches", 0.0) + switches
        return found

    def rss_kb(self) -> int:
        return _status_kb(self.pid, "VmRSS")

    def tree_pss_kb(self) -> dict[int, int]:
        """Proportional set size (pages shared between processes split among them, so the
        values add up to what the tree holds) of the process and each descendant now alive."""
        found = {}
        for pid in _process_tree(self.pid):
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:  # it ended since the tree was read
                continue
            for line in rollup.splitlines():
                if line.startswith("Pss:"):
                    found[pid] = int(line.split()[1])
        return found

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def role_of(pid: int, root: int) -> str:
    """What a process of the proxy's tree is: the process `serve` started (with workers: the
    supervisor), a worker process, or a render worker."""
    if pid == root:
        return "serve"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "ended"
    if b"proxy.server.rendering.worker" in command:
        return "render worker"
    if b"proxy.server.processes.worker" in command:
        return "worker"
    return "other"


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (fields 3…)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_ticks(pid: int) -> int:
    try:
        fields = _stat(pid)
    except OSError:  # it ended since the tree was read
        return 0
    return int(fields[11]) + int(fields[12])


def _process_tree(root: int) -> list[int]:
    """`root` and its descendants now alive."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int(_stat(int(entry.name))[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def self_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _pinned(core: int | None) -> Callable[[], None] | None:
    if core is None or core not in cores():
        return None
    return lambda: os.sched_setaffinity(0, {core})


async def start_process(
    name: str,
    argv: Sequence[str],
    port: int,
    *,
    core: int | None,
    ready_path: str,
    cwd: Path = ROOT,
) -> Process:
    """Start a server process pinned to `core` and wait until `ready_path` answers 200 (async:
    the simulator it probes may be serving on this very loop). `python -m proxy` runs the
    `proxy` package found in `cwd` (another checkout, for before/after comparisons)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}
    popen = subprocess.Popen(
        [sys.executable, *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_pinned(core),  # only sets the CPU affinity
    )
    process = Process(name, popen, f"http://127.0.0.1:{port}", port)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{name} exited with {popen.returncode}")
        try:
            status = await _get_status(port, ready_path)
        except OSError:
            status = 0
        if status == 200:
            return process
        await asyncio.sleep(0.05)
    process.stop()
    raise RuntimeError(f"{name} did not become ready on port {port}")


async def _get_status(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        line = await reader.readline()
        return int(line.split()[1]) if line else 0
    finally:
        writer.close()


async def start_proxy(
    upstream: str,
    *,
    core: int | None = PROXY_CORE,
    root: Path = ROOT,
    entry: Sequence[str] = ("-m", "proxy"),
    **settings: str,
) -> Process:
    """`python -m proxy serve` against `upstream`, pinned to `core`, production settings (JSON
    request log at info level, to /dev/null) unless overridden by `settings` (flag names); the
    proxy of the checkout at `root`; `entry` in place of `-m proxy` (bench/phases.py)."""
    port = free_port()
    argv = [*entry, "serve", "--upstream", upstream, "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    scratch = None
    # the default (embedded) store, in a folder of its own; a checkout from before the store
    # has no such setting
    if "data_dir" not in settings and (root / "proxy" / "store").is_dir():
        scratch = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
        settings = {**settings, "data_dir": str(scratch)}
    for key, value in settings.items():
        argv += ["--" + key.replace("_", "-"), value]
    process = await start_process("proxy", argv, port, core=core, ready_path="/readyz", cwd=root)
    process.scratch = scratch
    return process


def settings_arg(text: str) -> tuple[str, str]:
    """`NAME=VALUE` (a `--setting` of the benchmarks: a proxy setting, e.g. `store_url=off`)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"expected NAME=VALUE, got {text!r}")
    return name.replace("-", "_"), value


async def start_relay(
    upstream: str, *, core: int | None = PROXY_CORE, client: str = "httpx"
) -> Process:
    """The plain byte relay (bench/byte_relay.py, on `client`) against `upstream`, pinned to
    `core`."""
    port = free_port()
    argv = [str(ROOT / "bench" / "byte_relay.py"), "--upstream", upstream, "--port", str(port)]
    argv += ["--client", client]
    return await start_process("byte relay", argv, port, core=core, ready_path="/health")


# -- the simulator with a send recorder --------------------------------------------------------


class SendRecorder:
    """ASGI middleware around the simulator: the monotonic time of every body chunk it sends,
    per `X-Request-Id`, with whether the chunk carried generated tokens."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.sends: dict[str, list[tuple[float, bool]]] = {}
        #: When the request reached the simulator's app (its head parsed), and when the
        #: simulator sent its answer's head, per `X-Request-Id`.
        self.arrivals: dict[str, float] = {}
        self.heads: dict[str, float] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            await self.app(scope, receive, send)
            return
        key = dict(scope["headers"]).get(b"x-request-id", b"").decode()
        self.arrivals[key] = time.monotonic()
        stamps = self.sends.setdefault(key, [])

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.heads[key] = time.monotonic()
            elif message["type"] == "http.response.body" and message.get("body"):
                body: bytes = message["body"]
                stamps.append((time.monotonic(), b'"token_ids":[' in body and b'":[]' not in body))
            await send(message)

        await self.app(scope, receive, stamped)


# -- the client ------------------------------------------------------------------------------------


@dataclass
class Answer:
    """One streamed answer: status, when each socket read arrived, and the body."""

    status: int = 0
    sent_at: float = 0.0
    head_at: float = 0.0
    reads: list[tuple[float, bytes]] = field(default_factory=list)  # de-chunked
    error: str | None = None
    size: int = 0  # body bytes read

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.reads)

    def events(self) -> list[dict[str, Any]]:
        """Every `data:` payload of the SSE body, parsed ([DONE] left out)."""
        return [
            orjson.loads(line[6:])
            for line in self.body.split(b"\n")
            if line.startswith(b"data: ") and line != b"data: [DONE]"
        ]

    def terminal(self) -> dict[str, Any] | None:
        """The last Responses event, parsed (cheap: only the tail is read)."""
        body = self.body
        cut = body.rfind(b"\ndata: ", 0, len(body) - 2)
        if cut < 0:
            return None
        line = body[cut + 7 :].split(b"\n", 1)[0]
        event: dict[str, Any] = orjson.loads(line)
        return event


def request_bytes(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: 127.0.0.1", "content-type: application/json"]
    lines += [f"content-length: {len(body)}", "connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def stream(
    port: int,
    payload: bytes,
    *,
    keep_reads: bool = True,
    on_head: Callable[[], None] | None = None,
) -> Answer:
    """Send one prepared request (`request_bytes`) and read the streamed answer to its end."""
    answer = Answer()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answer.sent_at = time.monotonic()
        writer.write(payload)
        head = await reader.readuntil(b"\r\n\r\n")
        answer.head_at = time.monotonic()
        answer.status = int(head.split(b" ", 2)[1])
        if on_head is not None:
            on_head()
        chunked = b"transfer-encoding: chunked" in head.lower()
        buffer = b""
        size = -1  # bytes left in the current chunk; -1: a size line is next
        while True:
            data = await reader.read(262144)
            now = time.monotonic()
            if not data:
                break
            if not chunked:
                _keep(answer, now, data, keep_reads)
                continue
            buffer += data
            out: list[bytes] = []
            ended = False
            while True:
                if size < 0:
                    cut = buffer.find(b"\r\n")
                    if cut < 0:
                        break
                    size = int(buffer[:cut].split(b";")[0], 16)
                    buffer = buffer[cut + 2 :]
                    if size == 0:
                        ended = True
                        break
                if len(buffer) < size + 2:
                    break
                out.append(buffer[:size])
                buffer = buffer[size + 2 :]
                size = -1
            if out:
                _keep(answer, now, b"".join(out), keep_reads)
            if ended:
                break
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        answer.error = type(exc).__name__
    finally:
        writer.close()
    return answer


#: Without `keep_reads`, only the last reads are kept (the terminal event is in them).
_TAIL_READS = 32


def _keep(answer: Answer, now: float, data: bytes, keep_reads: bool) -> None:
    answer.size += len(data)
    answer.reads.append((now, data))
    if not keep_reads and len(answer.reads) > 2 * _TAIL_READS:
        del answer.reads[:_TAIL_READS]


# -- figures ---------------------------------------------------------------------------------------


@contextmanager
def no_gc_pauses() -> Iterator[None]:
    """This process's cyclic GC off for a timed phase: the load generator is the instrument, and
    its own full collections (100-300 ms with thousands of streams' reads held) would show as
    latency of whatever it measures. What it holds is collected after."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
        gc.collect()


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (pastes into BENCHMARKS.md as it is)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for number, row in enumerate(cells):
        lines.append("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if number == 0:
            lines.append("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    return "\n".join(lines)


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return (
        f"{model}, {os.cpu_count()} cores; Python {sys.version.split()[0]}; "
        f"pinned: {'yes' if len(cores()) >= 2 else 'no (one core)'}"
    )
