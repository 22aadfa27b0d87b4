"""A serving process spaces the garbage collector's full passes (server/processes/collector.py)."""

from __future__ import annotations

import asyncio
import gc
import logging

from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.server.processes import collector, runner
from proxy.server.processes.runner import DrainingServer
from tests.live import free_port


def test_space_full_passes_keeps_the_young_thresholds() -> None:
    before = gc.get_threshold()
    try:
        collector.space_full_passes(250)
        assert gc.get_threshold() == (before[0], before[1], 250)
    finally:
        gc.set_threshold(*before)


def test_a_serving_process_applies_its_setting(encoding: HarmonyEncoding) -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    settings = Settings(
        upstream_url="http://127.0.0.1:9",
        host="127.0.0.1",
        port=free_port(),
        store_url="off",
        gc_full_pass_every=37,
    )

    def started(server: DrainingServer) -> None:
        seen.append(gc.get_threshold())
        server.should_exit = True

    try:
        asyncio.run(
            runner.serve_proxy(settings, encoding, logging.getLogger("test"), on_started=started)
        )
    finally:
        gc.set_threshold(*before)
    assert seen == [(before[0], before[1], 37)]
    assert Settings().gc_full_pass_every == 100
