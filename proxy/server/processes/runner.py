"""Running the proxy: uvicorn with draining on SIGTERM, the optional metrics port, and the
built-in simulator as upstream when none is configured. With `workers` above 1 the supervisor
(supervisor.py) runs the simulator and the metrics port, and each worker process (worker.py)
runs `serve_proxy` on its own listening socket, with the drain below.

Draining, what Kubernetes can rely on. At the first SIGTERM/SIGINT:

1. at once: `/healthz` and `/readyz` answer 503, `proxy_draining` is 1, and every new
   `POST /v1/responses` gets a JSON 503 `server_shutting_down` with `Retry-After` and
   `Connection: close`. The listener stays open, so probes and late clients get an answer,
   not a refused connection;
2. requests in flight go on, until none is left (and `drain_linger` seconds have passed since
   the signal) or until `drain_timeout`, whichever comes first;
3. at `drain_timeout`, open streams end with `error` + `response.failed` (`server_shutting_down`)
   and requests still rendering or waiting for upstream's head get a JSON 503 (`until_drained` in
   deps.py); up to `_END_GRACE` seconds are given for those last bytes;
4. then uvicorn closes the listener and the idle connections, waits at most
   `_UVICORN_GRACE` for anything left (only a client that stopped reading could be: a
   pass-through ends at the drain timeout too, `relay.forward`), and the lifespan ends the
   render workers, the store and the upstream client (lifespan.py).

So the process exits at most `drain_timeout` + `EXIT_MARGIN` (2 s) after the signal, with nothing
cancelled by uvicorn in the normal case (it used to log "Cancel N running task(s)" and answer
waiters 500).
A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Generator
from types import FrameType

import uvicorn
from openai_harmony import HarmonyEncoding
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.config.settings import Settings
from proxy.metrics.exposition import exposition
from proxy.server import asgi
from proxy.server.app import create_app
from proxy.server.deps import ServerState
from proxy.server.http.guard import http_guard
from proxy.server.processes import collector

#: Seconds given to streams ended at the drain timeout to write their terminal events.
_END_GRACE = 0.5
#: Seconds uvicorn then waits for what is left before cancelling it (timeout_graceful_shutdown).
_UVICORN_GRACE = 1
#: The process exits at most this many seconds after `drain_timeout` (the deploy
#: files' preStop, probes and terminationGracePeriodSeconds are checked against it):
#: `_END_GRACE` + `_UVICORN_GRACE` + two of uvicorn's 0.1 s ticks + the lifespan's end.
EXIT_MARGIN = 2.0


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone: a second server in the same process (the
    metrics port, the demo's proxy) must not take SIGTERM from the main one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal starts a drain (module doc) instead of a stop."""

    def __init__(
        self,
        config: uvicorn.Config,
        state: ServerState,
        drain_timeout: float,
        drain_linger: float = 0.0,
        *,
        on_drain: Callable[[], None] = lambda: None,
        on_started: Callable[[DrainingServer], None] = lambda server: None,
    ) -> None:
        super().__init__(config)
        self._state = state
        self._drain_timeout = drain_timeout
        self._drain_linger = min(drain_linger, drain_timeout)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        self._on_drain = on_drain
        self._on_started = on_started

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:  # the lifespan is up and the listener accepts
            # No gc.freeze() here: collector.py.
            self._on_started(self)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._state.draining or self._loop is None:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        self._state.draining = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        # Here, on the loop, not in the signal handler: with worker processes the metrics
        # are files written under a lock that the interrupted code may hold.
        self._on_drain()
        self._state.drain_started.set()
        assert self._loop is not None
        self._drain = self._loop.create_task(self.drain())

    async def drain(self) -> None:
        """Steps 2-3 of the module doc, then let uvicorn stop (step 4)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._drain_timeout
        await asyncio.sleep(self._drain_linger)
        while self._state.active and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if self._state.active:
            self._state.end_all()
            grace = loop.time() + _END_GRACE
            while self._state.active and loop.time() < grace:
                await asyncio.sleep(0.01)
        self.should_exit = True


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop `serve` runs on (`event_loop` setting); None: asyncio's default.

    uvloop does the proxy's socket I/O in C (libuv): on the latency benchmark it took ~0.12 ms
    off each frame and ~0.5 ms off the time to `response.created` (bench/latency.py).
    uvicorn picks it by itself only in `uvicorn.run`, which the drain logic does not use."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    return uvloop.new_event_loop


def metrics_app(registry: CollectorRegistry) -> Starlette:
    """`GET /metrics` alone, for `metrics_port`."""

    async def metrics(request: Request) -> Response:
        text, content_type = exposition(registry, request.headers.get("accept", ""))
        return Response(text, media_type=content_type)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])


async def serve(settings: Settings, encoding: HarmonyEncoding, logger: logging.Logger) -> None:
    """Serve in this process until a signal; start the simulator first when no upstream is
    configured."""
    async with simulated_upstream(settings, encoding, logger) as settings:
        await serve_proxy(settings, encoding, logger, metrics_port=settings.metrics_port)


@contextlib.asynccontextmanager
async def simulated_upstream(
    settings: Settings,
    encoding: HarmonyEncoding | Callable[[], HarmonyEncoding],
    logger: logging.Logger,
) -> AsyncIterator[Settings]:
    """`settings`, or with no upstream configured, the settings pointing at the built-in
    simulator, which runs until the block ends (once per proxy, however many workers).
    `encoding` may be a loader, called only when the simulator runs."""
    if settings.upstream_url is not None:
        yield settings
        return
    from proxy.simulator.config import SimulatorConfig
    from proxy.simulator.server import start_simulator

    simulator = await start_simulator(
        SimulatorConfig(
            stream_interval=settings.simulator_stream_interval,
            token_seconds=settings.simulator_token_seconds,
            guided_decoding=settings.simulator_guided_decoding,
        ),
        encoding() if callable(encoding) else encoding,
    )
    logger.warning(
        "no upstream configured (PROXY_UPSTREAM_URL / --upstream): serving the BUILT-IN "
        "trtllm-serve SIMULATOR as upstream, not a model",
        extra={"simulator": simulator.url},
    )
    try:
        yield dataclasses.replace(settings, upstream_url=simulator.url)
    finally:
        await simulator.stop()


@contextlib.asynccontextmanager
async def serve_metrics(
    registry: CollectorRegistry, host: str, port: int | None
) -> AsyncIterator[None]:
    """`GET /metrics` of `registry` on `port` (None: nothing) while the block runs."""
    if port is None:
        yield
        return
    side = QuietServer(
        uvicorn.Config(
            metrics_app(registry),
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    task = asyncio.create_task(side.serve())
    try:
        yield
    finally:
        side.should_exit = True
        await task


async def serve_proxy(
    settings: Settings,
    encoding: HarmonyEncoding,
    logger: logging.Logger,
    *,
    registry: CollectorRegistry | None = None,
    sockets: list[socket.socket] | None = None,
    metrics_port: int | None = None,
    on_started: Callable[[DrainingServer], None] = lambda server: None,
) -> None:
    """Serve the proxy against `settings.upstream_url` until a signal: on `settings.port`, or
    on `sockets` (a worker's own SO_REUSEPORT listener); metrics on `registry` (a worker's is
    shared, multiproc.py), also on `metrics_port`; `on_started` once it accepts."""
    collector.space_full_passes(settings.gc_full_pass_every)
    state = ServerState()
    registry = registry or CollectorRegistry()
    app = create_app(settings, encoding, state=state, registry=registry, logger=logger)
    # A pass-through answer that upstream breaks after our head is aborted by raising
    # `ResponseAborted` (logged and counted by the app already): not an error for uvicorn.
    asgi.quiet_aborts()
    # Client-side HTTP limits and forwarding: http/guard.py, http/forwarding.py.
    guard = http_guard(settings, app.state.metrics, logger)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # The drain is ours (DrainingServer): uvicorn's own wait only covers what is left.
        timeout_graceful_shutdown=_UVICORN_GRACE,
        server_header=False,
        **guard.uvicorn_options(),
    )
    server = DrainingServer(
        config,
        state,
        settings.drain_timeout,
        settings.drain_linger,
        on_drain=app.state.metrics.start_drain,
        on_started=on_started,
    )
    logger.info(
        "serving",
        extra={
            "host": settings.host,
            "port": settings.port,
            "upstream": settings.upstream_url,
            "repair_models": list(settings.repair_models),
            "pid": os.getpid(),
        },
    )
    young = collector.YoungPasses(lambda: state.active > 0)
    young.start()
    try:
        async with serve_metrics(registry, settings.host, metrics_port):
            await server.serve(sockets)
    finally:
        young.stop()
