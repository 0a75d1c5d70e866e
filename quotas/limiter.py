"""What the gateway calls: admit a request, then settle or refund its reservation.

Admission is one EVALSHA of ``admit.lua``: every limit of the tenant and of the API key is
checked and charged together, or nothing is charged. Settlement is one EVALSHA of
``settle.lua``, idempotent. When Redis cannot be reached the limiter fails closed
(``QuotaBackendUnavailable``, the gateway answers 503) or, if configured, open (admits
without charging and logs a warning); either way the same client recovers by itself when
Redis is back, scripts included (NOSCRIPT reloads them).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal

from redis.asyncio import Redis
from redis.exceptions import ConnectionError, ReadOnlyError, TimeoutError

from . import codec, settlement
from .decision import Decision, Reservation, SettleOutcome
from .errors import QuotaBackendUnavailable, QuotaNotConfigured
from .keys import KeySpace
from .limits import BudgetUse, Demand, Enqueue, QuotaLimits
from .scripts import Scripts
from .store import QuotaStore

log = logging.getLogger(__name__)

# Redis is unreachable, or is a replica after a failover: the backend is unavailable.
BACKEND_ERRORS = (ConnectionError, TimeoutError, ReadOnlyError, OSError)

# Loads a scope's limits from the database: (tenant, key or None) → limits, or None when the
# scope has no quota row (stored as unlimited). Called only when Redis has none, e.g. after a
# Redis restart.
Loader = Callable[[str, str | None], Awaitable[QuotaLimits | None]]
# Counts a scope's budget use from the database: (tenant, key or None) → the tokens charged in
# the current UTC day and month. Called with the loader, for a scope with a budget: a Redis that
# lost the scope's limits lost its budget counters with them.
BudgetLoader = Callable[[str, str | None], Awaitable[BudgetUse]]


class Limiter:
    """Admission control on Redis for one gateway process (share one per process).

    ``lease_ttl`` (seconds) bounds how long a concurrency slot outlives a gateway that
    crashed before settling; set it above the longest request. A reservation can be settled
    for ``lease_ttl + settle_grace`` seconds, after which it stays charged in full.
    ``unavailable_retry_after`` is the retry-after (seconds) of a fail-closed refusal.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        keys: KeySpace | None = None,
        on_redis_error: Literal["closed", "open"] = "closed",
        lease_ttl: float = 900.0,
        settle_grace: float = 300.0,
        unavailable_retry_after: float = 1.0,
        loader: Loader | None = None,
        budget_loader: BudgetLoader | None = None,
    ) -> None:
        if on_redis_error not in ("closed", "open"):
            raise ValueError(f"on_redis_error must be 'closed' or 'open', not {on_redis_error!r}")
        if lease_ttl <= 0 or settle_grace < 0:
            raise ValueError("lease_ttl must be > 0 and settle_grace >= 0 (seconds)")
        self.redis = redis
        self.keys = keys or KeySpace()
        self.on_redis_error = on_redis_error
        self.lease_ttl = lease_ttl
        self.settle_grace = settle_grace
        self.unavailable_retry_after = unavailable_retry_after
        self.loader, self.budget_loader = loader, budget_loader
        self.scripts = Scripts.register(redis)  # once: EVALSHA from here on
        self.store = QuotaStore(redis, keys=self.keys, scripts=self.scripts)
        self._background: set[asyncio.Task] = set()

    async def admit(
        self, demand: Demand, *, enqueue: Enqueue | None = None, now: float | None = None
    ) -> Decision:
        """Check and charge every limit of ``demand`` in one atomic call.

        Returns an allowed Decision carrying a Reservation (settle or refund it exactly
        once), or a refused one naming the limit. With ``enqueue``, an admission also adds
        that stream entry in the same call (``Decision.entry_id``); a refusal adds nothing.
        Raises ``QuotaBackendUnavailable`` when Redis is unreachable and the limiter fails
        closed, ``QuotaNotConfigured`` when a scope has no limits in Redis and there is no
        loader. ``now`` (Unix seconds) replaces Redis's clock, for tests only.

        A caller cancelled while the call is on its way gets its possible charge refunded
        in the background; an entry it may have queued is the caller's to cancel.
        """
        rid = os.urandom(16).hex()  # the reservation and lease id (uuid4's randomness, cheaper)
        keys, args = self._admission(demand, rid, now, enqueue)
        try:
            for _ in range(3):  # at most: load the tenant's limits, then the key's
                reply = await self.scripts.admit(keys=keys, args=args)
                missing = codec.missing_scope(reply)
                if missing is None:
                    return codec.decode_admit(reply, demand, rid)
                await self._load(demand.tenant, demand.key if missing == "key" else None)
            raise QuotaNotConfigured(demand.tenant, demand.key)
        except BACKEND_ERRORS as exc:
            return self._unavailable(demand, rid, exc)
        except asyncio.CancelledError:
            # The caller went away (client disconnected) while the script may have run: give
            # back whatever it charged, in the background (a no-op if nothing was).
            self._in_background(self.refund(self._reservation(demand, rid)))
            raise

    async def settle(
        self, reservation: Reservation, used_tokens: int, *, now: float | None = None
    ) -> SettleOutcome:
        """Correct a reservation to the tokens really used and release its lease.

        Unused tokens go back to tokens/min and the budgets; tokens above the reservation
        are charged. Idempotent: a second call returns ``"unknown"`` and changes nothing.
        Never raises for Redis errors (returns ``"unavailable"``): the request has already
        been served, and an unsettled reservation only over-charges until its lease expires.
        """
        if used_tokens < 0:
            raise ValueError(f"used_tokens must be >= 0, got {used_tokens}")
        return await self._settle(reservation, used_tokens, now)

    async def refund(self, reservation: Reservation, *, now: float | None = None) -> SettleOutcome:
        """Give back everything a request that failed before running was charged.

        Its tokens, its budget use and its lease, and its request count as well: the failure
        was the service's, not the client's (the client cancelling a running request is
        ``settle`` with the tokens produced). Idempotent like ``settle``.
        """
        return await self._settle(reservation, -1, now)

    async def renew(self, reservation: Reservation, *, now: float | None = None) -> bool:
        """Extend the reservation's concurrency leases by ``lease_ttl`` from now.

        For requests that may outlive ``lease_ttl`` (long streams): call it periodically,
        e.g. every ``lease_ttl / 3``. Returns False when there was nothing to extend (not
        charged, already settled, lease expired, or Redis unavailable, which is logged).
        """
        if not reservation.charged:
            return False
        keys = [self.keys.reservation(reservation.tenant, reservation.id)]
        args: list[Any] = [
            codec.now_arg(now),
            reservation.lease_id,
            self._lease_ttl_us,
            self._record_ttl_ms,
            *self.keys.scopes(reservation.tenant, reservation.key),
            reservation.tier,
        ]
        try:
            return int(await self.scripts.renew(keys=keys, args=args)) > 0
        except BACKEND_ERRORS as exc:
            log.warning("quota lease renewal of %s failed: %s", reservation.id, exc)
            return False

    @property
    def _record_ttl_ms(self) -> int:
        return round((self.lease_ttl + self.settle_grace) * 1000)

    @property
    def _lease_ttl_us(self) -> int:
        return round(self.lease_ttl * codec.US)

    def _admission(
        self, demand: Demand, rid: str, now: float | None, enqueue: Enqueue | None = None
    ) -> tuple[list[str], list]:
        """KEYS and ARGV of admit.lua for ``demand`` under reservation id ``rid``."""
        keys = [self.keys.reservation(demand.tenant, rid)]
        args: list[Any] = [
            codec.now_arg(now),
            demand.tier,
            demand.tokens,
            demand.max_tokens,
            rid,
            self._lease_ttl_us,
            self._record_ttl_ms,
            *self.keys.scopes(demand.tenant, demand.key),
        ]
        if enqueue is not None:
            keys.append(enqueue.stream)
            for field, value in enqueue.fields.items():
                args += (field, value)
            if enqueue.settlement:
                scopes = self.keys.scopes(demand.tenant, demand.key)
                args += (
                    settlement.FIELD,
                    settlement.encode(keys[0], rid, self._record_ttl_ms, scopes, demand.tier),
                )
        return keys, args

    async def aclose(self) -> None:
        """Wait for background refunds (of cancelled admissions) and close the scripts' connection;
        call at shutdown."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.scripts.aclose()

    def _in_background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)  # keep a reference until done
        task.add_done_callback(self._background.discard)

    @staticmethod
    def _reservation(demand: Demand, rid: str, charged: bool = True) -> Reservation:
        return Reservation(
            id=rid,
            tenant=demand.tenant,
            key=demand.key,
            tier=demand.tier,
            reserved_tokens=demand.tokens,
            lease_id=rid,
            charged=charged,
        )

    async def _settle(self, res: Reservation, used: int, now: float | None) -> SettleOutcome:
        if not res.charged:
            return "not_charged"
        keys = [self.keys.reservation(res.tenant, res.id)]
        args: list[Any] = [
            codec.now_arg(now),
            used,
            res.lease_id,
            self._record_ttl_ms,
            *self.keys.scopes(res.tenant, res.key),
            res.tier,
        ]
        try:
            reply = await self.scripts.settle(keys=keys, args=args)
        except BACKEND_ERRORS as exc:
            log.warning("quota settlement of %s for tenant %s failed: %s", res.id, res.tenant, exc)
            return "unavailable"
        return "settled" if int(reply[0]) == 1 else "unknown"

    async def _load(self, tenant: str, key: str | None) -> None:
        if self.loader is None:
            raise QuotaNotConfigured(tenant, key)
        limits = await self.loader(tenant, key)
        await self.store_limits(tenant, limits if limits is not None else QuotaLimits(), key)

    async def store_limits(self, tenant: str, limits: QuotaLimits, key: str | None = None) -> None:
        """Store a scope's limits (``QuotaStore.put``), its budgets' use first where Redis counts
        none for the current day or month (with a ``budget_loader``): a budget counts the UTC day's
        or month's tokens, those charged before Redis lost its counters, or before the budget was
        set, included."""
        if self.budget_loader is not None and limits.has_budget:
            # Before the limits: no admission of a scope Redis knows nothing of runs until they are
            # stored, so none counts from zero (a period Redis already counts keeps Redis's count).
            await self.store.seed_budgets(tenant, key, await self.budget_loader(tenant, key))
        await self.store.put(tenant, limits, key)

    def _unavailable(self, demand: Demand, rid: str, exc: BaseException) -> Decision:
        if self.on_redis_error == "closed":
            raise QuotaBackendUnavailable(self.unavailable_retry_after, exc) from exc
        log.warning(
            "quota backend unavailable, admitting tenant %s unchecked (fail-open): %s", demand.tenant, exc
        )
        return Decision(True, reservation=self._reservation(demand, rid, charged=False), enforced=False)
