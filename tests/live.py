"""Real servers on loopback for live tests: uvicorn in a background thread, on an ephemeral port.

In-process ASGI transports buffer whole bodies and hide streaming bugs; these are real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from proxy.server import asgi
from proxy.server.processes.runner import loop_factory


def free_port() -> int:
    """A port free at the time of the call, for servers in another process, which must bind it
    themselves (a server in this process binds its socket first: `LiveServer`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LiveServer:
    """`with LiveServer(app) as server:` serves `app` at `server.url` until the block ends."""

    def __init__(self, app: Any, **config: Any) -> None:
        # Bound here and handed to uvicorn: a port picked first and bound later could be taken
        # in between by another test process (the suite runs in parallel) or a client socket.
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            **config,
        )
        self.server = uvicorn.Server(self.config)
        asgi.quiet_aborts()  # as `serve` does (proxy/server/processes/runner.py)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # The loop `python -m proxy serve` runs on (uvloop), so live tests see what users run.
        factory = loop_factory("auto")
        self.loop = factory() if factory is not None else asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve(sockets=[self._socket]))
        finally:
            # As `asyncio.run` ends: tasks the app left running (a library's watcher) are
            # cancelled, not destroyed pending with the loop.
            left = asyncio.all_tasks(self.loop)
            for task in left:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.005)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()

    def call(self, coro: Any, timeout: float = 10) -> Any:
        """Run a coroutine on the server's loop (to touch its state safely)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextlib.contextmanager
def serving(app: Any, **config: Any) -> Iterator[LiveServer]:
    with LiveServer(app, **config) as server:
        yield server


def wait_for(predicate: Any, timeout: float = 5.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
