"""What the gateway's path costs beside its stages' times, measured in process while a benchmark
runs (benchmarks/gateway_path.py): its Redis round trips, its event loop's lag, its GC pauses."""

from __future__ import annotations

import asyncio
import gc
import time


class RoundTrips:
    """Counts the gateway's Redis round trips in this process while entered: each command, and each
    pipeline or script call, is one write of a packed command to a connection (redis-py asyncio's,
    or the lean connection of the quota scripts and the result reader, quotas/resp.py)."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> RoundTrips:
        from redis.asyncio.connection import AbstractConnection

        from quotas.resp import RespConnection

        self._cls, self._send = AbstractConnection, AbstractConnection.send_packed_command
        self._execute = RespConnection.execute
        send, execute, counter = self._send, self._execute, self

        async def counted(conn, *args, **kwargs):
            counter.count += 1
            return await send(conn, *args, **kwargs)

        async def counted_lean(conn, *args):
            counter.count += 1
            return await execute(conn, *args)

        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
        RespConnection.execute = counted_lean  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc) -> None:
        from quotas.resp import RespConnection

        self._cls.send_packed_command = self._send  # type: ignore[method-assign]
        RespConnection.execute = self._execute  # type: ignore[method-assign]


class LoopWatch:
    """The event loop's lag (a 10 ms sleeper, as gateway/telemetry/loop_lag.py) and the garbage
    collector's pauses while entered, in ms."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.gc_pauses: list[float] = []
        self._gc_at = 0.0

    def _on_gc(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._gc_at = time.perf_counter()
        else:
            self.gc_pauses.append(1000 * (time.perf_counter() - self._gc_at))

    async def _watch(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(0.01)
            self.lags.append(max(0.0, 1000 * (time.perf_counter() - asked - 0.01)))

    async def __aenter__(self) -> LoopWatch:
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        gc.callbacks.remove(self._on_gc)

    def summary(self) -> dict:
        lag = sorted(self.lags) or [0.0]
        return {
            "loop_lag_ms": {
                "p50": lag[len(lag) // 2],
                "p99": lag[min(len(lag) - 1, int(0.99 * len(lag)))],
                "max": lag[-1],
            },
            "gc": {"collections": len(self.gc_pauses), "max_pause_ms": max(self.gc_pauses, default=0.0)},
        }
