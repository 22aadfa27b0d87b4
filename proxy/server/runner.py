"""Running the proxy: uvicorn with draining on SIGTERM, the optional metrics port, and the
built-in simulator as upstream when none is configured.

Draining (issue 5): the first SIGTERM/SIGINT marks the proxy as draining (`/healthz` and
`/readyz` answer 503, `proxy_draining` 1) and lets uvicorn stop accepting connections while
in-flight requests go on. After `drain_timeout` seconds, streams still open are ended by the
core with `error` + `response.failed` (never cut without a terminal event). A second signal
exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Generator
from types import FrameType

import uvicorn
from openai_harmony import HarmonyEncoding
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.config import Settings
from proxy.server.app import create_app
from proxy.server.guard import http_guard
from proxy.server.repair import ServerState

#: Extra seconds uvicorn waits after the drain period for streams to write their last events.
_DRAIN_GRACE = 5.0


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone: a second server in the same process (the
    metrics port, the demo's proxy) must not take SIGTERM from the main one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal starts a drain instead of a hard stop."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float) -> None:
        super().__init__(config)
        self._state = state
        self._drain_timeout = drain_timeout
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)  # type: ignore[arg-type]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self._state.draining and self._loop is not None:
            self._state.draining = True
            loop = self._loop
            loop.call_soon_threadsafe(loop.call_later, self._drain_timeout, self._state.end_all)
        super().handle_exit(sig, frame)


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop `serve` runs on (`event_loop` setting); None: asyncio's default.

    uvloop does the proxy's socket I/O in C (libuv): on the latency benchmark it took ~0.12 ms
    off each frame and ~0.5 ms off the time to `response.created` (BENCHMARKS.md, section 5).
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
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])


async def serve(settings: Settings, encoding: HarmonyEncoding, logger: logging.Logger) -> None:
    """Serve until a signal; start the simulator first when no upstream is configured."""
    simulator = None
    if settings.upstream_url is None:
        from proxy.simulator.config import SimulatorConfig
        from proxy.simulator.server import start_simulator

        simulator = await start_simulator(
            SimulatorConfig(
                stream_interval=settings.simulator_stream_interval,
                token_seconds=settings.simulator_token_seconds,
            ),
            encoding,
        )
        settings = dataclasses.replace(settings, upstream_url=simulator.url)
        logger.warning(
            "no upstream configured (PROXY_UPSTREAM_URL / --upstream): serving the BUILT-IN "
            "trtllm-serve SIMULATOR as upstream, not a model",
            extra={"simulator": simulator.url},
        )
    state = ServerState()
    registry = CollectorRegistry()
    app = create_app(settings, encoding, state=state, registry=registry, logger=logger)
    # Client-side HTTP limits and forwarding (issue 12): guard.py, forwarding.py.
    guard = http_guard(settings, app.state.metrics, logger)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(settings.drain_timeout + _DRAIN_GRACE),
        server_header=False,
        **guard.uvicorn_options(),
    )
    server = DrainingServer(config, state, settings.drain_timeout)
    side = None
    if settings.metrics_port is not None:
        side = QuietServer(
            uvicorn.Config(
                metrics_app(registry),
                host=settings.host,
                port=settings.metrics_port,
                log_config=None,
                access_log=False,
                lifespan="off",
            )
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
    try:
        if side is not None:
            side_task = asyncio.create_task(side.serve())
        await server.serve()
    finally:
        if side is not None:
            side.should_exit = True
            await side_task
        if simulator is not None:
            await simulator.stop()
