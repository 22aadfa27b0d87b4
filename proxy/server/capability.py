"""What upstream can do, kept current: the capability probe's loop (upstream/probe.py), and the
wait of the first requests for its first answer.

The lifespan runs `probe_forever`: a probe at start, then every `PROBE_RETRY` s while upstream
cannot serve us and every `PROBE_PERIOD` s once it can (an upstream restart may swap the server).
Each finding goes to the shared state (read per request by the repaired route), the gauges
`proxy_upstream_capable` and `proxy_upstream_guided_decoding`, and — when it changed — one
`upstream capability` log line. The setting `guided_decoding` (`on` / `off`) states whether
upstream enforces `response_format` instead of probing it (`auto`).

Until the first probe has ended, the state says "not probed yet", which is no statement about
upstream. A request that arrives then (a worker just started, or replaced) waits for that probe,
at most `ServerState.first_probe_wait` s (10), rather than being refused from it
(`first_probe`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence

from openai_harmony import HarmonyEncoding, HarmonyError

from proxy.config.settings import Settings
from proxy.metrics.serving import Metrics
from proxy.server.deps import ServerState
from proxy.upstream.client import Upstream
from proxy.upstream.probe import NOT_PROBED, Capability, Decode

#: Seconds between capability probes while upstream is not (yet) able to serve us.
PROBE_RETRY = 2.0
#: Seconds between probes once it is.
PROBE_PERIOD = 30.0


def decoder(encoding: HarmonyEncoding) -> Decode:
    """Token ids → text (specials as their text), None for ids this vocabulary does not have."""

    def decode(ids: Sequence[int]) -> str | None:
        try:
            return encoding.decode(list(ids))
        except (HarmonyError, TypeError, ValueError, OverflowError):
            return None

    return decode


def with_setting(capability: Capability, setting: str) -> Capability:
    """The probe's finding with `guided_decoding` applied: `on`/`off` state what `auto` probes."""
    if setting == "auto":
        return capability
    guided = setting == "on"
    said = "enforced" if guided else "not enforced"
    stated = f"response_format {said} (guided_decoding = {setting})"
    detail = capability.detail.replace(NOT_PROBED, stated)
    return dataclasses.replace(
        capability,
        guided=guided,
        detail=detail,
        guided_detail=stated,
        takes_response_format=guided,
    )


async def probe_forever(
    upstream: Upstream,
    settings: Settings,
    state: ServerState,
    metrics: Metrics,
    logger: logging.Logger,
    decode: Decode,
) -> None:
    """Probe upstream for as long as the app runs (module doc)."""
    last = None
    probe_guided = settings.guided_decoding == "auto"
    while True:
        capability = await upstream.probe(decode=decode if probe_guided else None)
        capability = with_setting(capability, settings.guided_decoding)
        state.capability = capability
        state.probed.set()
        metrics.upstream_capable.set(1 if capability.token_ids else 0)
        metrics.upstream_guided.set(1 if capability.guided else 0)
        # /readyz refines this on every probe of the kubelet; without one it stays current.
        metrics.ready.set(1 if capability.token_ids and not state.draining else 0)
        if capability != last:
            level = logging.INFO if capability.token_ids else logging.WARNING
            logger.log(
                level,
                "upstream capability",
                extra={
                    "upstream": settings.upstream_url,
                    "capable": capability.token_ids,
                    "logprobs": capability.logprobs,
                    "guided_decoding": capability.guided_decoding,
                    "detail": capability.detail,
                    "model": capability.model,
                },
            )
            last = capability
        await asyncio.sleep(PROBE_PERIOD if capability.token_ids else PROBE_RETRY)


async def first_probe(state: ServerState) -> None:
    """Wait until the first capability probe has ended, at most `state.first_probe_wait` s."""
    if state.probed.is_set():
        return
    try:
        async with asyncio.timeout(state.first_probe_wait):
            await state.probed.wait()
    except TimeoutError:
        return  # served on what is known: "not probed yet", a 503 with Retry-After
