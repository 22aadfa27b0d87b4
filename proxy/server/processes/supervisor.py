"""The supervisor of `workers` > 1: N proxy processes on one port, one drain, one
`/metrics`, one simulator.

Theory of operation. The supervisor is the process `serve` started; it serves no client itself.

    start    the metrics directory is made empty (multiproc.py, before prometheus_client is
             imported); the port is bound, not listened on, with SO_REUSEPORT (a busy port
             fails here, and port 0 becomes a real one); the built-in simulator starts when no
             upstream is configured (once, here); one reasoning key is made when none is set
             (every worker must open what another sealed); then N workers start
             (`python -m proxy.server.processes.worker`, worker.py), each binding its own
             listener on the port — the kernel spreads connections over them — and saying
             when it accepts.
    a worker dies    its live gauges are dropped (in-flight streams it held are no longer
             counted), what is left of its process group is killed (its render workers),
             `proxy_worker_restarts_total` goes up, an error is logged, and a new worker takes
             its number at once (after a pause that doubles while replacements die within a
             second). Connections waiting in its accept queue are reset by the kernel; the
             other workers' streams never notice.
    a worker cannot start    (exits, or is not accepting within `STARTUP_TIMEOUT`): nothing
             a restart would fix (a bad data_dir, a store that cannot open): the proxy stops,
             exit status 1, as uvicorn's own supervisor does.
    SIGTERM / SIGINT    every worker gets SIGTERM and drains as a single process does
             (runner.py: 503 probes at once, the listener open, streams ended at
             `drain_timeout` with their terminal events, exit within `drain_timeout` + 2 s);
             nothing is restarted any more; the supervisor exits when the last worker has,
             then stops the simulator. A worker still there `KILL_MARGIN` before that limit is
             killed. A second signal is passed on: the workers stop at once.
    supervisor gone    each worker sees EOF on its stdin and drains (worker.py).

Workers run in sessions of their own, so a terminal's Ctrl-C reaches only the supervisor, which
passes it on once (a worker getting it twice would skip its drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.metrics.serving import worker_restarts
from proxy.server.processes import multiproc
from proxy.server.processes.runner import EXIT_MARGIN, serve_metrics, simulated_upstream
from proxy.server.processes.worker import READY, WorkerSpec, bind_socket

#: Seconds a worker may take from its start to accepting connections.
STARTUP_TIMEOUT = 60.0
#: Workers still running this long before `drain_timeout` + `EXIT_MARGIN` are killed.
KILL_MARGIN = 0.3
#: A replacement that dies within this many seconds of accepting counts as a quick death.
QUICK_DEATH = 1.0
MAX_BACKOFF = 10.0


class Supervisor:
    """Runs `workers` worker processes (module doc) until a signal; `run()` returns the exit
    status."""

    def __init__(
        self,
        settings: Settings,
        workers: int,
        encoding: Callable[[], HarmonyEncoding],
        logger: logging.Logger,
        metrics_dir: Path,
        *,
        python: str = sys.executable,
    ) -> None:
        self._settings = settings
        self._workers = workers
        self._encoding = encoding
        self._log = logger
        self._metrics_dir = metrics_dir
        self._python = python
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = False
        self._status = 0
        self._killer: asyncio.Task[None] | None = None
        multiproc.check_active()
        # Counted here, in the supervisor's own metrics file; summed into every scrape.
        self._restarts = worker_restarts(None)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        settings = self._settings
        try:
            reserved = bind_socket(settings.host, settings.port)
        except OSError as exc:
            self._log.error(
                "cannot bind the port",
                extra={"host": settings.host, "port": settings.port, "error": str(exc)},
            )
            return 1
        settings = dataclasses.replace(settings, port=reserved.getsockname()[1])
        settings = self._shared_key(settings)
        registry = multiproc.shared_registry(self._metrics_dir)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            async with (
                simulated_upstream(settings, self._encoding, self._log) as settings,
                serve_metrics(registry, settings.host, settings.metrics_port),
            ):
                self._log.info(
                    "starting workers",
                    extra={
                        "workers": self._workers,
                        "host": settings.host,
                        "port": settings.port,
                        "pid": os.getpid(),
                    },
                )
                await asyncio.gather(
                    *(self._keep(index, settings) for index in range(self._workers))
                )
        finally:
            reserved.close()
            if self._killer is not None:
                self._killer.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        self._log.info("workers stopped", extra={"exit_code": self._status})
        return self._status

    def _shared_key(self, settings: Settings) -> Settings:
        if settings.reasoning_keys:
            return settings
        # One generated key (and its warning) for the whole proxy: a key per worker would make a
        # blob sealed by one worker a 400 on the next request, which another worker may serve.
        self._log.warning(
            "reasoning key generated",
            extra={
                "detail": "no reasoning_keys set: encrypted_content blobs will not open after "
                "a restart or on another replica (set PROXY_REASONING_KEYS); the workers of "
                "this proxy share the key"
            },
        )
        return dataclasses.replace(settings, reasoning_keys=ReasoningKeys.generate().keys)

    # -- one worker slot ----------------------------------------------------------------------

    async def _keep(self, index: int, settings: Settings) -> None:
        """Keep worker `index` running until the proxy stops (module doc)."""
        loop = asyncio.get_running_loop()
        quick_deaths = 0
        while not self._stopping:
            try:
                process = await self._spawn(index, settings)
            except OSError as exc:  # no such interpreter, out of processes or memory
                self._log.error(
                    "worker cannot start: stopping the proxy",
                    extra={"worker": index, "error": str(exc)},
                )
                self._status = 1
                self._stop()
                return
            self._processes[index] = process
            if self._stopping:  # the signal came while it was being started
                process.send_signal(signal.SIGTERM)
            ready = await self._wait_ready(process)
            if not ready:
                # Exited, or still loading after STARTUP_TIMEOUT (or the proxy is stopping).
                code = await self._end(index, process, kill=process.returncode is None)
                if not self._stopping:
                    self._log.error(
                        "worker failed to start: stopping the proxy",
                        extra={"worker": index, "pid": process.pid, "exit_code": code},
                    )
                    self._status = 1
                    self._stop()
                return
            self._log.info("worker ready", extra={"worker": index, "pid": process.pid})
            accepted = loop.time()
            code = await self._end(index, process)
            if self._stopping:
                return
            self._restarts.inc()
            self._log.error(
                "worker died: replacing it",
                extra={"worker": index, "pid": process.pid, "exit_code": code},
            )
            quick_deaths = quick_deaths + 1 if loop.time() - accepted < QUICK_DEATH else 0
            if quick_deaths:
                await asyncio.sleep(min(MAX_BACKOFF, 0.25 * 2**quick_deaths))

    async def _spawn(self, index: int, settings: Settings) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            *(self._python, "-m", "proxy.server.processes.worker"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,  # module doc: Ctrl-C reaches the supervisor only
        )
        assert process.stdin is not None
        process.stdin.write(WorkerSpec(settings, index, self._metrics_dir).encode())
        # The pipe stays open: its EOF tells the worker the supervisor is gone.
        with contextlib.suppress(ConnectionError):
            await process.stdin.drain()
        return process

    async def _wait_ready(self, process: asyncio.subprocess.Process) -> bool:
        assert process.stdout is not None
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT):
                return await process.stdout.readexactly(len(READY)) == READY
        except (TimeoutError, asyncio.IncompleteReadError):
            return False

    async def _end(
        self, index: int, process: asyncio.subprocess.Process, *, kill: bool = False
    ) -> int:
        """Wait for the worker to exit (`kill`: make it), then clear what it leaves behind."""
        if kill:
            _kill_group(process.pid)
        code = await process.wait()
        self._processes.pop(index, None)
        multiproc.mark_dead(process.pid, self._metrics_dir)
        _kill_group(process.pid)  # its render workers, when it could not end them itself
        return code

    # -- stopping -----------------------------------------------------------------------------

    def _on_signal(self, sig: int) -> None:
        if self._stopping:
            self._log.info("second signal: workers stop now", extra={"signal": sig})
            self._signal_all(signal.SIGTERM)
            return
        self._log.info("draining workers", extra={"signal": sig, "workers": len(self._processes)})
        self._stop()

    def _stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._signal_all(signal.SIGTERM)
        self._killer = asyncio.ensure_future(self._kill_stragglers())

    def _signal_all(self, sig: int) -> None:
        for process in list(self._processes.values()):
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)

    async def _kill_stragglers(self) -> None:
        await asyncio.sleep(self._settings.drain_timeout + EXIT_MARGIN - KILL_MARGIN)
        for index, process in list(self._processes.items()):
            self._log.warning("worker still running: killed", extra={"worker": index})
            _kill_group(process.pid)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
