"""Where the time before `response.created` goes: the proxy with timers, and the phase table.

Run as a script, this is `python -m proxy …` with timers around what a `/v1/responses` request
goes through before its first event, stamped with `time.monotonic()` (one clock for every
process on Linux, so the client's and the simulator's stamps compare) and written as JSON
lines to the file named by `BENCH_PHASES_FILE` when the process exits:

    BENCH_PHASES_FILE=/tmp/p.jsonl .venv/bin/python bench/phases.py serve --upstream …

The timers wrap, without changing them: the app `serve` builds (an ASGI middleware: the
request's arrival, the proxy's `http.response.start` and first body), `Stateful.prepare` (the
stored half: resolving ids, the scope), and the renderer's `prepare` (validation and the
Harmony render). Imported, `phase_rows` turns those stamps, the simulator's (`SendRecorder`:
the upstream request's arrival and the head it sent) and the client's into the table
bench/latency.py prints with `--phases`.
"""

from __future__ import annotations

import atexit
import contextvars
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: (phase, from stamp, to stamp); stamps: the client's `sent` and `created` (the read that held
#: `response.created`), the simulator's `sim_arrival` and `sim_head`, the proxy's own.
PHASES = (
    ("client → proxy app (connect, HTTP parse)", "sent", "app"),
    ("body read, JSON parse, checks", "app", "prepare"),
    ("store: resolve, scope", "prepare", "render"),
    ("render + validate", "render", "rendered"),
    ("after render, before the upstream request", "rendered", "prepared"),
    ("upstream request reaches the simulator", "prepared", "sim_arrival"),
    ("simulator: request → head (as direct)", "sim_arrival", "sim_head"),
    ("upstream head → proxy's head sent", "sim_head", "head"),
    ("proxy's head → response.created sent", "head", "body"),
    ("response.created → client reads it", "body", "created"),
)
#: The direct path's phases, for the same table.
DIRECT_PHASES = (
    ("client → simulator app", "sent", "sim_arrival"),
    ("simulator: request → head", "sim_arrival", "sim_head"),
    ("head → client reads it", "sim_head", "created"),
)

_request: contextvars.ContextVar[str] = contextvars.ContextVar("bench_request", default="")
_stamps: dict[str, dict[str, float]] = {}


def _stamp(name: str) -> None:
    key = _request.get()
    if key:
        _stamps.setdefault(key, {}).setdefault(name, time.monotonic())


def _timed(method: Callable[..., Any], before: str, after: str) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        _stamp(before)
        try:
            return await method(*args, **kwargs)
        finally:
            _stamp(after)

    return wrapper


class _Middleware:
    """The app `serve` built, its `/v1/responses` requests stamped; everything else (its
    `state`, read by the runner) is the app's."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/responses":
            await self.app(scope, receive, send)
            return
        key = dict(scope["headers"]).get(b"x-request-id", b"").decode()
        _request.set(key)
        _stamp("app")

        async def timed_send(message: Any) -> None:
            _stamp("head" if message["type"] == "http.response.start" else "body")
            await send(message)

        await self.app(scope, receive, timed_send)


def _install() -> None:
    from proxy.server.processes import runner
    from proxy.server.rendering import pool, renderer
    from proxy.server.stateful import state

    build = runner.create_app

    def create_app(*args: Any, **kwargs: Any) -> Any:
        return _Middleware(build(*args, **kwargs))

    runner.create_app = create_app  # type: ignore[assignment]
    for kind in (pool.RenderPool, renderer.InlineRenderer):
        kind.prepare = _timed(kind.prepare, "render", "rendered")  # type: ignore[method-assign]
    state.Stateful.prepare = _timed(state.Stateful.prepare, "prepare", "prepared")  # type: ignore[method-assign]
    target = os.environ["BENCH_PHASES_FILE"]

    def dump() -> None:
        with open(target, "w") as out:
            for key, stamps in _stamps.items():
                out.write(json.dumps({"id": key, **stamps}) + "\n")

    atexit.register(dump)


def read_stamps(path: Path) -> dict[str, dict[str, float]]:
    """The proxy's stamps by request id (the file the instrumented proxy wrote at exit)."""
    found = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        found[row.pop("id")] = row
    return found


def phase_rows(
    stamps: list[dict[str, float]], phases: tuple[tuple[str, str, str], ...]
) -> list[list[str]]:
    """Median and p90 ms of each phase over the requests that have both of its stamps."""
    from bench import harness

    rows = []
    for name, start, end in phases:
        spans = [s[end] - s[start] for s in stamps if start in s and end in s]
        rows.append(
            [
                name,
                str(len(spans)),
                f"{harness.median(spans) * 1000:.3f}",
                f"{harness.pct(spans, 0.9) * 1000:.3f}",
            ]
        )
    return rows


if __name__ == "__main__":
    _install()
    from proxy.cli import main

    sys.argv[0] = "proxy"
    sys.exit(main())
