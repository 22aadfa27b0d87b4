"""The app's lifespan: what it starts before the first request and ends after the last.

    start   the renderer (render worker processes), the response store (the one given, else
            the one `store_url` names; it cannot open: the app does not start), the
            capability probe's loop (capability.py)
    end     the probe; background runs (the drain's time, then ended as failed); the store's
            writer and chores, then the store; the render workers; the upstream client; the
            spans still queued for export, flushed (tracing on)

Requests never outlive it: the runner's drain (processes/runner.py) ends them first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette

from proxy.server.capability import decoder, probe_forever
from proxy.server.services import Services
from proxy.store import StoreError, open_store


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """Starlette's lifespan of an app made by `create_app` (module doc)."""
    services: Services = app.state.services
    settings, deps = services.settings, services.deps
    await services.renderer.start()
    await _open_store(services)
    probe = asyncio.create_task(
        probe_forever(
            services.upstream,
            settings,
            services.state,
            services.metrics,
            services.logger,
            decoder(deps.encoding),
        )
    )
    try:
        yield
    finally:
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe
        if services.background is not None:
            await services.background.aclose(settings.drain_timeout)
        if services.stateful is not None:
            await services.stateful.aclose()
        await services.renderer.aclose()
        await services.upstream.aclose()
        if deps.tracing is not None:  # the spans queued so far, exported (bounded: 2 s)
            await asyncio.to_thread(deps.tracing.shutdown)


async def _open_store(services: Services) -> None:
    """Give the stateful half its store: the one given, else the one `store_url` names."""
    stateful = services.stateful
    if stateful is None:
        return
    store = services.store
    if store is None:
        settings = services.settings
        try:
            store = await open_store(
                settings.store_url,
                data_dir=Path(settings.data_dir),
                max_bytes=settings.store_max_bytes,
                clock=stateful.clock,
            )
        except StoreError as exc:
            raise RuntimeError(f"cannot open the response store: {exc}") from exc
    assert store is not None  # `off` made no Stateful
    stateful.start(store)
    services.logger.info("response store", extra={"backend": store.kind})
