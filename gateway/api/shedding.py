"""Overload shedding: a replica refuses a generation request at once (503, an OpenAI error body and
``retry-after``) when it already carries as many admissions as it is set to, or when its Redis
connection pool is nearly spent, instead of queueing it behind them into a timeout.

An admission is in flight from the start of ``admit.start`` until its first results are back (or it
fails): the quota round trip, the enqueue and the wait for the worker's first tokens. A request
shed here was refused before its quota admission: nothing is charged or queued. Each shed counts
in ``fairlane_gateway_shed_total`` by reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis.asyncio as aioredis

from gateway.api.errors import ServiceUnavailable
from gateway.telemetry import metrics

OVERLOADED = "overloaded"  # the error code of a shed request


class Overloaded(ServiceUnavailable):
    """503: the replica is at its bound of admissions in flight (or of Redis connections)."""

    code = OVERLOADED


class AdmissionBound:
    """Counts a replica's admissions in flight and refuses those over the bound (``check``)."""

    def __init__(
        self, redis: aioredis.Redis, *, max_inflight: int, pool_fraction: float, retry_after_s: int
    ) -> None:
        """``max_inflight``: admissions in flight at most; ``pool_fraction``: the share of the Redis
        pool's connections in use above which requests are shed (1: only when it is spent)."""
        self.redis, self.max_inflight, self.retry_after_s = redis, max_inflight, retry_after_s
        pool = redis.connection_pool
        self.pool_limit = max(1, int(pool.max_connections * pool_fraction))
        self.inflight = 0

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Count one admission while the block runs (``check`` inside refuses it when over)."""
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1

    def check(self) -> None:
        """Raise Overloaded when this admission (counted by ``held``) is over a bound."""
        if self.inflight > self.max_inflight:
            self._shed("admissions", f"{self.max_inflight} requests are being admitted")
        if self._connections_in_use() >= self.pool_limit:
            self._shed("redis_pool", "its Redis connections are in use")

    def _connections_in_use(self) -> int:
        in_use = getattr(self.redis.connection_pool, "_in_use_connections", ())  # redis-py's own count
        return len(in_use)

    def _shed(self, reason: str, detail: str) -> None:
        metrics.SHED.labels(reason).inc()
        raise Overloaded(
            f"The server is overloaded ({detail}); retry after {self.retry_after_s} s.",
            headers={"retry-after": str(self.retry_after_s)},
        )
