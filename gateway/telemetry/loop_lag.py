"""How long the gateway's event loop keeps a ready task waiting, and how long the garbage collector
stops it, as Prometheus histograms.

Every request a replica serves runs on one event loop: anything that holds the loop (synchronous
work, a long garbage collection, a slow callback) adds its duration to every request in flight.
A sleeper task asks to wake every ``interval_s``; how late it wakes is the loop's lag
(``fairlane_event_loop_lag_seconds``). ``gc.callbacks`` time each collection
(``fairlane_gc_pause_seconds`` by generation), so a lag spike can be told apart from a collection.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from gateway.telemetry.metrics import GC_PAUSE, LOOP_LAG

INTERVAL_S = 0.01


class LoopLagMonitor:
    """Observes the loop's lag every `interval_s` while started, and every GC pause of the process."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._gc_started = 0.0

    def start(self) -> None:
        """Start on the running loop (the app's lifespan); idempotent."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="loop-lag")
            gc.callbacks.append(self._on_gc)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
            gc.callbacks.remove(self._on_gc)

    async def _watch(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            LOOP_LAG.observe(max(time.perf_counter() - asked - self.interval_s, 0.0))

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            GC_PAUSE.labels(str(info.get("generation", ""))).observe(time.perf_counter() - self._gc_started)
            self._gc_started = 0.0
