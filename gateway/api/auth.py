"""API key → tenant, cached per replica; revocations reach every replica through Redis.

A replica caches each key's AuthContext (or its absence) by the key's hash. Any change that can
revoke access (key revoked, tenant disabled or updated) bumps ``auth:generation`` in Redis; every
replica reads that counter at most every ``refresh_s`` (0.25 s by default) on its request path and
drops its whole cache when it moved, so a revoked key stops working everywhere within 1 s. Quota
changes bump it too: the context carries the key's max_tokens cap. A change made in the database
without the bump (``fairlane admin --database-url`` without ``--redis-url``, or by hand) is seen
when the entry is read again: no entry is used longer than ``max_age_s`` (60 s) after its read.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

import redis.asyncio as aioredis
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from tenancy import authenticate_key, get_quota, hash_key, touch_api_key

GENERATION_KEY = "auth:generation"
TOUCH_EVERY_S = 60.0  # last_used_at is written at most this often per key
MAX_AGE_S = 60.0  # a cached key is read from the database again this long after its last read


@dataclass(frozen=True)
class AuthContext:
    """Who is calling: the key and its tenant, as the request path needs them."""

    key_id: int
    tenant_id: int
    tenant_name: str
    weight: float
    default_tier: str
    allowed_tiers: tuple[str, ...]
    scopes: tuple[str, ...]
    enabled: bool = True
    ttft_target_s: float | None = None  # the tenant's own latency targets (seconds); None: its tier's
    tpot_target_s: float | None = None
    # The stricter max_tokens_per_request of the tenant's and the key's quota (None: no cap): a
    # request without max_tokens gets the server default capped at it. Quota changes invalidate
    # the cache like revocations; quotas enforce the current cap anyway.
    max_tokens_cap: int | None = None
    tenant_active: bool = True  # False: a good key of a disabled tenant (refused, told why)


async def invalidate_auth(redis: aioredis.Redis) -> None:
    """Tell every replica to forget cached keys (call after the DB change is committed)."""
    await redis.incr(GENERATION_KEY)


class KeyCache:
    """Per-replica cache of key lookups, invalidated through Redis (see module docstring)."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        redis: aioredis.Redis,
        *,
        refresh_s: float = 0.25,
        max_entries: int = 10_000,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self.session_factory, self.redis = session_factory, redis
        self.refresh_s, self.max_entries, self.max_age_s = refresh_s, max_entries, max_age_s
        # digest -> (its context, None for no such key; monotonic time it was read)
        self._entries: OrderedDict[str, tuple[AuthContext | None, float]] = OrderedDict()
        self._generation: bytes | None = None
        self._checked_at = float("-inf")
        self._touched: dict[int, float] = {}
        self._loading: dict[str, asyncio.Future[AuthContext | None]] = {}  # digest → its one load

    async def invalidate(self) -> None:
        """After a committed change: forget here at once, and on every other replica within refresh_s."""
        await invalidate_auth(self.redis)
        self._entries.clear()

    async def lookup(self, key: str) -> AuthContext | None:
        """The caller's context, or None for a wrong or revoked key or a disabled tenant's
        (``tenant_disabled`` tells the last apart)."""
        await self._refresh()
        digest = hash_key(key)
        entry = self._entries.get(digest)
        if entry is not None and time.monotonic() - entry[1] < self.max_age_s:
            self._entries.move_to_end(digest)
            context = entry[0]
        else:  # one database read per key however many requests miss it at once (a cold replica)
            if digest not in self._loading:
                self._loading[digest] = asyncio.ensure_future(self._load_into_cache(digest, key))
                self._loading[digest].add_done_callback(lambda _: self._loading.pop(digest, None))
            context = await asyncio.shield(self._loading[digest])
        if context is None or not context.tenant_active:
            return None
        await self._touch(context.key_id)
        return context

    def tenant_disabled(self, key: str) -> bool:
        """Whether ``key``, just refused by ``lookup``, is a good key of a disabled tenant."""
        entry = self._entries.get(hash_key(key))
        return entry is not None and entry[0] is not None and not entry[0].tenant_active

    async def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked_at < self.refresh_s:
            return
        generation = await self.redis.get(GENERATION_KEY)
        self._checked_at = now
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation

    async def _load_into_cache(self, digest: str, key: str) -> AuthContext | None:
        generation, read_at = self._generation, time.monotonic()
        context = await run_in_threadpool(self._load, key)
        if generation == self._generation:  # else an invalidation raced with the load
            self._entries[digest] = (context, read_at)
            self._entries.move_to_end(digest)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return context

    def _load(self, key: str) -> AuthContext | None:
        with self.session_factory() as session:
            found = authenticate_key(session, key=key, active_only=False)
            if found is None:
                return None
            row, tenant = found
            quotas = (
                get_quota(session, tenant_id=tenant.id),
                get_quota(session, tenant_id=tenant.id, key_id=row.id),
            )
            caps = [
                q.max_tokens_per_request
                for q in quotas
                if q is not None and q.max_tokens_per_request is not None
            ]
            return AuthContext(
                key_id=row.id,
                tenant_id=tenant.id,
                tenant_name=tenant.name,
                weight=tenant.weight,
                default_tier=tenant.default_tier,
                allowed_tiers=tuple(tenant.allowed_tiers),
                scopes=tuple(row.scopes or ()),
                ttft_target_s=tenant.ttft_target_s,
                tpot_target_s=tenant.tpot_target_s,
                max_tokens_cap=min(caps) if caps else None,
                tenant_active=tenant.active,
            )

    async def _touch(self, key_id: int) -> None:
        now = time.monotonic()
        if now - self._touched.get(key_id, float("-inf")) < TOUCH_EVERY_S:
            return
        self._touched[key_id] = now

        def touch() -> None:
            with self.session_factory() as session:
                touch_api_key(session, key_id=key_id)

        await run_in_threadpool(touch)
