"""Rendering in worker processes: `RenderPool`, behind the `Renderer` seam (renderer.py).

`prepare_request` holds the GIL while openai-harmony renders, and its BPE is quadratic in one
unbroken run of text: `"a" * 200_000`, 100,000 CJK characters or 100,000 small input items held
the event loop 12-29 s, so every other stream stalled and `/healthz` missed its liveness probe.
A thread does not help; a process does. `RenderPool`:

- **fast path**: a body that is provably cheap to render (`is_cheap`, renderer.py) is rendered
  inline, on the loop, where it costs less than a round trip to a worker.
- **workers**: everything else goes to one of `render_workers` processes
  (`rendering/worker.py`), each with its encoding and `PrefixCache`, restarted when one dies.
  The first body that is not cheap starts them, not the app: a proxy that only sees cheap bodies
  never pays their ~75 MB each (bench/idle_memory.py), and that first body waits ~0.7 s for the
  encoding to load. At most `render_queue` requests wait for a free worker (more: 429 +
  Retry-After), and none waits longer than `render_timeout` (then 429 too).
- **render_timeout**: a render that takes longer gets a 400 naming the limit; its worker is
  killed (SIGKILL: it is inside Rust code that cannot be interrupted) and replaced, which
  `concurrent.futures.ProcessPoolExecutor` cannot do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from openai_harmony import HarmonyEncoding

from proxy import vocab
from proxy.config.settings import Settings
from proxy.errors import ClientError, ProxyError
from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.request.prepare import PreparedRequest
from proxy.server.rendering import worker as wire
from proxy.server.rendering.pacer import Pacer
from proxy.server.rendering.renderer import InlineRenderer, Renderer, is_cheap
from proxy.server.rendering.worker import RenderOptions

if TYPE_CHECKING:
    from proxy.metrics.serving import Metrics

#: Seconds a new worker may take to load the encoding and say it is ready.
BOOT_TIMEOUT = 60.0
#: Longest pause between restarts of a worker that keeps dying before it is ready.
MAX_BACKOFF = 30.0


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        assert process.stdin is not None
        assert process.stdout is not None
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.booted = False
        self.killed = False

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.killed

    async def read(self) -> tuple[bytes, memoryview]:
        header = await self.stdout.readexactly(wire.HEADER.size)
        payload = memoryview(await self.stdout.readexactly(wire.HEADER.unpack(header)[0]))
        return bytes(payload[:1]), payload[1:]

    async def call(self, request: bytes) -> tuple[bytes, memoryview]:
        self.stdin.write(wire.HEADER.pack(len(request)) + request)
        await self.stdin.drain()
        return await self.read()

    def kill(self) -> None:
        if self.alive:
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()


class RenderPool:
    """Worker processes behind the `Renderer` seam (module doc). Owned by the app's lifespan:
    `start()` spawns the workers, `aclose()` ends them."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        vocab_dir: Path,
        *,
        workers: int,
        timeout: float,
        queue: int,
        prefixes: PrefixCache | None = None,
        options: RenderOptions | None = None,
        log: Callable[..., None] = lambda message, **fields: None,
        on_render: Callable[[str, str], None] = lambda path, outcome: None,
        python: str = sys.executable,
        pacer: Pacer | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a render pool needs at least one worker, got {workers}")
        self._options = options or RenderOptions()
        self._inline = InlineRenderer(encoding, prefixes, self._options, pacer)
        self._vocab_dir = vocab_dir
        self._size = workers
        self._timeout = timeout
        self._queue_limit = queue
        self._log = log
        self._on_render = on_render
        self._python = python
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting = 0
        self._closing = False
        self._started = False
        self._spawned = False

    # -- life ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Accept renders; the workers are spawned by the first body that needs one."""
        self._started = True

    def _spawn(self) -> None:
        """Spawn the workers once (they get ready in the background: ~0.7 s to load the
        encoding)."""
        if self._spawned or self._closing:
            return
        self._spawned = True
        for _ in range(self._size):
            self._keep(self._run_worker())

    async def wait_ready(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Spawn the workers if no body has yet, and wait until every one is ready (benchmarks
        and tests)."""
        self._spawn()
        async with asyncio.timeout(timeout):
            while self._ready() < self._size:
                await asyncio.sleep(0.01)

    def _ready(self) -> int:
        return sum(1 for worker in self._workers if worker.booted and worker.alive)

    def ready(self) -> bool:
        """Started, and at least one worker can render or none was needed yet (`/readyz`)."""
        return self._started and (not self._spawned or self._ready() > 0)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers (benchmarks read their memory)."""
        return [worker.process.pid for worker in self._workers if worker.process.returncode is None]

    async def aclose(self) -> None:
        """End every worker and the tasks that watch them."""
        self._closing = True
        for worker in list(self._workers):
            worker.kill()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for worker in list(self._workers):
            with contextlib.suppress(ProcessLookupError):
                await worker.process.wait()

    def _keep(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_worker(self) -> None:
        """Keep one worker slot filled: spawn, boot, watch; respawn after it exits."""
        failures = 0
        while not self._closing:
            try:
                process = await asyncio.create_subprocess_exec(
                    *(self._python, "-m", "proxy.server.rendering.worker", str(self._vocab_dir)),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
            except OSError as exc:
                self._log("render worker cannot start", error=str(exc))
                failures += 1
                await asyncio.sleep(min(MAX_BACKOFF, 0.5 * 2**failures))
                continue
            worker = _Worker(process)
            self._workers.add(worker)
            booted = False
            try:
                async with asyncio.timeout(BOOT_TIMEOUT):
                    kind, _ = await worker.call(self._options.encode())
                booted = kind == wire.READY
            except (TimeoutError, asyncio.IncompleteReadError, OSError):
                pass
            if booted:
                failures = 0
                worker.booted = True
                self._log("render worker ready", pid=process.pid)
                self._idle.put_nowait(worker)
            else:
                worker.kill()
            code = await process.wait()
            self._workers.discard(worker)
            if self._closing:
                return
            self._log("render worker exited", pid=process.pid, exit_code=code, ready=booted)
            if not booted:  # a worker that cannot start (no vocab?) must not spin the CPU
                failures += 1
                await asyncio.sleep(min(MAX_BACKOFF, 0.5 * 2**failures))

    # -- rendering ----------------------------------------------------------------------------

    async def prepare(self, body: dict[str, Any]) -> PreparedRequest:
        """Validate and render `body` inline when cheap, else in a worker (module doc)."""
        try:
            payload = orjson.dumps(body)
        except orjson.JSONEncodeError:
            # Not plain JSON, or nested past orjson's 254 levels: `check_json` refuses it (400,
            # MAX_DEPTH 100) in one walk of the body, before anything is rendered.
            payload = b""
        if not payload or is_cheap(payload):
            del payload  # orjson's output reserves 4 KB at the least: not kept while it waits
            return await self._render_inline(body)
        if not self._started or self._closing:
            raise RuntimeError("the render pool is not running (start it in the lifespan)")
        self._spawn()
        if self._options.traces is not None:  # the worker's span joins the request's trace
            payload = wire.traced_payload(payload)
        worker = await self._acquire()
        # The exchange with the worker runs in its own task: a caller that is cancelled (its
        # client left) must not leave a reply in the pipe for the next request to read.
        task = asyncio.ensure_future(self._exchange(worker, payload))
        task.add_done_callback(_retrieve)
        kind, reply = await asyncio.shield(task)
        if kind == wire.PREPARED:
            self._on_render("worker", "ok")
            return wire.decode_prepared(reply)
        if kind in (wire.CLIENT_ERROR, wire.PANICKED):
            self._on_render("worker", "client_error")
            raise wire.decode_error(reply)
        self._on_render("worker", "failed")
        detail = bytes(reply).decode("utf-8", "replace")
        self._log("render failed", error=detail, pid=worker.process.pid)
        raise ProxyError("internal error while rendering the request", code="render_failed")

    async def _render_inline(self, body: dict[str, Any]) -> PreparedRequest:
        try:
            prepared = await self._inline.prepare(body)
        except ClientError:
            self._on_render("inline", "client_error")
            raise
        self._on_render("inline", "ok")
        return prepared

    async def _acquire(self) -> _Worker:
        if self._waiting >= self._queue_limit:
            self._on_render("worker", "queue_full")
            raise _busy(f"{self._waiting} requests are already waiting for a render worker")
        self._waiting += 1
        try:
            async with asyncio.timeout(self._timeout):
                while True:
                    worker = await self._idle.get()
                    if worker.alive:
                        return worker
        except TimeoutError:
            self._on_render("worker", "queue_full")
            reason = f"no render worker was free within render_timeout ({self._timeout:g} s)"
            raise _busy(reason) from None
        finally:
            self._waiting -= 1

    async def _exchange(self, worker: _Worker, payload: bytes) -> tuple[bytes, memoryview]:
        """One request on `worker`; the worker goes back to the idle queue, or is killed (its
        slot's task then starts a new one)."""
        try:
            async with asyncio.timeout(self._timeout):
                reply = await worker.call(payload)
        except TimeoutError:
            worker.kill()
            self._on_render("worker", "timeout")
            self._log("render timeout", pid=worker.process.pid, body_bytes=len(payload))
            raise ClientError(
                f"rendering this request took longer than render_timeout ({self._timeout:g} s); "
                "openai-harmony's cost grows with the square of the longest run of text "
                "without whitespace, and with the number of input items",
                param="input",
                code="render_timeout",
            ) from None
        except (asyncio.IncompleteReadError, OSError):
            worker.kill()
            code = await worker.process.wait()
            self._on_render("worker", "worker_died")
            raise ClientError(
                f"the render worker died while rendering this request (exit code {code}): "
                "the request is too costly to render",
                param="input",
                code="render_failed",
            ) from None
        except BaseException:
            worker.kill()  # cancelled mid-exchange (shutdown): its reply would be out of step
            raise
        if reply[0] == wire.PANICKED:
            worker.kill()  # it exits by itself; never hand it another request
        else:
            self._idle.put_nowait(worker)
        return reply


def _busy(reason: str) -> ClientError:
    return ClientError(
        f"the proxy's render workers are busy ({reason}); retry shortly",
        status=429,
        code="render_queue_full",
    )


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shielded exchange's outcome as seen when its caller has gone."""
    if not task.cancelled():
        task.exception()


def default_renderer(
    settings: Settings,
    encoding: HarmonyEncoding,
    prefixes: PrefixCache,
    options: RenderOptions,
    metrics: Metrics,
    log: Callable[..., None],
) -> Renderer:
    """The default renderer: `render_workers` processes, loading the vocab this process loaded."""
    per_tick = settings.inline_renders_per_tick
    pacer = Pacer(per_tick) if per_tick else None
    if settings.render_workers == 0:
        return InlineRenderer(encoding, prefixes, options, pacer)
    return RenderPool(
        encoding,
        vocab.loaded_dir(os.environ),
        workers=settings.render_workers,
        timeout=settings.render_timeout,
        queue=settings.render_queue,
        prefixes=prefixes,
        options=options,
        log=log,
        on_render=lambda path, outcome: metrics.renders.labels(path, outcome).inc(),
        pacer=pacer,
    )
