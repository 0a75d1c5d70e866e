"""The quota configuration in Redis: limits written here are read by every admission.

Limits live in one hash per tenant (and per API key). ``admit.lua`` reads them on each
admission, so a ``put`` is in force on every gateway replica at once: there is no cache to
expire. The database (tenancy) stays the source of truth; ``put`` copies a row into Redis.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from . import codec
from .decision import Usage
from .keys import KeySpace
from .limits import BudgetUse, QuotaLimits, budget_periods
from .scripts import Scripts


class QuotaStore:
    """Reads and writes limits, and reads usage, of tenants and their API keys."""

    def __init__(self, redis: Redis, *, keys: KeySpace | None = None, scripts: Scripts | None = None) -> None:
        self.redis = redis
        self.keys = keys or KeySpace()
        self.scripts = scripts or Scripts.register(redis)

    async def put(self, tenant: str, limits: QuotaLimits, key: str | None = None) -> None:
        """Store the limits of a tenant (or of one of its API keys), replacing any before.

        ``QuotaLimits()`` (all None) stores "configured, unlimited". Counters are kept: a
        lowered limit applies to what was already used.
        """
        name = self.keys.limits(tenant, key)
        async with self.redis.pipeline(transaction=True) as pipe:  # MULTI: never half-written
            pipe.delete(name)
            fields: dict[Any, Any] = codec.encode_limits(limits)
            pipe.hset(name, mapping=fields)
            await pipe.execute()

    async def get(self, tenant: str, key: str | None = None) -> QuotaLimits | None:
        """The stored limits, or None when nothing is stored for this scope."""
        return codec.decode_limits(await self.redis.hgetall(self.keys.limits(tenant, key)))

    async def delete(self, tenant: str, key: str | None = None) -> None:
        """Forget a scope's limits (its counters expire by themselves)."""
        await self.redis.delete(self.keys.limits(tenant, key))

    async def usage(self, tenant: str, key: str | None = None, *, now: float | None = None) -> Usage:
        """Current rate state, in-flight leases and budget use of a tenant (or key).

        ``now`` (Unix seconds) is for tests only; otherwise Redis's clock is used.
        """
        limits = await self.get(tenant, key)
        keys = self.keys.usage_keys(tenant, key)
        reply = await self.scripts.usage(keys=keys, args=[codec.now_arg(now)])
        return codec.decode_usage(reply, tenant, key, limits)

    async def seed_budgets(
        self, tenant: str, key: str | None, use: BudgetUse, *, now: float | None = None
    ) -> tuple[bool, bool]:
        """Write a scope's budget use as the database counted it (``use``) where Redis holds none
        for the current day and month (a restarted or flushed Redis, before the scope's limits are
        stored again). A period Redis already counts keeps Redis's count. Returns whether the day
        and the month were written. ``now`` (Unix seconds) is for tests only."""
        day, month = budget_periods(use.at)
        reply = await self.scripts.seed(
            keys=[self.keys.state(tenant, key)],
            args=[codec.now_arg(now), day, use.day_tokens, month, use.month_tokens],
        )
        return bool(int(reply[0])), bool(int(reply[1]))

    async def clear(self, tenant: str) -> int:
        """Delete every key of a tenant: limits, counters, leases, reservations (admin reset).

        Returns the number of keys deleted.
        """
        deleted = 0
        async for name in self.redis.scan_iter(match=self.keys.pattern(tenant), count=500):
            deleted += await self.redis.delete(name)
        return deleted
