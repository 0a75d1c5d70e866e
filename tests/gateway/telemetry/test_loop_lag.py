"""The loop-lag histogram moves when the event loop is held, and stays low when it is not."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client.registry import REGISTRY

from gateway.telemetry.loop_lag import LoopLagMonitor


def _count(le: str) -> float:
    value = REGISTRY.get_sample_value("fairlane_event_loop_lag_seconds_bucket", {"le": le})
    return value or 0.0


def _total() -> float:
    return REGISTRY.get_sample_value("fairlane_event_loop_lag_seconds_count") or 0.0


async def _watch(block_s: float) -> None:
    monitor = LoopLagMonitor(interval_s=0.005)
    monitor.start()
    try:
        await asyncio.sleep(0.05)
        if block_s:
            time.sleep(block_s)  # holds the loop: what synchronous work on the loop does
        await asyncio.sleep(0.05)
    finally:
        await monitor.stop()


def test_a_blocked_loop_shows_in_the_histogram():
    slow_before, total_before = _total() - _count("0.1"), _total()
    asyncio.run(_watch(0.3))
    assert _total() > total_before  # the sleeper kept observing
    assert _total() - _count("0.1") >= slow_before + 1  # one lag above 100 ms: the 300 ms hold


def test_a_free_loop_shows_no_long_lag():
    slow_before = _total() - _count("0.25")
    asyncio.run(_watch(0.0))
    assert _total() - _count("0.25") == slow_before


def _gen2() -> float:
    return REGISTRY.get_sample_value("fairlane_gc_pause_seconds_count", {"generation": "2"}) or 0.0


def test_gc_pauses_are_timed_by_generation():
    async def collect() -> None:
        monitor = LoopLagMonitor()
        monitor.start()
        try:
            gc.collect()
        finally:
            await monitor.stop()

    before = _gen2()
    asyncio.run(collect())
    assert _gen2() == before + 1


def test_a_collection_inside_a_metric_s_lock_does_not_deadlock():
    """A collection can start while prometheus_client holds a metric value's lock (a non-reentrant
    Lock: in multiprocess mode one lock for every value). The pause is observed after it, by the
    loop, not from inside the collection, which would wait for that lock for ever."""
    import threading

    from gateway.telemetry.metrics import GC_PAUSE

    held = GC_PAUSE.labels("2")._sum._lock  # the lock the pause's observation takes
    collected = threading.Event()

    def collect_holding_the_lock() -> None:
        with held:
            gc.collect()
        collected.set()

    async def run() -> None:
        monitor = LoopLagMonitor(interval_s=0.005)
        monitor.start()
        try:
            thread = threading.Thread(target=collect_holding_the_lock, daemon=True)
            thread.start()
            await asyncio.to_thread(collected.wait, 10)
            await asyncio.sleep(0.05)  # a few ticks of the monitor: the pause is observed there
        finally:
            await monitor.stop()

    before = _gen2()
    asyncio.run(run())
    assert collected.is_set(), "the collection's callback deadlocked on the metric's lock"
    assert _gen2() == before + 1
