"""The garbage collector of a serving process: full passes spaced, no young pass skipped
(server/processes/collector.py)."""

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


class _Tally:
    """What the collector was asked for, and the young generation it is shown."""

    def __init__(self, young: int, middle_count: int = 0) -> None:
        self.young = young
        self.middle_count = middle_count
        self.collected: list[int] = []

    def counts(self) -> tuple[int, int, int]:
        return (0, self.middle_count, 0)

    def collect(self, generation: int) -> int:
        self.collected.append(generation)
        self.young = 0
        return 0


def _run_ticks(passes: collector.YoungPasses, seconds: float) -> None:
    async def main() -> None:
        passes.start()
        await asyncio.sleep(seconds)
        passes.stop()

    asyncio.run(main())


def _passes(tally: _Tally, busy: bool) -> collector.YoungPasses:
    return collector.YoungPasses(
        lambda: busy,
        period=0.005,
        idle_period=0.005,
        young=lambda: tally.young,
        passes=lambda: 0,  # CPython runs no young pass of its own
        counts=tally.counts,
        collect=tally.collect,
    )


def test_a_young_generation_past_twice_the_threshold_gets_its_pass() -> None:
    tally = _Tally(young=2 * gc.get_threshold()[0] + 1)
    passes = _passes(tally, busy=True)
    _run_ticks(passes, 0.05)
    assert tally.collected == [0]
    assert passes.forced == 1


def test_the_middle_generation_comes_along_when_its_rule_is_due() -> None:
    tally = _Tally(young=10 * gc.get_threshold()[0], middle_count=gc.get_threshold()[1] + 1)
    _run_ticks(_passes(tally, busy=True), 0.05)
    assert tally.collected == [1]


def test_nothing_runs_while_the_young_generation_is_in_bounds_or_nothing_is_in_flight() -> None:
    small = _Tally(young=2 * gc.get_threshold()[0])
    _run_ticks(_passes(small, busy=True), 0.05)
    idle = _Tally(young=100 * gc.get_threshold()[0])
    _run_ticks(_passes(idle, busy=False), 0.05)
    assert small.collected == idle.collected == []


def test_old_objects_freed_hide_new_ones_from_cpythons_count_and_the_tick_finds_them() -> None:
    """The blind spot itself, on the real collector: old containers freed as fast as new ones
    are made keep the count at zero while the young generation grows."""
    old = [[] for _ in range(20_000)]
    gc.collect()  # `old` is in the oldest generation now
    threshold = gc.get_threshold()[0]
    passes_before = gc.get_stats()[0]["collections"]
    new = []
    for _ in range(10 * threshold):
        old.pop()  # freed: the young count goes down...
        new.append([])  # ...as much as this makes it go up
    assert gc.get_stats()[0]["collections"] == passes_before  # CPython ran no young pass
    assert len(gc.get_objects(0)) > 2 * threshold
    passes = collector.YoungPasses(lambda: True, period=0.005, idle_period=0.005)
    _run_ticks(passes, 0.05)
    assert passes.forced >= 1
    assert len(gc.get_objects(0)) <= 2 * threshold


def test_a_young_pass_of_cpythons_own_since_the_last_look_is_enough() -> None:
    tally = _Tally(young=10 * gc.get_threshold()[0])
    ran = iter(range(1, 1000))  # a young pass of its own between every two looks
    passes = collector.YoungPasses(
        lambda: True,
        period=0.005,
        idle_period=0.005,
        young=lambda: tally.young,
        passes=lambda: next(ran),
        collect=tally.collect,
    )
    _run_ticks(passes, 0.05)
    assert tally.collected == []
