"""What the routes and the lifespan of one app share: `Services`, built once by `build_services`
from the settings and the seams `create_app` takes (`Seams`), kept on `app.state.services`.

Every seam has a default that serves production, so `create_app(settings, encoding)` is a
whole proxy; tests replace the ones they need (a transport, a registry, counting ids, a clock, a
store, an inline renderer) and never patch a module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypedDict, Unpack

from openai_harmony import HarmonyEncoding
from prometheus_client import CollectorRegistry

from proxy.config.settings import Settings
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.response import IdFactory, random_id
from proxy.harmony.stream.parser import TokenTable
from proxy.logs import get_logger
from proxy.metrics.genai import GenAIMetrics
from proxy.metrics.serving import Metrics
from proxy.metrics.websocket import WebSocketMetrics
from proxy.server.deps import RepairDeps, ServerState
from proxy.server.hosted.tools import Hosted
from proxy.server.http.budget import BodyBudget
from proxy.server.rendering.pool import default_renderer
from proxy.server.rendering.renderer import Renderer
from proxy.server.rendering.worker import RenderOptions
from proxy.server.stateful.background import Background
from proxy.server.stateful.state import Stateful
from proxy.store import OFF, Store
from proxy.tracing import TraceConfig, Tracing, start_tracing
from proxy.upstream.client import Upstream
from proxy.upstream.transport import Transport


class Seams(TypedDict, total=False):
    """The seams of `create_app`, each optional (its default in `build_services`)."""

    #: How the upstream client reaches upstream (default: the network).
    transport: Transport | None
    #: Where the metrics register (default: a new registry).
    registry: CollectorRegistry | None
    #: Response and item ids (default: random).
    ids: IdFactory
    #: Wall clock (`created_at`, store expiry) and monotonic clock (durations, deadlines).
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    #: The state the drain and the probe share with the requests (default: a new one).
    state: ServerState | None
    #: Where log lines go (default: the proxy's logger).
    logger: logging.Logger | None
    #: Validation and rendering (default: `render_workers` processes, or inline when 0).
    renderer: Renderer | None
    #: The keys that seal reasoning (default: `settings.reasoning_keys`, else one random key).
    reasoning_keys: ReasoningKeys | None
    #: The response store (default: the lifespan opens the one `store_url` names).
    store: Store | None
    #: Traces (default: from the otel_* settings and the OTEL_* environment; None: off).
    tracing: Tracing | None


@dataclass(frozen=True)
class Services:
    """The app's shared objects (module doc). `deps` is what every exchange is given; the rest
    is the routes' and the lifespan's."""

    deps: RepairDeps
    registry: CollectorRegistry
    #: The memory of request bodies being read and rendered (http/budget.py).
    budget: BodyBudget
    logger: logging.Logger
    #: The WebSocket sessions' metrics (routes/websocket.py).
    websocket: WebSocketMetrics
    #: The store's side of the shell (None: `store_url = off`) and the background runs.
    stateful: Stateful | None = None
    background: Background | None = None
    #: A store given by the caller; None: the lifespan opens the one `store_url` names.
    store: Store | None = None
    #: Hosted MCP tools: the policy, tool-list cache, limits and metrics (server/hosted/).
    hosted: Hosted | None = None

    @property
    def settings(self) -> Settings:
        return self.deps.settings

    @property
    def metrics(self) -> Metrics:
        return self.deps.metrics

    @property
    def state(self) -> ServerState:
        return self.deps.state

    @property
    def upstream(self) -> Upstream:
        return self.deps.upstream

    @property
    def renderer(self) -> Renderer:
        return self.deps.renderer

    def log(self, message: str, **fields: Any) -> None:
        """One structured log line (never content unless `log_content`)."""
        self.deps.log(message, **fields)

    def monotonic(self) -> float:
        return self.deps.monotonic()


def build_services(
    settings: Settings, encoding: HarmonyEncoding, **seams: Unpack[Seams]
) -> Services:
    """Everything the app shares, from `settings` and the `seams` given (the rest default)."""
    if settings.upstream_url is None:
        raise ValueError("create_app needs settings.upstream_url (serve starts the simulator)")
    unknown = set(seams) - Seams.__optional_keys__
    if unknown:  # what a signature would refuse: a misspelt seam is never silently the default
        raise TypeError(f"create_app got unknown seams: {', '.join(sorted(unknown))}")
    registry = seams.get("registry") or CollectorRegistry()
    metrics = Metrics(registry, models=settings.metrics_models, harmony_version=_harmony_version())
    logger = seams.get("logger") or get_logger()
    clock = seams.get("clock", time.time)
    ids = seams.get("ids", random_id)

    tracing = seams["tracing"] if "tracing" in seams else start_tracing(trace_config(settings))

    def log(message: str, **fields: Any) -> None:
        if tracing is not None:  # a log line leads to its trace
            fields.update(tracing.ids())
        logger.info(message, extra=fields)

    reasoning_keys = seams.get("reasoning_keys") or _reasoning_keys(settings, logger)
    prefixes = PrefixCache(encoding)
    renderer = seams.get("renderer") or default_renderer(
        settings,
        encoding,
        prefixes,
        RenderOptions(
            reasoning_keys,
            settings.max_prompt_tokens,
            # traces from the settings: the render workers export their own spans too
            traces=None if tracing is None or "tracing" in seams else trace_config(settings),
        ),
        metrics,
        log,
    )
    deps = RepairDeps(
        settings=settings,
        encoding=encoding,
        upstream=Upstream(
            settings.upstream_url,
            connect_timeout=settings.connect_timeout,
            transport=seams.get("transport"),
        ),
        metrics=metrics,
        state=seams.get("state") or ServerState(),
        log=log,
        ids=ids,
        prefixes=prefixes,
        reasoning_keys=reasoning_keys,
        tokens=TokenTable(encoding),
        clock=clock,
        monotonic=seams.get("monotonic", time.monotonic),
        renderer=renderer,
        tracing=tracing,
        genai=GenAIMetrics(registry, settings.metrics_models),
    )
    store = seams.get("store")
    stateful = None
    if store is not None or settings.store_url != OFF:
        stateful = Stateful(settings, metrics, ids=ids, clock=clock, logger=logger, tracing=tracing)
    hosted = Hosted.from_settings(settings, registry, ids, deps.monotonic)
    hosted.tracing = tracing
    return Services(
        deps=deps,
        registry=registry,
        budget=BodyBudget(settings.body_budget_bytes, settings.body_budget_wait),
        logger=logger,
        stateful=stateful,
        background=None if stateful is None else Background(deps, stateful),
        store=store,
        websocket=WebSocketMetrics(registry),
        hosted=hosted,
    )


def trace_config(settings: Settings) -> TraceConfig:
    """The otel_* settings; what they leave unset comes from the OTEL_* environment."""
    return TraceConfig(
        endpoint=settings.otel_traces_endpoint,
        protocol=settings.otel_protocol,
        sample_ratio=settings.otel_sample_ratio,
        capture_content=settings.otel_capture_content,
        service_name=settings.otel_service_name,
    )


def _reasoning_keys(settings: Settings, logger: logging.Logger) -> ReasoningKeys:
    """The keys `settings` names, else one random key, with a warning: sealed reasoning must
    work out of the box, but a key made here dies with the process and differs per replica
    (the key itself is never logged)."""
    if settings.reasoning_keys:
        return ReasoningKeys(settings.reasoning_keys)
    logger.warning(
        "reasoning key generated",
        extra={
            "detail": "no reasoning_keys set: encrypted_content blobs will not open after "
            "a restart or on another replica (set PROXY_REASONING_KEYS)"
        },
    )
    return ReasoningKeys.generate()


def _harmony_version() -> str:
    try:
        return metadata.version("openai-harmony")
    except metadata.PackageNotFoundError:  # pragma: no cover - installed with the package
        return "unknown"
