"""How long the gateway's event loop keeps a ready task waiting, and how long the garbage collector
stops it, as Prometheus histograms.

Every request a replica serves runs on one event loop: anything that holds the loop (synchronous
work, a long garbage collection, a slow callback) adds its duration to every request in flight.
A sleeper task asks to wake every ``interval_s``; how late it wakes is the loop's lag
(``fairlane_event_loop_lag_seconds``). ``gc.callbacks`` time each collection
(``fairlane_gc_pause_seconds`` by generation), so a lag spike can be told apart from a collection.

A collection can start inside any allocation, prometheus_client's own included, while it holds
the (non-reentrant) lock of a metric value or, in multiprocess mode, of every value: a GC callback
that observed a histogram there would wait for that lock for ever, and the loop with it. The
callback only appends the pause to a deque; the sleeper task observes the pauses on its next tick
(and ``stop`` what is left).
"""

from __future__ import annotations

import asyncio
import collections
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
        self._pauses: collections.deque[tuple[str, float]] = collections.deque(maxlen=10_000)

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
            self._observe_pauses()

    async def _watch(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            LOOP_LAG.observe(max(time.perf_counter() - asked - self.interval_s, 0.0))
            self._observe_pauses()

    def _observe_pauses(self) -> None:
        while self._pauses:
            generation, seconds = self._pauses.popleft()
            GC_PAUSE.labels(generation).observe(seconds)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """Runs inside the collection, wherever it started: no lock, no allocation beyond the tuple."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self._pauses.append((str(info.get("generation", "")), time.perf_counter() - self._gc_started))
            self._gc_started = 0.0
